"""`gpupulse-remediation pause | resume | status | breaker reset`: a human's controls over a running
controller, through its operator API with the same bearer token as the webhook.

pause stops new actions (their incidents page instead) until resume; breaker reset closes a breaker
that a budget opened (only a human does). Every failure is one line on stderr and a non-zero exit:
1 when the controller could not be reached or refused the request, 2 for bad local configuration.
"""

from __future__ import annotations

import argparse
import getpass
import http.client
import json
import os
import socket
import ssl
import sys
import urllib.error
import urllib.request
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, TextIO

from remediation.auth import TOKEN_ENV, load_token
from remediation.errors import CLIError, ConfigError
from remediation.settings import DEFAULT_LISTEN_PORT

PROG = "gpupulse-remediation"
ENV_URL = "GPUPULSE_REMEDIATION_URL"
ENV_TOKEN_FILE = "GPUPULSE_REMEDIATION_AUTH_TOKEN_FILE"  # serve's --auth.token-file twin
DEFAULT_URL = f"http://127.0.0.1:{DEFAULT_LISTEN_PORT}"
DEFAULT_TIMEOUT_SECONDS = 10.0
API_PREFIX = "/api/v1"  # every command's path starts so (remediation/api.py)


@dataclass(frozen=True)
class Client:
    """Where the controller is and how to authenticate to it."""

    url: str
    token: str
    timeout_seconds: float
    ssl_context: ssl.SSLContext | None

    def call(self, method: str, path: str, body: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """One API request; the JSON answer, or CLIError with a sentence a human can act on."""
        data = json.dumps(body).encode() if body is not None else None
        headers = {"Accept": "application/json"}
        if data is not None:
            headers["Content-Type"] = "application/json"
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        req = urllib.request.Request(self.url + path, data=data, headers=headers, method=method)
        try:
            with urllib.request.urlopen(req, timeout=self.timeout_seconds, context=self.ssl_context) as r:
                raw = r.read()
        except urllib.error.HTTPError as e:
            raise CLIError(self._refused(e.code, e.read())) from None
        except (urllib.error.URLError, OSError, http.client.HTTPException, ValueError) as e:
            why = getattr(e, "reason", e)
            if isinstance(why, TimeoutError):
                raise CLIError(
                    f"the controller at {self.url} did not answer within {self.timeout_seconds:g} s"
                ) from None
            raise CLIError(
                f"cannot reach the controller at {self.url}: {why} (is it running? set --url or ${ENV_URL})"
            ) from None
        try:
            doc = json.loads(raw)
        except ValueError:
            raise CLIError(f"{self.url}{path} answered something that is not JSON") from None
        if not isinstance(doc, dict):
            raise CLIError(f"{self.url}{path} answered JSON that is not an object")
        return doc

    def _refused(self, status: int, raw: bytes) -> str:
        if status == 401:
            given = "the token given" if self.token else "no token (none was given)"
            return (
                f"the controller at {self.url} refused {given} (401): pass the webhook's token with "
                f"--auth.token-file or ${TOKEN_ENV}"
            )
        try:
            doc = json.loads(raw)
            message = doc.get("error") if isinstance(doc, dict) else None
        except ValueError:
            message = None
        text = str(message) if message else raw.decode("utf-8", "replace").strip()[:200] or "no message"
        hint = ""
        if status == 404 and "/" in self.url.partition("://")[2]:
            hint = (
                f" (every command adds {API_PREFIX}/... to --url: give the controller's base URL, "
                "http://HOST:PORT, with no path unless a proxy puts one before it)"
            )
        return f"the controller at {self.url} answered {status}: {text}{hint}"


def add_connection_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--url",
        help=f"The controller's base URL (default ${ENV_URL}, else {DEFAULT_URL}, serve's default port).",
    )
    p.add_argument(
        "--auth.token-file",
        dest="auth_token_file",
        metavar="FILE",
        help=f"File holding the bearer token, as for serve (default ${ENV_TOKEN_FILE}, else ${TOKEN_ENV}).",
    )
    p.add_argument(
        "--tls.ca-file", dest="tls_ca_file", metavar="FILE", help="CA bundle to verify an https URL."
    )
    p.add_argument(
        "--tls.cert-file", dest="tls_cert_file", metavar="FILE", help="Client certificate (mutual TLS)."
    )
    p.add_argument("--tls.key-file", dest="tls_key_file", metavar="FILE", help="Client certificate's key.")
    p.add_argument(
        "--timeout",
        type=float,
        default=DEFAULT_TIMEOUT_SECONDS,
        metavar="SECONDS",
        help="Give up on the controller after this long (default %(default)s).",
    )


def _add_operator_flag(p: argparse.ArgumentParser) -> None:
    p.add_argument("--by", help="Who you are, for the ledger (default: $USER@<hostname>).")


