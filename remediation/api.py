"""Operator API over the engine: incidents, signatures, stats, pause/resume, breaker reset.

Every route here sits behind the bearer-token middleware (see auth.py).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any

from aiohttp import web

from .errors import NotLeader
from .model import Engine

MAX_BY_CHARS = 200
MAX_REASON_CHARS = 500
INCIDENT_STATES_LIMIT = 1000


def _dumps(value: Any) -> str:
    # datetimes, paths and enums from the engine's records become strings
    return json.dumps(value, default=str)


def _json(value: Any, status: int = 200) -> web.Response:
    return web.json_response(value, status=status, dumps=_dumps)


def _error(status: int, field: str, message: str) -> web.Response:
    return _json({"error": message, "field": field}, status=status)


async def _operator(request: web.Request) -> str | web.Response:
    """Who did it, for the ledger: `by`, with the optional `reason` after it ("alice (rack 4)"), or
    a 400 response."""
    body = await request.read()
    if not body:
        return _error(400, "by", 'body must be {"by": "<operator name>"}')
    try:
        doc = json.loads(body)
    except (ValueError, RecursionError):
        return _error(400, "body", "not valid JSON")
    by = doc.get("by") if isinstance(doc, dict) else None
    if not isinstance(by, str) or not by.strip():
        return _error(400, "by", "is required: the name of the operator")
    if len(by) > MAX_BY_CHARS:
        return _error(400, "by", f"longer than {MAX_BY_CHARS} characters")
    reason = doc.get("reason", "")
    if not isinstance(reason, str):
        return _error(400, "reason", "must be a string")
    if len(reason) > MAX_REASON_CHARS:
        return _error(400, "reason", f"longer than {MAX_REASON_CHARS} characters")
    return f"{by.strip()} ({reason.strip()})" if reason.strip() else by.strip()


class Api:
    """Route handlers bound to one engine."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    async def incidents(self, request: web.Request) -> web.Response:
        """GET /api/v1/incidents[?state=&signature=&limit=]"""
        state = request.query.get("state") or None
        signature = request.query.get("signature") or None
        try:
            limit = int(request.query.get("limit", "100"))
        except ValueError:
            return _error(400, "limit", "must be an integer")
        if not 1 <= limit <= INCIDENT_STATES_LIMIT:
            return _error(400, "limit", f"must be within 1..{INCIDENT_STATES_LIMIT}")
        items = [dict(i) for i in self.engine.list_incidents(state=state, limit=limit, signature=signature)]
        return _json({"incidents": items})

    async def incident(self, request: web.Request) -> web.Response:
        """GET /api/v1/incidents/{id} with its ledger."""
        try:
            incident_id = int(request.match_info["id"])
        except ValueError:
            return _error(400, "id", "must be an integer")
        found = self.engine.get_incident(incident_id)
        if found is None:
            return _error(404, "id", f"no incident {incident_id}")
        return _json(dict(found))

    async def signatures(self, request: web.Request) -> web.Response:
        """GET /api/v1/signatures"""
        return _json({"signatures": [dict(s) for s in self.engine.list_signatures()]})

    async def stats(self, request: web.Request) -> web.Response:
        """GET /api/v1/stats: the engine's counts, including the share handled without a human."""
        return _json(dict(self.engine.stats()))

    def _control(self, action: Callable[[str], Mapping[str, Any]], verb: str) -> Callable[[web.Request], Any]:
        async def handler(request: web.Request) -> web.Response:
            by = await _operator(request)
            if isinstance(by, web.Response):
                return by
            try:
                answer = action(by)
            except NotLeader as exc:  # a follower replica: the leader's engine holds the state
                return _error(503, "leader", str(exc))
            # changed: false when the switch already stood so; paused and breaker: what it left
            return _json({**answer, "ok": True, "action": verb, "by": by})

        return handler

    def add_routes(self, app: web.Application) -> None:
        """Register the operator routes on `app`."""
        app.router.add_get("/api/v1/incidents", self.incidents)
        app.router.add_get("/api/v1/incidents/{id}", self.incident)
        app.router.add_get("/api/v1/signatures", self.signatures)
        app.router.add_get("/api/v1/stats", self.stats)
        app.router.add_post("/api/v1/pause", self._control(self.engine.pause, "pause"))
        app.router.add_post("/api/v1/resume", self._control(self.engine.resume, "resume"))
        app.router.add_post(
            "/api/v1/breaker/reset", self._control(self.engine.reset_breaker, "breaker_reset")
        )
