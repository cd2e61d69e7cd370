"""Engine kind from what an exposition contains, and the normalizer for each kind."""

from __future__ import annotations

from collections.abc import Callable

from exporter.engines import dynamo, sglang, tgi, triton, trtllm, vllm
from exporter.engines.reading import ModelReading
from exporter.exposition.parse import Exposition

KINDS = ("vllm", "sglang", "tgi", "triton", "trtllm", "dynamo")
# Families the parser keeps: what the normalizers read, plus the engine's own process start time.
WANTED: frozenset[str] = (
    vllm.FAMILIES
    | sglang.FAMILIES
    | tgi.FAMILIES
    | triton.FAMILIES
    | trtllm.FAMILIES
    | dynamo.FAMILIES
    | {"process_start_time_seconds"}
)
# Prefixes detection looks for, recorded even for families the parser drops.
PREFIXES = (
    "dynamo_frontend_",
    "dynamo_component_",
    "nv_inference_",
    "nv_trt_llm_",
    "vllm:",
    "sglang:",
    "tgi_",
    "trtllm_",
)
NORMALIZERS: dict[str, Callable[[Exposition], list[ModelReading]]] = {
    vllm.KIND: vllm.normalize,
    sglang.KIND: sglang.normalize,
    tgi.KIND: tgi.normalize,
    triton.KIND: triton.normalize,
    trtllm.KIND: trtllm.normalize,
    dynamo.KIND: dynamo.normalize,
}


def _triton_vllm_backend(expo: Exposition) -> bool:
    """vllm: families labelled model/version (not model_name) come from Triton's vLLM backend."""
    for table in (expo.gauges, expo.counters):
        for name, samples in table.items():
            if name.startswith("vllm:") and samples:
                return "model_name" not in samples[0].labels and "version" in samples[0].labels
    for name, children in expo.histograms.items():
        if name.startswith("vllm:") and children:
            return "model_name" not in children[0].labels and "version" in children[0].labels
    return False


def detect_kind(expo: Exposition) -> str | None:
    """Engine kind from family prefixes and labels; None when nothing is recognised."""
    if expo.has_prefix("dynamo_frontend_") or expo.has_prefix("dynamo_component_"):
        return dynamo.KIND
    if expo.has_prefix("nv_inference_") or expo.has_prefix("nv_trt_llm_") or _triton_vllm_backend(expo):
        return triton.KIND
    if expo.has_prefix("vllm:"):
        return vllm.KIND
    if expo.has_prefix("sglang:"):
        return sglang.KIND
    if expo.has_prefix("tgi_"):
        return tgi.KIND
    if expo.has_prefix("trtllm_"):
        return trtllm.KIND
    # 2025 trtllm-serve: un-prefixed request histograms carrying an engine_type label.
    ttft = expo.histogram("time_to_first_token_seconds")
    if ttft and "engine_type" in ttft[0].labels:
        return trtllm.KIND
    return None
