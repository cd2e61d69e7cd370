"""Optional PromQL verification: a rung only counts as successful when a health query holds."""

from __future__ import annotations

import math
import re
from collections.abc import Mapping

import aiohttp

from remediation.errors import VerifyError

_PLACEHOLDER = re.compile(r"\{(node|namespace|pod|uuid|gpu|instance|container)\}")


def render_query(template: str, labels: Mapping[str, str]) -> str:
    """Substitute {node}, {uuid}... with label values escaped for a PromQL double-quoted string."""

    def sub(m: re.Match[str]) -> str:
        value = labels.get(m.group(1), "")
        return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")

    return _PLACEHOLDER.sub(sub, template)


class PromQLVerifier:
    """GET <prometheus>/api/v1/query; healthy = at least one sample and every sample a finite nonzero
    number. An empty result never counts as healthy: the query found nothing to vouch for."""

    def __init__(self, base_url: str, timeout_seconds: float = 5.0) -> None:
        self.base_url = base_url.rstrip("/")
        self.timeout = aiohttp.ClientTimeout(total=timeout_seconds)

    async def healthy(self, query: str) -> bool:
        """True when the query's result says the fault is gone; VerifyError when it cannot say."""
        url = f"{self.base_url}/api/v1/query"
        try:
            async with (
                aiohttp.ClientSession(timeout=self.timeout) as session,
                session.get(url, params={"query": query}) as resp,
            ):
                body = await resp.json(content_type=None)
                if not isinstance(body, dict):
                    raise VerifyError(f"prometheus answered {resp.status} with a non-object body")
                if resp.status != 200 or body.get("status") != "success":
                    raise VerifyError(f"prometheus answered {resp.status}: {body.get('error', '')}")
        except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
            raise VerifyError(f"prometheus query failed: {exc}") from exc
        return _all_nonzero(_sample_values(body.get("data")))


def _sample_values(data: object) -> list[str]:
    """The sample values of an instant query's result (scalar: one; vector: one per series)."""
    if not isinstance(data, dict):
        raise VerifyError("malformed query result: no data object")
    try:
        result, kind = data["result"], data.get("resultType")
        if kind == "scalar":
            return [str(result[1])]
        if kind == "vector":
            return [str(item["value"][1]) for item in result]
    except (KeyError, IndexError, TypeError) as exc:
        raise VerifyError(f"malformed query result: {exc!r}") from exc
    raise VerifyError(f"the query must give a vector or a scalar, not {kind!r}")


def _all_nonzero(values: list[str]) -> bool:
    if not values:
        return False
    try:
        numbers = [float(v) for v in values]
    except ValueError as exc:
        raise VerifyError(f"non-numeric sample value: {exc}") from exc
    return all(math.isfinite(n) and n != 0.0 for n in numbers)
