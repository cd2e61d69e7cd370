"""Requests the exporter sent to the Kubernetes API, by resource, verb and answer, for
gpupulse_kube_requests_total (the shape of client-go's rest_client_requests_total{code,method}).

One count per process: every reflector's client adds to REQUESTS, whichever plug-in owns the
reflector, and the self collector renders it; a test passes a RequestCounts of its own.
"""

from __future__ import annotations

ERROR_CODE = "<error>"  # no HTTP answer: refused, reset, timed out (client-go's label for it)


class RequestCounts:
    """(resource, verb, code) -> requests sent."""

    def __init__(self) -> None:
        self._counts: dict[tuple[str, str, str], int] = {}

    def add(self, resource: str, verb: str, code: str) -> None:
        key = (resource, verb, code)
        self._counts[key] = self._counts.get(key, 0) + 1

    def snapshot(self) -> dict[tuple[str, str, str], int]:
        """A copy of the counts now."""
        return dict(self._counts)

    def total(self, verb: str | None = None) -> int:
        """Requests of one verb (LIST, WATCH), or of all."""
        return sum(n for (_, v, _), n in self._counts.items() if verb is None or v == verb)


REQUESTS = RequestCounts()
