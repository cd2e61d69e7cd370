"""`gpupulse report`: who used the GPUs over a period, and what it cost.

The report reads what the cluster's Prometheus already computes from gpupulse's recording rules
(group `gpupulse.activity-and-cost`: GPU shares per pod, idle GPUs, cost per hour) and the exporter's
energy counters, integrates them over the period, and prints per namespace and per model: GPU-hours
allocated, GPU-hours idle while allocated, energy, cost and, where the engines export token
counters, cost per million generated tokens; then the largest idle allocations.

It imports only the shared kernel (`gpupulse`): it runs beside the cluster, not inside a service.
"""
