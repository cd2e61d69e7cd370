"""Paths and parsed rule files shared by the alert tests."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
ALERTS_DIR = ROOT / "alerts"
TESTS_DIR = Path(__file__).resolve().parent
RUNBOOKS_DIR = ROOT / "docs" / "runbooks"
PROMTOOL = "/usr/bin/promtool"


def rule_paths() -> list[Path]:
    """Committed rule files."""
    return sorted(ALERTS_DIR.glob("*.rules.yaml"))


def unit_test_paths() -> list[Path]:
    """promtool unit-test files."""
    return sorted(TESTS_DIR.glob("*.test.yaml"))


def load_rules() -> list[dict[str, Any]]:
    """Every rule (recording and alerting) of the committed files."""
    rules: list[dict[str, Any]] = []
    for path in rule_paths():
        for group in yaml.safe_load(path.read_text())["groups"]:
            rules.extend(group["rules"])
    return rules


# The TEAM.md metric contract, used only while exporter/catalog.py cannot be imported.
CONTRACT_METRICS = set(
    """
    gpu_info gpu_up gpu_utilization_ratio gpu_memory_utilization_ratio gpu_memory_used_bytes
    gpu_memory_total_bytes gpu_memory_reserved_bytes gpu_memory_free_bytes gpu_temperature_celsius
    gpu_memory_temperature_celsius gpu_slowdown_temperature_celsius gpu_thermal_margin_celsius
    gpu_power_watts gpu_power_limit_watts gpu_energy_joules_total gpu_sm_clock_hertz
    gpu_memory_clock_hertz gpu_clock_event_active gpu_pcie_link_generation
    gpu_pcie_link_generation_max gpu_pcie_link_width gpu_pcie_link_width_max gpu_sm_active_ratio
    gpu_sm_occupancy_ratio gpu_tensor_active_ratio gpu_dram_active_ratio gpu_xid_errors_total
    gpu_ecc_errors_total gpu_remapped_rows_total gpu_remapped_rows_pending gpu_remapped_rows_failed
    gpu_nvlink_up gpu_nvlink_peer_info gpu_process_memory_used_bytes
    gpu_process_sm_utilization_ratio gpu_mig_info gpu_mig_memory_used_bytes
    gpu_mig_memory_total_bytes gpu_mig_sm_active_ratio gpupulse_collector_success
    gpupulse_collector_duration_seconds gpupulse_last_sample_timestamp_seconds gpupulse_gpu_stale
    gpupulse_build_info gpu_allocation_info gpu_process_host_cpu_seconds_total
    gpupulse_series_dropped_total inference_engine_up inference_engine_gpu_info
    inference_kv_cache_hits_total inference_kv_cache_queries_total inference_kv_cache_hit_ratio
    inference_kv_cache_usage_ratio inference_batch_latency_seconds
    inference_batch_latency_source_info inference_requests_running inference_requests_waiting
    inference_time_to_first_token_seconds inference_inter_token_latency_seconds
    inference_request_latency_seconds inference_cold_start_seconds
    model_weights_page_cache_resident_ratio model_weights_resident_bytes model_weights_size_bytes
    """.split()
)


def known_metrics() -> set[str]:
    """Exporter catalog names (or the TEAM.md contract) plus the controller's own metrics."""
    try:
        from exporter.catalog import ALL_METRICS

        names = {spec.name for spec in ALL_METRICS}
    except ImportError:
        names = set(CONTRACT_METRICS)
    from prometheus_client import CollectorRegistry

    from alerts.rules.training import TRAINING_SERIES
    from remediation.metrics import RemediationMetrics

    names |= set(TRAINING_SERIES)  # until the metric catalog declares them (issue 13, exporter side)
    registry = CollectorRegistry()
    RemediationMetrics(registry)
    for family in registry.collect():
        names.add(family.name + "_total" if family.type == "counter" else family.name)
    return names
