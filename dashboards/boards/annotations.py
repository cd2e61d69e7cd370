"""Annotations shared by the dashboards: the controller's confident diagnoses (docs/design/diagnosis.md)."""

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
