"""Annotations shared by the dashboards: the controller's confident diagnoses (docs/design/diagnosis.md)
and its actions, dry runs included."""

from __future__ import annotations

from dashboards.grafana import Annotation

# the controller counts every diagnosis by the layer and cause it names; a mark where one was made
DIAGNOSES = Annotation(
    "Diagnoses",
    'sum by (layer, cause) (increase(gpupulse_remediation_diagnoses_total{confident="true"}[2m])) > 0',
    title="diagnosis: {{layer}}: {{cause}}",
    text="A confident diagnosis of the remediation controller (evidence: gpupulse-remediation incidents).",
    tags=("layer", "cause"),
)

# every restart or migrate the controller took, tried, was blocked from or would have taken (dry run)
ACTIONS = Annotation(
    "Remediation actions",
    'sum by (rung, outcome) (increase(gpupulse_remediation_actions_total{rung!="page"}[2m])) > 0',
    title="gpupulse {{rung}}: {{outcome}}",
    text="What the remediation controller did (which target: gpupulse-remediation incidents list, or "
    "kubectl get events --field-selector reportingComponent=gpupulse.io/remediation).",
    tags=("rung", "outcome"),
    color="purple",
)
