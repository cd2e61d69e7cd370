"""`gpupulse-remediation pause | resume | status | breaker reset` against a real `serve` process (and, for
a follower and hostile answers, small servers of our own): what a human types at 3 a.m. works, and
every failure is one line, never a traceback."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from remediation.api import Api
from remediation.errors import NotLeader
from tests.fakes.intake import TOKEN, alert, free_port, notification, wait_until
from tests.remediation.test_cli_serve import Serve


def cli(*argv: str, env: Mapping[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """`python -m remediation ARGV` with a clean environment (plus `env`)."""
    base = {k: v for k, v in os.environ.items() if not k.startswith("GPUPULSE_REMEDIATION_")}
    return subprocess.run(
        [sys.executable, "-m", "remediation", *argv],
        env={**base, **(env or {})},
        capture_output=True,
        text=True,
        timeout=60,
    )


def one_line_error(proc: subprocess.CompletedProcess[str]) -> str:
    assert proc.stdout == ""
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    return lines[0]


@pytest.fixture(scope="module")
def controller(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Serve, Path]]:
    """One real controller (local backend, a restart command that leaves a marker) and its token file."""
    tmp = tmp_path_factory.mktemp("control")
    token = tmp / "token"
    token.write_text(TOKEN + "\n")
    marker = tmp / "restarted"
    script = f"import pathlib; pathlib.Path({str(marker)!r}).touch()"
    serve = Serve(tmp, f"--backend.local.restart-command={sys.executable} -c {json.dumps(script)}",
                  "--scope.namespaces=serving")  # fmt: skip
    try:
        yield serve, token
    finally:
        serve.stop()


@pytest.mark.integration
def test_pause_status_resume_and_breaker_reset_on_a_running_controller(
    controller: tuple[Serve, Path], tmp_path: Path
) -> None:
    serve, token = controller
    flags = ["--url", serve.url, "--auth.token-file", str(token)]

    status = cli("status", *flags)
    assert status.returncode == 0, status.stderr
    assert "paused      no" in status.stdout and "breaker     closed" in status.stdout
    assert "actions     0 in flight (budget 4), 0 in the last minute (budget 20)" in status.stdout
    # the default pager sends pages nowhere but the log: status says so
    assert "pager       NONE: pages (the breaker's too) reach only the controller's log" in status.stdout
    assert "--pager=none: pages (the breaker's too) reach only this log" in serve.log.read_text()

    paused = cli("pause", *flags, "--by", "alice", "--reason", "draining rack 4")
    assert paused.returncode == 0, paused.stderr
    assert paused.stdout.startswith("paused: new actions are blocked")
    status = cli("status", *flags, "-o", "json")
    doc = json.loads(status.stdout)
    assert doc["paused"]["paused"] is True and doc["paused"]["by"] == "alice (draining rack 4)"
    assert "paused      YES, by alice (draining rack 4) at " in cli("status", *flags).stdout

    # while paused, an alert that would restart does not: the pause is the kill switch
    leak = alert(fingerprint="1eak0000000000c1", fault_class="memory_leak", namespace="serving", pod="llm-0")
    leak["labels"]["target_kind"] = "pod"
    leak["labels"]["alertname"] = "GPUProcessMemoryAboveHardLimit"
    assert serve.post(notification([leak])) == 200
    wait_until(lambda: _stats(serve)["incidents_open"] + sum(_stats(serve)["incidents_closed"].values()) >= 1,
               20, "the incident to be recorded")  # fmt: skip
    assert not (serve.tmp / "restarted").exists()

    # the token from the environment, as serve reads it; the operator defaults to $USER@host
    resumed = cli("resume", "--url", serve.url, env={"GPUPULSE_REMEDIATION_TOKEN": TOKEN, "USER": "bob"})
    assert resumed.returncode == 0, resumed.stderr
    assert f"by bob@{socket.gethostname()}" in resumed.stdout
    assert "paused      no" in cli("status", *flags).stdout

    # the breaker never opened: a reset changes nothing, and says so (who tried stays on record)
    reset = cli("breaker", "reset", *flags, "--by", "carol")
    assert reset.returncode == 0, reset.stderr
    assert reset.stdout.startswith("the breaker was not open: nothing changed")
    status = cli("status", *flags).stdout
    assert "breaker     closed\n" in status and "breaker reset by carol (nothing changed)" in status


@pytest.mark.integration
def test_each_switch_says_what_it_changed_and_what_still_blocks_actions(
    controller: tuple[Serve, Path],
) -> None:
    serve, token = controller
    flags = ["--url", serve.url, "--auth.token-file", str(token)]
    assert not _stats(serve)["paused"]["paused"] and not _stats(serve)["breaker"]["open"]

    # a breaker that was never open: the old answer said "breaker closed: the controller acts again"
    reset = cli("breaker", "reset", *flags, "--by", "dave", "--reason", "checking")
    assert reset.returncode == 0, reset.stderr
    assert reset.stdout.startswith("the breaker was not open: nothing changed; the controller acts again")

    assert cli("pause", *flags, "--by", "erin", "--reason", "rack 7").returncode == 0
    again = cli("pause", *flags, "--by", "frank")
    assert again.stdout.startswith("already paused by erin (rack 7) at "), again.stdout
    assert "nothing changed" in again.stdout
    assert _stats(serve)["paused"]["by"] == "erin (rack 7)"  # the first pause's author and time stay

    # a breaker reset while paused does not make the controller act
    reset = cli("breaker", "reset", *flags, "--by", "dave")
    assert "the controller does not act: it is still paused by erin (rack 7) (acts after `resume`)" in (
        reset.stdout
    )

    resumed = cli("resume", *flags, "--by", "erin", "--reason", "rack 7 done")
    assert resumed.returncode == 0, resumed.stderr
    assert resumed.stdout.startswith("resumed; the controller acts again (by erin (rack 7 done), ")
    assert cli("resume", *flags, "--by", "erin").stdout.startswith("was not paused: nothing changed")

    # who did what, newest first, in the status a person reads and in its JSON
    log = _stats(serve)["switch_log"]
    assert [(e["action"], e["by"], e["changed"]) for e in log[:6]] == [
        ("resume", "erin", False),
        ("resume", "erin (rack 7 done)", True),
        ("breaker_reset", "dave", False),
        ("pause", "frank", False),
        ("pause", "erin (rack 7)", True),
        ("breaker_reset", "dave (checking)", False),
    ]
    text = cli("status", *flags).stdout
    assert "switched    " in text and "resume by erin (rack 7 done)" in text
    assert "pause by frank (nothing changed)" in text


def _stats(serve: Serve) -> dict[str, Any]:
    import urllib.request

    req = urllib.request.Request(serve.url + "/api/v1/stats", headers={"Authorization": f"Bearer {TOKEN}"})
    with urllib.request.urlopen(req, timeout=5) as r:
        return dict(json.loads(r.read()))


@pytest.mark.integration
def test_a_wrong_or_missing_token_is_named_not_a_traceback(
    controller: tuple[Serve, Path], tmp_path: Path
) -> None:
    serve, _ = controller
    wrong = tmp_path / "wrong"
    wrong.write_text("not-the-token")
    line = one_line_error(cli("pause", "--url", serve.url, "--auth.token-file", str(wrong)))
    assert "refused the token given (401)" in line and "--auth.token-file" in line
    proc = cli("status", "--url", serve.url)
    assert proc.returncode == 1
    assert "refused no token (none was given) (401)" in one_line_error(proc)


@pytest.mark.integration
def test_a_request_the_api_refuses_shows_its_message(controller: tuple[Serve, Path]) -> None:
    serve, token = controller
    proc = cli("pause", "--url", serve.url, "--auth.token-file", str(token), "--reason", "x" * 501)
    assert proc.returncode == 1
    assert one_line_error(proc).endswith("answered 400: longer than 500 characters")


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--auth.token-file", "/nonexistent/token"], "--auth.token-file /nonexistent/token"),
        (["--url", "controller:9836"], "give http://HOST:PORT"),
        (["--timeout", "0"], "--timeout must be positive"),
        (["--tls.cert-file", "/c.pem"], "must be given together"),
    ],
)
def test_bad_local_settings_exit_2_with_one_line(argv: list[str], message: str) -> None:
    proc = cli("status", *argv)
    assert proc.returncode == 2
    assert message in one_line_error(proc)


def test_an_unreachable_controller_is_one_line() -> None:
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    for argv in (["pause"], ["resume"], ["status"], ["breaker", "reset"]):
        proc = cli(*argv, "--url", url)
        assert proc.returncode == 1
        line = one_line_error(proc)
        assert f"cannot reach the controller at {url}" in line and "--url" in line


def test_a_controller_that_never_answers_times_out() -> None:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)  # accepts the connection (the kernel's backlog) and never answers
        url = f"http://127.0.0.1:{listener.getsockname()[1]}"
        proc = cli("status", "--url", url, "--timeout", "0.5")
    assert proc.returncode == 1
    assert one_line_error(proc) == (
        f"gpupulse-remediation status: error: the controller at {url} did not answer within 0.5 s"
    )


class _Follower:
    """The engine a follower replica answers with (remediation/kube/serve.py): no leader here."""

    def stats(self) -> dict[str, Any]:
        return {"replica": "ctl-1", "leader": False, "leader_election": True}

    def pause(self, by: str) -> dict[str, Any]:
        raise NotLeader("ctl-1 is not the leader; send this to the leading replica")

    resume = reset_breaker = pause


@pytest.fixture
async def server(request: pytest.FixtureRequest) -> AsyncIterator[str]:
    """An aiohttp app on 127.0.0.1: the real API over a follower, or a server that answers HTML."""
    app = web.Application()
    if request.param == "follower":
        Api(_Follower()).add_routes(app)  # type: ignore[arg-type]
    else:

        async def html(_: web.Request) -> web.Response:
            return web.Response(text="<html>proxy login</html>", content_type="text/html")

        app.router.add_route("*", "/{tail:.*}", html)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()


async def _cli(*argv: str) -> subprocess.CompletedProcess[str]:
    return await asyncio.to_thread(cli, *argv)


@pytest.mark.parametrize("server", ["follower"], indirect=True)
async def test_a_follower_says_to_ask_the_leader(server: str) -> None:
    proc = await _cli("pause", "--url", server)
    assert proc.returncode == 1
    assert "answered 503: ctl-1 is not the leader" in one_line_error(proc)
    status = await _cli("status", "--url", server)
    assert status.returncode == 0
    assert "replica     ctl-1 (follower: pause, resume and breaker reset need the leader)" in status.stdout


@pytest.mark.parametrize("server", ["follower"], indirect=True)
async def test_the_api_url_the_demo_prints_reaches_the_controller(server: str) -> None:
    # the demo prints the controller's API as http://HOST:PORT/api/v1/incidents: it works as --url
    for given in (f"{server}/api/v1/incidents", f"{server}/api/v1/", f"{server}/"):
        status = await _cli("status", "--url", given)
        assert status.returncode == 0, status.stderr
        assert status.stdout.startswith(f"controller  {server}\n")


@pytest.mark.parametrize("server", ["follower"], indirect=True)
async def test_a_url_with_a_path_that_answers_404_says_what_to_give(server: str) -> None:
    proc = await _cli("status", "--url", f"{server}/gpupulse")
    assert proc.returncode == 1
    assert one_line_error(proc).endswith(
        "answered 404: 404: Not Found (every command adds /api/v1/... to --url: give the controller's "
        "base URL, http://HOST:PORT, with no path unless a proxy puts one before it)"
    )


def test_a_proxy_prefix_before_the_api_path_is_kept() -> None:
    from remediation.control_cli import base_url

    assert base_url("https://ops.example/gpupulse/api/v1/incidents/3") == "https://ops.example/gpupulse"
    assert base_url("http://127.0.0.1:9836") == "http://127.0.0.1:9836"
    assert base_url("http://127.0.0.1:9836/apiv1") == "http://127.0.0.1:9836/apiv1"


@pytest.mark.parametrize("server", ["html"], indirect=True)
async def test_an_answer_that_is_not_json_is_named(server: str) -> None:
    proc = await _cli("status", "--url", server)
    assert proc.returncode == 1
    assert one_line_error(proc).endswith("/api/v1/stats answered something that is not JSON")


def test_a_resume_with_the_breaker_open_says_the_controller_still_does_not_act() -> None:
    from remediation.control_cli import control_outcome

    breaker = {"open": True, "opened_at": 0.0, "reason": "more than 20 actions in a minute"}
    resumed = control_outcome("resume", {"changed": True, "paused": {"paused": False}, "breaker": breaker})
    assert resumed == (
        "resumed; the controller does not act: its breaker is OPEN: more than 20 actions in a minute "
        "(acts after `breaker reset`)"
    )
    closed = control_outcome(
        "breaker_reset", {"changed": True, "paused": {"paused": False}, "breaker": {"open": False}}
    )
    assert closed == "breaker closed; the controller acts again"
    # an older controller's answer has no state: the plain words, as before
    assert control_outcome("breaker_reset", {"ok": True}) == "breaker closed"


@pytest.mark.integration
def test_a_controller_without_leader_election_reads_as_the_leader(controller: tuple[Serve, Path]) -> None:
    import urllib.request

    serve, _ = controller
    with urllib.request.urlopen(serve.url + "/metrics", timeout=5) as r:
        text = r.read().decode()
    assert "\ngpupulse_remediation_leader 1.0\n" in text
