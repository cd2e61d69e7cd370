"""Local backend (real commands, safe argv, exit-code convention, signals) and pagers (to a real sink)."""

from __future__ import annotations

import asyncio
import json
import signal
import sys
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from remediation.backends.local import LocalBackend
from remediation.backends.pager import PagerDutyPager, SlackPager, WebhookPager, pager_from_settings
from remediation.errors import PagerError, PermanentError, TemporaryError
from remediation.model import Page, Target
from remediation.settings import EnginePagerSettings, LocalBackendSettings
from tests.fakes.pager_sink import PagerSink

HOSTILE = Target(
    kind="pod", node="node-a", namespace="llm", pod="x; rm -rf / $(reboot) `id` --force", uuid="GPU-1"
)

RECORD_ARGV = (
    "import json, os, sys; "
    "env = {k: v for k, v in os.environ.items() if k.startswith('GPUPULSE_')}; "
    "json.dump({'argv': sys.argv[1:], 'env': env}, open(os.environ['OUT'], 'w'))"
)


@pytest.mark.integration
async def test_local_backend_runs_real_command_with_safe_argv(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "argv.json"
    monkeypatch.setenv("OUT", str(out))
    backend = LocalBackend(
        LocalBackendSettings(
            restart_command=(sys.executable, "-c", RECORD_ARGV, "--pod={pod}", "{namespace}/{pod}")
        )
    )
    result = await backend.restart(HOSTILE, "leak")
    assert result.done and result.details["exit_code"] == 0
    seen = json.loads(out.read_text())
    # each placeholder stays inside its own argv element: no splitting, no shell
    assert seen["argv"] == [f"--pod={HOSTILE.pod}", f"llm/{HOSTILE.pod}"]
    assert seen["env"]["GPUPULSE_TARGET_POD"] == HOSTILE.pod
    assert seen["env"]["GPUPULSE_RUNG"] == "restart"
    assert seen["env"]["GPUPULSE_REASON"] == "leak"


@pytest.mark.integration
async def test_local_backend_passes_a_job_targets_owner(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "argv.json"
    monkeypatch.setenv("OUT", str(out))
    job = Target(
        kind="job", namespace="research", training_job_kind="PyTorchJob.kubeflow.org", training_job="llama"
    )
    template = (sys.executable, "-c", RECORD_ARGV, "{kind}", "{training_job_kind}", "{training_job}")
    await LocalBackend(LocalBackendSettings(restart_command=template)).restart(job, "hang")
    seen = json.loads(out.read_text())
    assert seen["argv"] == ["job", "PyTorchJob.kubeflow.org", "llama"]
    assert seen["env"]["GPUPULSE_TARGET_TRAINING_JOB_KIND"] == "PyTorchJob.kubeflow.org"
    assert seen["env"]["GPUPULSE_TARGET_TRAINING_JOB"] == "llama"


@pytest.mark.integration
async def test_local_backend_exit_code_convention(tmp_path: Path) -> None:
    def backend(code: int) -> LocalBackend:
        script = f"import sys; print('boom'); sys.exit({code})"
        return LocalBackend(LocalBackendSettings(migrate_command=(sys.executable, "-c", script)))

    with pytest.raises(TemporaryError, match="exited 75: boom"):
        await backend(75).migrate(HOSTILE, "r")
    with pytest.raises(PermanentError, match="exited 3: boom"):
        await backend(3).migrate(HOSTILE, "r")
    with pytest.raises(PermanentError, match="no restart command"):
        await backend(0).restart(HOSTILE, "r")
    with pytest.raises(PermanentError, match="cannot run"):
        await LocalBackend(LocalBackendSettings(migrate_command=(str(tmp_path / "nope"),))).migrate(
            HOSTILE, "r"
        )


@pytest.mark.integration
async def test_local_backend_timeout_kills_and_is_temporary() -> None:
    slow = LocalBackend(
        LocalBackendSettings(
            restart_command=(sys.executable, "-c", "import time; time.sleep(30)"), timeout_seconds=0.3
        )
    )
    with pytest.raises(TemporaryError, match="timed out"):
        await slow.restart(HOSTILE, "r")


@pytest.mark.integration
async def test_local_backend_signals_pid_from_pidfile(tmp_path: Path) -> None:
    proc = await asyncio.create_subprocess_exec(sys.executable, "-c", "import time; time.sleep(60)")
    try:
        (tmp_path / "vllm-0.pid").write_text(f"{proc.pid}\n")
        backend = LocalBackend(LocalBackendSettings(pidfile=tmp_path / "{pod}.pid", restart_signal="SIGTERM"))
        result = await backend.restart(Target(kind="pod", namespace="llm", pod="vllm-0"), "leak")
        assert result.details["pid"] == proc.pid
        assert await asyncio.wait_for(proc.wait(), 10) == -signal.SIGTERM
        with pytest.raises(PermanentError, match="gone"):
            await backend.restart(Target(kind="pod", namespace="llm", pod="vllm-0"), "leak")
        # a label value with path characters never reaches the path
        with pytest.raises(PermanentError, match="cannot read a PID"):
            await backend.restart(Target(kind="pod", pod="../../etc/passwd"), "r")
    finally:
        if proc.returncode is None:
            proc.kill()
            await proc.wait()


# ------------------------------------------------------------------------------------------ pagers


@pytest.fixture
async def sink() -> AsyncIterator[PagerSink]:
    s = PagerSink()
    await s.start()
    yield s
    await s.stop()


def _page(resolved: bool = False) -> Page:
    return Page(
        dedup_key="gpupulse-incident-7",
        summary="GPU memory above hard limit on pod:llm/vllm-0: restart did not hold",
        severity="critical",
        fault_class="memory_leak",
        signature="gpu-memory-leak",
        runbook_url="https://runbooks.example/memory_leak.md",
        target=Target(kind="pod", node="n1", namespace="llm", pod="vllm-0", uuid="GPU-1"),
        history=[
            {"kind": "action", "rung": "restart", "status": "success", "summary": "restart done"},
            {"kind": "event", "rung": "", "status": "recurred", "summary": "fault recurred"},
        ],
        resolved=resolved,
    )


async def test_webhook_pager_posts_page_json(sink: PagerSink) -> None:
    await WebhookPager(sink.url + "/hook", 5, 0, 0).send(_page())
    (got,) = await sink.wait_for(1)
    assert got.path == "/hook"
    assert got.body["dedup_key"] == "gpupulse-incident-7"
    assert got.body["status"] == "firing"
    assert got.body["signature"] == "gpu-memory-leak"
    assert got.body["target"]["pod"] == "vllm-0"
    assert [h["status"] for h in got.body["history"]] == ["success", "recurred"]


async def test_pagerduty_events_v2_trigger_and_resolve(sink: PagerSink) -> None:
    pd = PagerDutyPager("R0UTING", "gpupulse-test", sink.url + "/v2/enqueue", 5, 0, 0)
    await pd.send(_page())
    await pd.send(_page(resolved=True))
    trigger, resolve = (r.body for r in await sink.wait_for(2))
    assert trigger["routing_key"] == "R0UTING"
    assert trigger["event_action"] == "trigger"
    assert trigger["dedup_key"] == resolve["dedup_key"] == "gpupulse-incident-7"
    payload = trigger["payload"]
    assert payload["severity"] == "critical"
    assert payload["source"] == "gpupulse-test"
    assert payload["summary"].startswith("GPU memory above hard limit")
    details = payload["custom_details"]
    assert details["signature"] == "gpu-memory-leak"
    assert details["runbook_url"] == "https://runbooks.example/memory_leak.md"
    assert [h["rung"] for h in details["ladder_history"]] == ["restart", ""]
    assert trigger["links"][0]["href"] == "https://runbooks.example/memory_leak.md"
    assert resolve == {
        "routing_key": "R0UTING",
        "event_action": "resolve",
        "dedup_key": "gpupulse-incident-7",
    }


async def test_slack_pager_sends_text_and_blocks(sink: PagerSink) -> None:
    await SlackPager(sink.url + "/services/T/B/X", 5, 0, 0).send(_page())
    (got,) = await sink.wait_for(1)
    assert got.body["text"].startswith("[CRITICAL] GPU memory above hard limit")
    types = [b["type"] for b in got.body["blocks"]]
    assert types[:3] == ["header", "section", "section"]
    fields = json.dumps(got.body["blocks"][2])
    assert "gpu-memory-leak" in fields and "runbooks.example" in fields
    assert "restart success" in json.dumps(got.body["blocks"][3])


async def test_pager_retries_5xx_then_delivers(sink: PagerSink) -> None:
    sink.fail_next(2, 503)
    await WebhookPager(sink.url, 5, 3, 0.01).send(_page())
    assert [r.status for r in sink.received] == [503, 503, 202]


async def test_pager_gives_up_on_4xx_without_retry(sink: PagerSink) -> None:
    sink.fail_next(1, 400)
    with pytest.raises(PagerError, match="HTTP 400"):
        await WebhookPager(sink.url, 5, 3, 0.01).send(_page())
    assert len(sink.received) == 1


async def test_pager_reports_unreachable_after_retries() -> None:
    with pytest.raises(PagerError, match="after 2 attempts"):
        await WebhookPager("http://127.0.0.1:9/", 1, 1, 0.01).send(_page())


def test_pager_from_settings() -> None:
    assert pager_from_settings(EnginePagerSettings()) is None
    built = pager_from_settings(EnginePagerSettings(kind="pagerduty", pagerduty_routing_key="k"))
    assert isinstance(built, PagerDutyPager)
    assert isinstance(pager_from_settings(EnginePagerSettings(kind="slack", url="http://x")), SlackPager)


@pytest.mark.parametrize(
    ("argv", "name"),
    [
        (["/work/.venv/bin/python3", "-m", "demo.act", "restart"], "demo.act"),
        (["/usr/local/bin/restart-model", "a"], "restart-model"),
        (["python", "script.py"], "python"),
    ],
)
def test_a_failed_command_is_named_without_its_interpreters_path(argv: list[str], name: str) -> None:
    from remediation.backends.local import command_name

    assert command_name(argv) == name


async def test_a_failing_module_command_is_reported_by_its_module_name() -> None:
    backend = LocalBackend(
        LocalBackendSettings(restart_command=(sys.executable, "-m", "json.tool", "/nonexistent/file"))
    )
    with pytest.raises(PermanentError) as failed:
        await backend.restart(Target("pod", namespace="ns", pod="p"), "test")
    assert str(failed.value).startswith("json.tool exited 2:")
    assert sys.executable not in str(failed.value)
