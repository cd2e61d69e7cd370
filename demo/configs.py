"""Prometheus and Alertmanager configuration files for the demo stack (all on 127.0.0.1)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

# The exporter jobs must match alerts/config.yaml's exporter selector (job=~"gpupulse.*"); the
# controller's own job must not, or its absence would count as a dead exporter.
EXPORTER_JOB = "gpupulse-exporter"
CONTROLLER_JOB = "remediation"


@dataclass(frozen=True)
class ScrapeTarget:
    """One exporter endpoint and the node it speaks for."""

    address: str  # host:port
    node: str


def prometheus_config(
    exporters: Sequence[ScrapeTarget],
    controller_address: str,
    alertmanager_address: str,
    rule_files: Sequence[Path],
    interval_seconds: float = 1.0,
) -> dict[str, Any]:
    """prometheus.yml: scrape and evaluate every second, alerts to our Alertmanager."""
    every = f"{interval_seconds:g}s"
    return {
        "global": {"scrape_interval": every, "evaluation_interval": every, "scrape_timeout": every},
        "rule_files": [str(p) for p in rule_files],
        "alerting": {"alertmanagers": [{"static_configs": [{"targets": [alertmanager_address]}]}]},
        "scrape_configs": [
            {
                "job_name": EXPORTER_JOB,
                # the node label comes from the scrape config, never from the exporter (TEAM.md)
                "static_configs": [{"targets": [t.address], "labels": {"node": t.node}} for t in exporters],
            },
            {"job_name": CONTROLLER_JOB, "static_configs": [{"targets": [controller_address]}]},
        ],
    }


def alertmanager_config(
    controller_url: str,
    token_file: Path,
    group_wait_seconds: float = 1.0,
    group_interval_seconds: float = 2.0,
) -> dict[str, Any]:
    """alertmanager.yml: alerts with a fault_class (critical or warning) go to the controller.

    `info` alerts help humans and never page (STYLE.md), so they are not sent to the controller;
    everything else without a fault_class goes nowhere (there is no human receiver in the demo).
    """
    return {
        "route": {
            "receiver": "blackhole",
            # one notification group per alert, so each alert reaches the controller on its own
            "group_by": ["..."],
            "group_wait": f"{group_wait_seconds:g}s",
            "group_interval": f"{group_interval_seconds:g}s",
            "repeat_interval": "1h",
            "routes": [
                {
                    "receiver": "gpupulse-remediation",
                    "matchers": ['fault_class=~".+"', 'severity=~"critical|warning"'],
                }
            ],
        },
        "receivers": [
            {"name": "blackhole"},
            {
                "name": "gpupulse-remediation",
                "webhook_configs": [
                    {
                        "url": controller_url,
                        "send_resolved": True,
                        "max_alerts": 0,
                        "http_config": {
                            "authorization": {"type": "Bearer", "credentials_file": str(token_file)}
                        },
                    }
                ],
            },
        ],
    }


def write_yaml(path: Path, doc: dict[str, Any]) -> Path:
    """Write one config file; returns the path."""
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path
