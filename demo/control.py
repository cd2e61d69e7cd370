"""The orchestrator's control endpoint: the local backend's commands ask it to restart or migrate.

POST /control/restart and /control/migrate with a JSON target {kind, node, namespace, pod, uuid,
training_job_kind, training_job} (the last two name a `job` target's owner) and
`Authorization: Bearer <token>`. 200 = done; 422 = the world cannot do it (the ladder moves on);
401 = bad token; 400 = malformed request (not an object of strings, or a field the world has no
place for: a job target without its owner, a pod or GPU target naming one).
"""

from __future__ import annotations

import hmac
import json
from collections.abc import Callable
from dataclasses import dataclass

from aiohttp import web

from demo.act import FIELDS
from demo.world import WorldError

MAX_BODY_BYTES = 16 * 1024
ACTIONS = ("restart", "migrate")
JOB_FIELDS = ("namespace", "training_job_kind", "training_job")


@dataclass(frozen=True)
class ActionRequest:
    """What the local backend asked for."""

    action: str
    kind: str
    node: str
    namespace: str
    pod: str
    uuid: str
    training_job_kind: str = ""
    training_job: str = ""


def _malformed(req: ActionRequest) -> str | None:
    """Why the request cannot be meant as sent, or None (the world judges the rest: 422)."""
    if req.kind == "job":
        missing = [f for f in JOB_FIELDS if not getattr(req, f)]
        if missing:
            return f"a job target needs {', '.join(missing)}"
    elif req.training_job_kind or req.training_job:
        return (
            f"training_job_kind and training_job belong to a job target, not a {req.kind or 'kindless'} one"
        )
    return None


Handler = Callable[[ActionRequest], str]


def _token_ok(header: str, token: str) -> bool:
    scheme, _, presented = header.partition(" ")
    # constant time: the comparison must not tell an attacker how much of a guess was right
    return scheme.lower() == "bearer" and hmac.compare_digest(presented.strip().encode(), token.encode())


def make_control_app(token: str, handle: Handler) -> web.Application:
    """The control application; `handle` returns a one-line summary or raises WorldError."""
    if not token:
        raise ValueError("the control endpoint needs a token")

    async def control(request: web.Request) -> web.Response:
        if not _token_ok(request.headers.get("Authorization", ""), token):
            return web.json_response({"error": "missing or wrong bearer token"}, status=401)
        action = request.match_info["action"]
        if action not in ACTIONS:
            return web.json_response({"error": f"unknown action {action!r}"}, status=404)
        try:
            doc = json.loads(await request.read())
        except ValueError:
            return web.json_response({"error": "body is not JSON"}, status=400)
        if not isinstance(doc, dict) or not all(isinstance(doc.get(f, ""), str) for f in FIELDS):
            return web.json_response({"error": f"body must be an object of strings {FIELDS}"}, status=400)
        req = ActionRequest(action, *(str(doc.get(f, "")) for f in FIELDS))
        problem = _malformed(req)
        if problem is not None:
            return web.json_response({"error": problem}, status=400)
        try:
            summary = handle(req)
        except WorldError as exc:
            return web.json_response({"ok": False, "error": str(exc)}, status=422)
        return web.json_response({"ok": True, "summary": summary})

    app = web.Application(client_max_size=MAX_BODY_BYTES)
    app.router.add_post("/control/{action}", control)
    return app
