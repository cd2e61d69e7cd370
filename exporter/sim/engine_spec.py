"""The `engines` section of a scenario file: simulated inference engines and their curves.

Schema (docs/design/engines.md): a list of
  {name, kind: vllm|sglang|tgi, model, port (0 = free), gpu (index or list), namespace, pod,
   ready_after_seconds, curves: {request_rate, prompt_tokens, output_tokens, kv_cache_hit_rate,
   kv_cache_usage, running, waiting, ttft_p50, ttft_p99, itl_p50, itl_p99, e2e_p50, e2e_p99,
   batch_latency_p50, batch_latency_p99}}
Each curve is a number or [[t, value], ...] (seconds since scenario start, linear, held at the ends).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from exporter.errors import SimSpecError
from exporter.sim.curve import Curve
from exporter.sim.scenario import load_scenario

SIM_KINDS = ("vllm", "sglang", "tgi")
CURVE_DEFAULTS: Mapping[str, float] = {
    "request_rate": 2.0,  # requests per second
    "prompt_tokens": 1000.0,  # per request
    "output_tokens": 200.0,  # per request
    "kv_cache_hit_rate": 0.6,
    "kv_cache_usage": 0.5,
    "running": 16.0,
    "waiting": 0.0,
    "ttft_p50": 0.08,
    "ttft_p99": 0.5,
    "itl_p50": 0.025,
    "itl_p99": 0.06,
    "e2e_p50": 6.0,
    "e2e_p99": 20.0,
    "batch_latency_p50": 0.025,
    "batch_latency_p99": 0.06,
}


@dataclass(frozen=True)
class SimEngineSpec:
    """One simulated engine."""

    name: str
    kind: str
    model: str
    port: int
    gpus: tuple[int, ...]
    namespace: str
    pod: str
    ready_after_seconds: float
    curves: Mapping[str, Curve]


def _curve(value: Any, where: str) -> Curve:
    if isinstance(value, int | float):
        return Curve.constant(float(value))
    if isinstance(value, list) and value and all(isinstance(p, list) and len(p) == 2 for p in value):
        return Curve([(float(t), float(v)) for t, v in value])
    raise SimSpecError(f"{where}: a curve is a number or a list of [t, value] pairs")


def parse_engines(section: Any) -> list[SimEngineSpec]:
    """Validate the raw `engines` section."""
    if section is None:
        return []
    if not isinstance(section, list):
        raise SimSpecError("engines: expected a list")
    out: list[SimEngineSpec] = []
    for i, e in enumerate(section):
        where = f"engines[{i}]"
        if not isinstance(e, dict) or "name" not in e:
            raise SimSpecError(f"{where}: needs a name")
        kind = str(e.get("kind", "vllm"))
        if kind not in SIM_KINDS:
            raise SimSpecError(f"{where}: kind {kind!r} is not one of {', '.join(SIM_KINDS)}")
        raw_curves = e.get("curves") or {}
        unknown = set(raw_curves) - set(CURVE_DEFAULTS)
        if unknown:
            raise SimSpecError(f"{where}.curves: unknown {', '.join(sorted(unknown))}")
        curves = {k: _curve(raw_curves.get(k, d), f"{where}.curves.{k}") for k, d in CURVE_DEFAULTS.items()}
        gpu = e.get("gpu", [])
        gpus = tuple(gpu) if isinstance(gpu, list) else (gpu,)
        out.append(
            SimEngineSpec(
                name=str(e["name"]),
                kind=kind,
                model=str(e.get("model", e["name"])),
                port=int(e.get("port", 0)),
                gpus=tuple(int(g) for g in gpus),
                namespace=str(e.get("namespace", "")),
                pod=str(e.get("pod", "")),
                ready_after_seconds=float(e.get("ready_after_seconds", 0.0)),
                curves=curves,
            )
        )
    return out


def load_engines(name_or_path: str) -> list[SimEngineSpec]:
    """The engines of a scenario; the NVML sections are validated by the scenario loader when present."""
    return parse_engines(load_scenario(name_or_path).extra.get("engines"))