def register(subparsers: Any) -> None:
    """Add pause, resume, status and breaker reset to the controller's CLI."""
    pause = subparsers.add_parser(
        "pause", help="Stop the running controller from acting (its incidents page) until resume."
    )
    add_connection_flags(pause)
    _add_operator_flag(pause)
    pause.add_argument("--reason", default="", help="Why, recorded with your name in the ledger.")
    pause.set_defaults(func=cmd_control, control="pause")

    resume = subparsers.add_parser("resume", help="Let a paused controller act again.")
    add_connection_flags(resume)
    _add_operator_flag(resume)
    resume.add_argument("--reason", default="", help="Why, recorded with your name in the ledger.")
    resume.set_defaults(func=cmd_control, control="resume")

    status = subparsers.add_parser(
        "status", help="Show whether the controller is paused, its breaker, actions in flight and budgets."
    )
    add_connection_flags(status)
    status.add_argument("--output", "-o", choices=("text", "json"), default="text")
    status.set_defaults(func=cmd_status)

    breaker = subparsers.add_parser("breaker", help="The safety breaker that a budget opens.")
    sub = breaker.add_subparsers(dest="breaker_command", required=True)
    reset = sub.add_parser("reset", help="Close the breaker (the controller acts again).")
    add_connection_flags(reset)
    _add_operator_flag(reset)
    reset.add_argument("--reason", default="", help="Why, recorded with your name in the ledger.")
    reset.set_defaults(func=cmd_control, control="breaker_reset")


def client_from_flags(ns: argparse.Namespace, environ: Mapping[str, str]) -> Client:
    """The Client the flags and environment describe; ConfigError for what cannot work."""
    url = base_url(ns.url or environ.get(ENV_URL) or DEFAULT_URL)
    token_file = ns.auth_token_file or environ.get(ENV_TOKEN_FILE) or ""
    token = load_token(Path(token_file) if token_file else None, environ)
    context = None
    if url.startswith("https://") or ns.tls_ca_file or ns.tls_cert_file:
        if bool(ns.tls_cert_file) != bool(ns.tls_key_file):
            raise ConfigError("--tls.cert-file and --tls.key-file must be given together")
        try:
            context = ssl.create_default_context(cafile=ns.tls_ca_file or None)
            if ns.tls_cert_file:
                context.load_cert_chain(ns.tls_cert_file, ns.tls_key_file)
        except (OSError, ssl.SSLError) as e:
            raise ConfigError(f"TLS files: {e}") from e
    if ns.timeout <= 0:
        raise ConfigError("--timeout must be positive")
    return Client(url, token, ns.timeout, context)


def base_url(given: str) -> str:
    """The controller's base URL from what a human passes: an operator API URL such as the demo
    prints (`http://HOST:PORT/api/v1/incidents`) is taken back to its base, since every command adds
    its own path. ConfigError for what is not an http(s) URL."""
    url = given.strip().rstrip("/")
    if not url.startswith(("http://", "https://")):
        raise ConfigError(f"--url {url!r}: give http://HOST:PORT or https://HOST:PORT")
    scheme, _, rest = url.partition("://")
    host, _, path = rest.partition("/")
    segments = path.split("/") if path else []
    api = API_PREFIX.strip("/").split("/")
    for i in range(len(segments) - len(api) + 1):
        if segments[i : i + len(api)] == api:  # a prefix a proxy adds before it stays
            return "/".join([f"{scheme}://{host}", *segments[:i]])
    return url


def _operator(ns: argparse.Namespace, environ: Mapping[str, str]) -> str:
    if ns.by:
        return str(ns.by)
    try:
        user = environ.get("USER") or getpass.getuser()
    except (KeyError, OSError):
        user = "unknown"
    return f"{user}@{socket.gethostname()}"


_PATHS = {"pause": "/api/v1/pause", "resume": "/api/v1/resume", "breaker_reset": "/api/v1/breaker/reset"}
_DONE = {
    "pause": "paused: new actions are blocked and their incidents page",
    "resume": "resumed",
    "breaker_reset": "breaker closed",
}


def control_outcome(control: str, answer: Mapping[str, Any]) -> str:
    """What a switch did, as it is: nothing when it already stood so, and what still blocks actions
    (a pause after a breaker reset, an open breaker after a resume)."""
    paused = answer.get("paused")
    breaker = answer.get("breaker")
    if not isinstance(paused, Mapping) or not isinstance(breaker, Mapping):
        return _DONE[control]  # a controller older than the answer's fields
    if answer.get("changed") is False:
        head = {
            "pause": f"already paused by {paused.get('by', '?')} at {_when(paused.get('at'))}",
            "resume": "was not paused",
            "breaker_reset": "the breaker was not open",
        }[control] + ": nothing changed"
    else:
        head = _DONE[control]
    if control == "pause":
        return head
    blocks = []
    if paused.get("paused"):
        blocks.append(f"it is still paused by {paused.get('by', '?')} (acts after `resume`)")
    if breaker.get("open"):
        blocks.append(f"its breaker is OPEN: {breaker.get('reason', '?')} (acts after `breaker reset`)")
    return head + (
        "; the controller does not act: " + "; ".join(blocks) if blocks else "; the controller acts again"
    )


