"""Typed view of alerts/config.yaml: every selector, threshold and window the rules use."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import yaml

from gpupulse.durations import DurationError, parse_duration

# Beside this module, so an installed package finds it as well as a checkout does (the demo reads it).
DEFAULT_CONFIG_PATH = Path(__file__).resolve().parent / "config.yaml"

_LABEL_NAME = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")


class ConfigError(Exception):
    """alerts/config.yaml is missing a value, names an unknown one, or holds a bad value."""


def duration_seconds(text: str) -> float:
    """Seconds in a Prometheus duration (the grammar of gpupulse.durations), else ConfigError."""
    try:
        return parse_duration(text)
    except DurationError as e:
        raise ConfigError(f"alerts/config.yaml: {e}") from None


@dataclass(frozen=True)
class Windows:
    """Range-vector windows and offsets (Prometheus durations)."""

    rate: str
    event: str
    baseline: str
    baseline_offset: str
    memory_history: str
    memory_history_offset: str
    memory_history_interval: str
    memory_limit_hold: str
    queue_trend: str
    residency_lookback: str
    residency_dip: str
    training_throughput: str
    training_step: str
    training_stalled_rank_evidence: str
    training_stalled_rank: str
    controller_seen: str
    controller_diagnosis: str
    idle_allocated: str
    stale_hold: str


@dataclass(frozen=True)
class Thresholds:
    """Alert thresholds, in the base units their names say."""

    temperature_celsius: float
    idle_sm_activity_ratio: float
    idle_no_kernel_ratio: float
    memory_near_full_ratio: float
    memory_soft_limit_quantile: float
    memory_hard_limit_quantile: float
    memory_limit_gap_ratio: float
    latency_quantile: float
    latency_spike_factor: float
    latency_median_tolerance_factor: float
    latency_min_seconds: float
    kv_cache_drop_fraction: float
    kv_cache_baseline_min_ratio: float
    queue_waiting_requests: float
    starved_sm_activity_ratio: float
    starved_host_cpu_cores: float
    starved_queue_waiting_requests: float
    starved_latency_factor: float
    page_cache_resident_low_ratio: float
    page_cache_resident_high_ratio: float
    exporter_stale_seconds: float
    controller_paused_max_seconds: float
    gang_size_gpus: int
    training_kernel_resident_ratio: float
    training_idle_tensor_active_ratio: float
    training_idle_power_ratio: float
    training_idle_interconnect_bytes_per_second: float
    training_straggler_clock_ratio: float
    training_straggler_tensor_margin_ratio: float
    training_degraded_ratio: float
    training_no_kernel_ratio: float
    training_stalled_io_bytes_per_second: float
    training_wedged_cpu_cores: float
    training_progress_update_intervals: float
    training_progress_floor_seconds: float
    training_progress_moving_seconds: float


@dataclass(frozen=True)
class Cost:
    """Price used by the GPU-hour cost recording rules."""

    price_per_gpu_hour: float
    currency: str


@dataclass(frozen=True)
class RulesConfig:
    """Everything the rule generator reads; no rule hard-codes a number or selector."""

    exporter_selector: str
    windows: Windows
    thresholds: Thresholds
    cost: Cost
    latency_histogram: str
    for_durations: Mapping[str, str]
    runbook_url_base: str
    cluster_label: str

    def for_(self, alertname: str) -> str:
        """The `for:` of one alert; a missing entry is a configuration error."""
        try:
            return self.for_durations[alertname]
        except KeyError:
            raise ConfigError(f"alerts/config.yaml has no `for:` for {alertname}") from None

    def runbook_url(self, alertname: str) -> str:
        """Where the runbook of one alert lives."""
        return f"{self.runbook_url_base}{alertname}.md"


def _section(raw: Mapping[str, Any], key: str) -> Mapping[str, Any]:
    value = raw.get(key)
    if not isinstance(value, Mapping):
        raise ConfigError(f"alerts/config.yaml: `{key}` must be a mapping")
    return value


def _exact(section: Mapping[str, Any], cls: type[Any], name: str) -> dict[str, Any]:
    """The section's values for the dataclass's fields, failing on missing or unknown keys."""
    wanted = {f.name for f in fields(cls)}
    missing = wanted - set(section)
    unknown = set(section) - wanted
    if missing or unknown:
        raise ConfigError(
            f"alerts/config.yaml `{name}`: missing {sorted(missing)}, unknown {sorted(unknown)}"
        )
    return dict(section)


def _merge(base: Mapping[str, Any], override: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in override.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = _merge(out[key], value)
        else:
            out[key] = value
    return out


def _label_name(value: Any, key: str) -> str:
    if not isinstance(value, str) or not _LABEL_NAME.match(value):
        raise ConfigError(f"alerts/config.yaml `{key}` must be a Prometheus label name, got {value!r}")
    return value


def parse_config(raw: Mapping[str, Any]) -> RulesConfig:
    """Validate a parsed config mapping and return the typed config."""
    windows = _exact(_section(raw, "windows"), Windows, "windows")
    for value in windows.values():
        duration_seconds(str(value))
    hold = duration_seconds(str(windows["memory_limit_hold"]))
    interval = duration_seconds(str(windows["memory_history_interval"]))
    if hold < 3 * interval:
        raise ConfigError(
            "alerts/config.yaml windows.memory_limit_hold must be at least three memory_history_interval "
            f"(one late evaluation would drop a held limit): {windows['memory_limit_hold']!r} < "
            f"3 x {windows['memory_history_interval']!r}"
        )
    thresholds = _exact(_section(raw, "thresholds"), Thresholds, "thresholds")
    for key, value in thresholds.items():
        if not isinstance(value, int | float) or isinstance(value, bool):
            raise ConfigError(f"alerts/config.yaml thresholds.{key} must be a number")
    cost = _exact(_section(raw, "cost"), Cost, "cost")
    if "xids" in raw:
        raise ConfigError(
            "alerts/config.yaml: `xids` moved to gpupulse/xid.py (XID_CLASSES), the one home "
            "the rules, the fault signatures and the docs read"
        )
    for_durations = {str(k): str(v) for k, v in _section(raw, "for").items()}
    for value in for_durations.values():
        duration_seconds(value)
    return RulesConfig(
        exporter_selector=str(_section(raw, "selectors")["exporter"]),
        windows=Windows(**{k: str(v) for k, v in windows.items()}),
        thresholds=Thresholds(**thresholds),
        cost=Cost(price_per_gpu_hour=float(cost["price_per_gpu_hour"]), currency=str(cost["currency"])),
        latency_histogram=str(raw["latency_histogram"]),
        for_durations=for_durations,
        runbook_url_base=str(raw["runbook_url_base"]),
        cluster_label=_label_name(raw.get("cluster_label"), "cluster_label"),
    )


def load_config(path: Path = DEFAULT_CONFIG_PATH, overrides: Mapping[str, Any] | None = None) -> RulesConfig:
    """Load alerts/config.yaml, optionally deep-merged with overrides (the fast test profile)."""
    raw = yaml.safe_load(path.read_text())
    if not isinstance(raw, Mapping):
        raise ConfigError(f"{path}: not a mapping")
    return parse_config(_merge(raw, overrides or {}))
