"""Optional PromQL verification: a rung only counts as successful when a health query holds."""

from __future__ import annotations

import re
from collections.abc import Mapping

import aiohttp

_PLACEHOLDER = re.compile(r"\{(node|namespace|pod|uuid|gpu|instance|container)\}")


class VerifyError(Exception):
    """Prometheus could not answer (unreachable, bad query); the check counts as not yet passed."""


def render_query(template: str, labels: Mapping[str, str]) -> str:
    """Substitute {node}, {uuid}... with label values escaped for a PromQL double-quoted string."""

    def sub(m: re.Match[str]) -> str:
        value = labels.get(m.group(1), "")
        return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")

    return _PLACEHOLDER.sub(sub, template)


class PromQLVerifier:
    """GET <prometheus>/api/v1/query; healthy = at least one sample and every sample value nonzero."""

    def __init__(self, base_url: str, timeout_seconds: float = 5.0) -> None:
        self.base_url = base_url.rstrip("/")
        self.timeout = aiohttp.ClientTimeout(total=timeout_seconds)

    async def healthy(self, query: str) -> bool:
        """True when the query's result says the fault is gone."""
        url = f"{self.base_url}/api/v1/query"
        try:
            async with (
                aiohttp.ClientSession(timeout=self.timeout) as session,
                session.get(url, params={"query": query}) as resp,
            ):
                body = await resp.json(content_type=None)
                if resp.status != 200 or body.get("status") != "success":
                    raise VerifyError(f"prometheus answered {resp.status}: {body.get('error', '')}")
        except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
            raise VerifyError(f"prometheus query failed: {exc}") from exc
        data = body.get("data", {})
        result = data.get("result", [])
        if data.get("resultType") == "scalar":
            return float(result[1]) != 0.0
        if not isinstance(result, list) or not result:
            return False
        return all(float(item["value"][1]) != 0.0 for item in result)