def cmd_control(
    ns: argparse.Namespace,
    environ: Mapping[str, str] | None = None,
    out: TextIO | None = None,
    err: TextIO | None = None,
) -> int:
    """pause, resume or breaker reset."""
    env = os.environ if environ is None else environ
    out, err = out or sys.stdout, err or sys.stderr
    name = {"breaker_reset": "breaker reset"}.get(ns.control, ns.control)
    try:
        client = client_from_flags(ns, env)
        body = {"by": _operator(ns, env)}
        if getattr(ns, "reason", ""):
            body["reason"] = ns.reason
        answer = client.call("POST", _PATHS[ns.control], body)
    except ConfigError as e:
        print(f"{PROG} {name}: error: {e}", file=err)
        return 2
    except CLIError as e:
        print(f"{PROG} {name}: error: {e}", file=err)
        return 1
    print(
        f"{control_outcome(ns.control, answer)} (by {answer.get('by', body['by'])}, {client.url})", file=out
    )
    return 0


def cmd_status(
    ns: argparse.Namespace,
    environ: Mapping[str, str] | None = None,
    out: TextIO | None = None,
    err: TextIO | None = None,
) -> int:
    """status: GET /api/v1/stats, printed for a human (or as JSON)."""
    env = os.environ if environ is None else environ
    out, err = out or sys.stdout, err or sys.stderr
    try:
        client = client_from_flags(ns, env)
        stats = client.call("GET", "/api/v1/stats")
    except ConfigError as e:
        print(f"{PROG} status: error: {e}", file=err)
        return 2
    except CLIError as e:
        print(f"{PROG} status: error: {e}", file=err)
        return 1
    if ns.output == "json":
        json.dump(stats, out, indent=2, sort_keys=True)
        out.write("\n")
    else:
        out.write(render_status(client.url, stats))
    return 0


def _when(ts: Any) -> str:
    try:
        return datetime.fromtimestamp(float(ts), tz=UTC).strftime("%Y-%m-%d %H:%M:%SZ")
    except (TypeError, ValueError, OverflowError, OSError):
        return "?"


def render_status(url: str, stats: Mapping[str, Any]) -> str:
    """The stats answer as aligned lines: controller, paused, breaker, dry run, actions, incidents."""
    rows: list[tuple[str, str]] = [("controller", url)]
    if "replica" in stats:
        role = (
            "leader" if stats.get("leader") else "follower: pause, resume and breaker reset need the leader"
        )
        rows.append(("replica", f"{stats['replica']} ({role})"))
    paused = stats.get("paused")
    if isinstance(paused, Mapping):
        if paused.get("paused"):
            rows.append(("paused", f"YES, by {paused.get('by', '?')} at {_when(paused.get('at'))}"))
        else:
            rows.append(("paused", "no"))
    breaker = stats.get("breaker")
    if isinstance(breaker, Mapping):
        if breaker.get("open"):
            rows.append(
                ("breaker", f"OPEN since {_when(breaker.get('opened_at'))}: {breaker.get('reason', '?')}")
            )
        else:
            closed = f", closed by {breaker['closed_by']}" if breaker.get("closed_by") else ""
            rows.append(("breaker", f"closed{closed}"))
    if stats.get("pager") == "none":
        rows.append(("pager", "NONE: pages (the breaker's too) reach only the controller's log (--pager)"))
    elif stats.get("pager"):
        rows.append(("pager", str(stats["pager"])))
    if "dry_run" in stats:
        rows.append(("dry run", "YES: decides and records, never acts" if stats["dry_run"] else "no"))
    actions = stats.get("actions")
    if isinstance(actions, Mapping):
        rows.append(
            (
                "actions",
                f"{actions.get('in_flight', '?')} in flight (budget {actions.get('max_concurrent', '?')}), "
                f"{actions.get('last_minute', '?')} in the last minute (budget "
                f"{actions.get('max_per_minute', '?')})",
            )
        )
    if "incidents_open" in stats:
        rows.append(("incidents", f"{stats['incidents_open']} open"))
    log = stats.get("switch_log")
    if isinstance(log, list):
        for i, entry in enumerate(e for e in log[:5] if isinstance(e, Mapping)):
            verb = {"breaker_reset": "breaker reset"}.get(str(entry.get("action")), str(entry.get("action")))
            same = "" if entry.get("changed", True) else " (nothing changed)"
            rows.append(
                (
                    "switched" if i == 0 else "",
                    f"{_when(entry.get('at'))} {verb} by {entry.get('by', '?')}{same}",
                )
            )
    width = max(len(k) for k, _ in rows)
    return "".join(f"{k.ljust(width)}  {v}\n" for k, v in rows)
