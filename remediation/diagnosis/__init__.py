"""Diagnose before prescribing: which layer (hardware, host, scheduling, serving) changed when the
symptom began, with the evidence (docs/design/diagnosis.md).

`catalogue` holds the signals as data, `rank` the pure ranking, `prom` the Prometheus range-query
client with deadlines, `diagnose` the step that reads the signals for one incident and ranks them,
`types` the typed result stored with the incident.
"""
