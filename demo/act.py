"""`python -m demo.act restart|migrate --kind K --node N --namespace NS --pod P --uuid U
[--training-job-kind JK --training-job J]`.

The command the demo gives the controller's local backend. It asks the demo orchestrator (URL and
token from GPUPULSE_DEMO_CONTROL_URL / GPUPULSE_DEMO_CONTROL_TOKEN) to carry out the action in the
simulated world. Exit codes follow the local backend's convention: 0 done, 75 try again later
(orchestrator unreachable or failing), 1 cannot be done.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence

EX_TEMPFAIL = 75
URL_ENV = "GPUPULSE_DEMO_CONTROL_URL"
TOKEN_ENV = "GPUPULSE_DEMO_CONTROL_TOKEN"
TIMEOUT_SECONDS = 10.0
# the target fields the control endpoint (demo/control.py) takes; here, as this module imports no more
# than the standard library: the backend starts it once per action
FIELDS = ("kind", "node", "namespace", "pod", "uuid", "training_job_kind", "training_job")


def run(argv: Sequence[str] | None = None, environ: Mapping[str, str] | None = None) -> int:
    """Send one action; returns the exit code."""
    env = os.environ if environ is None else environ
    parser = argparse.ArgumentParser(prog="python -m demo.act", description=__doc__)
    parser.add_argument("action", choices=("restart", "migrate"))
    for name in FIELDS:
        parser.add_argument(f"--{name.replace('_', '-')}", dest=name, default="")
    args = parser.parse_args(argv)
    url, token = env.get(URL_ENV, ""), env.get(TOKEN_ENV, "")
    if not url or not token:
        print(f"demo.act: {URL_ENV} and {TOKEN_ENV} must be set", file=sys.stderr)
        return 1
    body = json.dumps({k: getattr(args, k) for k in FIELDS}).encode()
    req = urllib.request.Request(
        f"{url.rstrip('/')}/control/{args.action}",
        data=body,
        headers={"Authorization": f"Bearer {token}", "Content-Type": "application/json"},
        method="POST",
    )
    try:
        with urllib.request.urlopen(req, timeout=TIMEOUT_SECONDS) as resp:
            print(json.loads(resp.read()).get("summary", "done"))
            return 0
    except urllib.error.HTTPError as exc:
        print(f"demo.act: {args.action} refused: {_refusal(exc)}", file=sys.stderr)
        return EX_TEMPFAIL if exc.code >= 500 else 1
    except (urllib.error.URLError, TimeoutError, ConnectionError) as exc:
        print(f"demo.act: orchestrator unreachable: {exc}", file=sys.stderr)
        return EX_TEMPFAIL


def _refusal(exc: urllib.error.HTTPError) -> str:
    """The world's own sentence ({"error": ...}) for a refusal; the status and raw body otherwise."""
    raw = exc.read().decode("utf-8", "replace")[:300]
    try:
        error = json.loads(raw).get("error")
    except (ValueError, AttributeError):
        error = None
    return str(error) if error else f"HTTP {exc.code} {raw}".strip()


def main() -> None:
    """Console entry point."""
    sys.exit(run())


if __name__ == "__main__":
    main()
