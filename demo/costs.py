"""What the demo's GPUs cost: the per-model token rules and the DRA node's attribution, read back from
the demo's Prometheus at the end and printed under the ladder's verdict."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import aiohttp

from demo.kubelet import DRA_DRIVER

COST_PER_MILLION = "namespace_model:gpu_cost_per_million_generated_tokens:ratio"
JOULES_PER_TOKEN = "namespace_model:gpu_energy_joules_per_generated_token:ratio"
TOKENS_RATE = "namespace_model:inference_generation_tokens:rate"
NAMESPACE_COST = "namespace:gpu_allocated_cost_per_hour:sum"


@dataclass(frozen=True)
class ModelCost:
    """One model's serving cost, from the gpupulse.tokens recording rules."""

    namespace: str
    model: str
    cost_per_million: float
    currency: str
    joules_per_token: float | None
    tokens_per_second: float | None


@dataclass(frozen=True)
class DraSummary:
    """The DRA node as Prometheus saw it."""

    node: str
    claim_rows: int  # gpu_allocation_info rows from DRA claims (one per pod holding a device)
    plugin_rows: int  # rows from the device plugin on the same node
    gpus: int
    free_gpus: int
    namespace_cost_per_hour: dict[str, float] = field(default_factory=dict)
    currency: str = ""


async def _query(session: aiohttp.ClientSession, url: str, expr: str) -> list[dict[str, Any]]:
    async with session.get(f"{url}/api/v1/query", params={"query": expr}) as resp:
        body = await resp.json()
    if resp.status != 200 or body.get("status") != "success":
        raise ValueError(f"{expr}: {body.get('error', resp.status)}")
    return list(body["data"]["result"])


def _value(series: dict[str, Any]) -> float:
    return float(series["value"][1])


def _by_model(result: Sequence[dict[str, Any]]) -> dict[tuple[str, str], float]:
    return {(s["metric"].get("namespace", ""), s["metric"].get("model", "")): _value(s) for s in result}


async def read_model_costs(session: aiohttp.ClientSession, url: str) -> list[ModelCost]:
    """Every model with a finite cost per million generated tokens."""
    costs = await _query(session, url, COST_PER_MILLION)
    joules = _by_model(await _query(session, url, JOULES_PER_TOKEN))
    tokens = _by_model(await _query(session, url, TOKENS_RATE))
    out = []
    for s in costs:
        key = (s["metric"].get("namespace", ""), s["metric"].get("model", ""))
        if math.isfinite(_value(s)):
            out.append(
                ModelCost(*key, _value(s), s["metric"].get("currency", ""), joules.get(key), tokens.get(key))
            )
    return sorted(out, key=lambda m: (m.namespace, m.model))


async def read_dra_node(session: aiohttp.ClientSession, url: str, node: str) -> DraSummary:
    """Allocation rows by kind, free GPUs and the cost per hour of the namespaces holding its GPUs."""
    on_node = f'{{node="{node}"}}'
    rows = await _query(session, url, f"gpu_allocation_info{on_node}")
    claims = sum(1 for s in rows if s["metric"].get("resource") == DRA_DRIVER)
    gpus = await _query(session, url, f"gpu_info{on_node}")
    free = await _query(session, url, f"gpu_info{on_node} unless on(uuid) gpu_allocation_info{on_node}")
    cost = await _query(
        session,
        url,
        f"{NAMESPACE_COST} and on(namespace) group by (namespace) (gpu_allocation_info{on_node})",
    )
    return DraSummary(
        node,
        claims,
        len(rows) - claims,
        len(gpus),
        len(free),
        {s["metric"]["namespace"]: _value(s) for s in cost},
        next((s["metric"].get("currency", "") for s in cost), ""),
    )


def cost_lines(models: Sequence[ModelCost], dra: DraSummary | None) -> list[str]:
    """The summary's lines (without the heading)."""
    lines = []
    for m in models:
        detail = []
        if m.joules_per_token is not None and math.isfinite(m.joules_per_token):
            detail.append(f"{m.joules_per_token:.3f} J per generated token")
        if m.tokens_per_second is not None:
            detail.append(f"{m.tokens_per_second:.0f} tokens/s")
        lines.append(
            f"serving: {m.cost_per_million:.3f} {m.currency} per 1M generated tokens for model {m.model} "
            f"({m.namespace})" + (f", {', '.join(detail)}" if detail else "")
        )
    if not models:
        lines.append("serving: no cost per token yet (no model with generated tokens on an attributed GPU)")
    if dra is not None:
        per_ns = ", ".join(f"{ns} {v:.2f}" for ns, v in sorted(dra.namespace_cost_per_hour.items()))
        lines.append(
            f"DRA node {dra.node}: {dra.claim_rows} claims attributed to pods, "
            f"{dra.plugin_rows} device-plugin allocation(s), "
            f"{dra.free_gpus} of {dra.gpus} GPUs free and still reported; "
            f"cost per hour by namespace ({dra.currency or 'no data'}): {per_ns or 'none'}"
        )
    return lines


async def cost_summary(prometheus_url: str, dra_node: str | None) -> list[str]:
    """Read and format; a Prometheus that cannot answer gives one line saying so."""
    try:
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5)) as session:
            models = await read_model_costs(session, prometheus_url)
            dra = await read_dra_node(session, prometheus_url, dra_node) if dra_node else None
    except (aiohttp.ClientError, TimeoutError, ValueError, KeyError) as exc:
        return [f"costs not read from Prometheus: {type(exc).__name__}: {exc}"]
    return cost_lines(models, dra)
