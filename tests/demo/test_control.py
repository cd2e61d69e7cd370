"""The control endpoint (bearer token) and `python -m demo.act`, the local backend's command."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import AsyncIterator

import aiohttp
import pytest
from aiohttp import web

from demo.act import EX_TEMPFAIL, TOKEN_ENV, URL_ENV, run
from demo.control import ActionRequest, make_control_app
from demo.procs import free_port
from demo.world import WorldError

TOKEN = "s3cret-token"


class Recorder:
    """Handler that records requests; a pod or job named `missing` is refused like the world refuses it."""

    def __init__(self) -> None:
        self.calls: list[ActionRequest] = []

    def __call__(self, req: ActionRequest) -> str:
        if req.pod == "missing":
            raise WorldError("no pod serving/missing")
        if req.training_job == "missing":
            raise WorldError(f"no training job {req.training_job_kind} {req.namespace}/missing")
        self.calls.append(req)
        return f"{req.action} {req.namespace}/{req.pod}"


@pytest.fixture
async def control() -> AsyncIterator[tuple[str, Recorder]]:
    rec = Recorder()
    runner = web.AppRunner(make_control_app(TOKEN, rec))
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    yield f"http://127.0.0.1:{runner.addresses[0][1]}", rec
    await runner.cleanup()


async def _post(url: str, body: object, token: str | None) -> tuple[int, dict[str, object]]:
    headers = {"Authorization": f"Bearer {token}"} if token is not None else {}
    async with aiohttp.ClientSession() as s, s.post(url, json=body, headers=headers) as resp:
        return resp.status, await resp.json()


async def test_requests_without_the_right_token_are_refused(control: tuple[str, Recorder]) -> None:
    url, rec = control
    target = {"kind": "pod", "namespace": "serving", "pod": "chat"}
    assert (await _post(f"{url}/control/restart", target, None))[0] == 401
    assert (await _post(f"{url}/control/restart", target, "s3cret-tokeX"))[0] == 401
    assert rec.calls == []
    status, body = await _post(f"{url}/control/restart", target, TOKEN)
    assert (status, body["summary"]) == (200, "restart serving/chat")
    assert rec.calls == [ActionRequest("restart", "pod", "", "serving", "chat", "")]


async def test_malformed_and_impossible_requests(control: tuple[str, Recorder]) -> None:
    url, rec = control
    assert (await _post(f"{url}/control/restart", ["not", "an", "object"], TOKEN))[0] == 400
    assert (await _post(f"{url}/control/restart", {"pod": 7}, TOKEN))[0] == 400
    assert (await _post(f"{url}/control/reboot", {"pod": "x"}, TOKEN))[0] == 404
    status, body = await _post(f"{url}/control/migrate", {"kind": "pod", "pod": "missing"}, TOKEN)
    assert status == 422 and "no pod" in str(body["error"])
    assert rec.calls == []


JOB = {
    "kind": "job",
    "namespace": "research",
    "training_job_kind": "PyTorchJob.kubeflow.org",
    "training_job": "t",
}


async def test_a_job_target_carries_its_owner(control: tuple[str, Recorder]) -> None:
    url, rec = control
    status, body = await _post(f"{url}/control/restart", JOB, TOKEN)
    assert status == 200, body
    assert rec.calls == [
        ActionRequest("restart", "job", "", "research", "", "", "PyTorchJob.kubeflow.org", "t")
    ]
    status, body = await _post(f"{url}/control/restart", {**JOB, "training_job": "missing"}, TOKEN)
    assert status == 422 and "no training job PyTorchJob.kubeflow.org research/missing" in str(body["error"])


async def test_malformed_job_targets_are_refused_before_the_world_sees_them(
    control: tuple[str, Recorder],
) -> None:
    url, rec = control
    for body, why in (
        ({**JOB, "training_job": ""}, "needs training_job"),
        ({**JOB, "training_job_kind": "", "namespace": ""}, "needs namespace, training_job_kind"),
        ({**JOB, "training_job": ["t"]}, "object of strings"),
        ({**JOB, "training_job_kind": 3}, "object of strings"),
        ({"kind": "pod", "namespace": "research", "pod": "p", "training_job": "t"}, "belong to a job target"),
        ({"kind": "gpu", "uuid": "GPU-1", "training_job_kind": "PyTorchJob.kubeflow.org"}, "belong to a job"),
    ):
        status, answer = await _post(f"{url}/control/restart", body, TOKEN)
        assert (status, why in str(answer.get("error"))) == (400, True), (body, answer)
    assert rec.calls == []


def test_an_empty_token_is_refused() -> None:
    with pytest.raises(ValueError):
        make_control_app("", Recorder())


async def test_act_exit_codes_follow_the_local_backend(control: tuple[str, Recorder]) -> None:
    url, rec = control
    env = {URL_ENV: url, TOKEN_ENV: TOKEN}
    args = ["restart", "--kind", "pod", "--namespace", "serving", "--pod", "chat"]
    assert await asyncio.to_thread(run, args, env) == 0
    assert rec.calls[-1].pod == "chat"
    assert await asyncio.to_thread(run, ["migrate", "--kind", "pod", "--pod", "missing"], env) == 1
    assert await asyncio.to_thread(run, args, {URL_ENV: url, TOKEN_ENV: "wrong"}) == 1
    down = {URL_ENV: f"http://127.0.0.1:{free_port()}", TOKEN_ENV: TOKEN}
    assert await asyncio.to_thread(run, args, down) == EX_TEMPFAIL
    assert len(rec.calls) == 1


async def test_act_runs_as_the_module_the_backend_calls(control: tuple[str, Recorder]) -> None:
    url, rec = control
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "demo.act",
        "migrate",
        "--kind",
        "gpu",
        "--node",
        "n",
        "--uuid",
        "GPU-1",
        env={URL_ENV: url, TOKEN_ENV: TOKEN, "PATH": "/usr/bin:/bin"},
        stdout=asyncio.subprocess.PIPE,
    )
    out, _ = await proc.communicate()
    assert proc.returncode == 0
    assert rec.calls == [ActionRequest("migrate", "gpu", "n", "", "", "GPU-1")]
    assert b"migrate /" in out


async def test_act_run_as_a_module_tells_a_refusal(control: tuple[str, Recorder]) -> None:
    # as the local backend runs it: every helper must be defined before the module's main runs
    url, rec = control
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "demo.act",
        "migrate",
        "--kind",
        "pod",
        "--pod",
        "missing",
        env={URL_ENV: url, TOKEN_ENV: TOKEN, "PATH": "/usr/bin:/bin"},
        stderr=asyncio.subprocess.PIPE,
    )
    _, err = await proc.communicate()
    assert proc.returncode == 1, err.decode()
    assert err.decode().startswith("demo.act: migrate refused: no pod"), err.decode()
    assert rec.calls == []


async def test_act_sends_a_job_targets_owner(control: tuple[str, Recorder]) -> None:
    url, rec = control
    env = {URL_ENV: url, TOKEN_ENV: TOKEN}
    job = ["--kind", "job", "--namespace", "research", "--training-job-kind", "PyTorchJob.kubeflow.org"]
    assert await asyncio.to_thread(run, ["restart", *job, "--training-job", "t"], env) == 0
    assert rec.calls == [
        ActionRequest("restart", "job", "", "research", "", "", "PyTorchJob.kubeflow.org", "t")
    ]
    # a job the world lacks (422) and one without its name (400) cannot be done: exit 1, no retry
    assert await asyncio.to_thread(run, ["restart", *job, "--training-job", "missing"], env) == 1
    assert await asyncio.to_thread(run, ["restart", *job], env) == 1
    assert len(rec.calls) == 1


async def test_a_refusal_is_told_in_the_worlds_own_words(
    control: tuple[str, Recorder], capsys: pytest.CaptureFixture[str]
) -> None:
    # the ledger, the escalation and the page all quote this line: no status code, no raw JSON
    url, _ = control
    env = {URL_ENV: url, TOKEN_ENV: TOKEN}
    assert await asyncio.to_thread(run, ["migrate", "--kind", "pod", "--pod", "missing"], env) == 1
    line = capsys.readouterr().err.strip()
    assert line.startswith("demo.act: migrate refused: no pod")
    assert "HTTP" not in line and "{" not in line
