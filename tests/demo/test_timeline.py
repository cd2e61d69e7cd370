"""Timeline lines for alert transitions and ledger entries."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import pytest

from demo.binaries import MissingBinaryError, ensure_binaries, find_binaries
from demo.neighbours import CURRENT, DEBIAN, line
from demo.timeline import AlertWatcher, LedgerWatcher, Timeline, describe_alert, describe_entry


def _timeline() -> tuple[Timeline, io.StringIO]:
    out = io.StringIO()
    return Timeline(out=out), out


def _alert(state: str, **labels: str) -> dict[str, Any]:
    return {"labels": {"alertname": "GPUXidResetRequired", "severity": "critical", **labels}, "state": state}


def test_alert_transitions_are_printed_once_each() -> None:
    tl, out = _timeline()
    w = AlertWatcher("http://unused", tl)
    w.update([_alert("pending", gpu="2")])
    w.update([_alert("pending", gpu="2")])
    w.update([_alert("firing", gpu="2")])
    w.update([])
    lines = [line.split(None, 2)[2] for line in out.getvalue().splitlines()]
    assert lines == [
        "pending  GPUXidResetRequired gpu=2 [critical]",
        "firing   GPUXidResetRequired gpu=2 [critical]",
        "resolved GPUXidResetRequired gpu=2 [critical]",
    ]
    assert [a["gpu"] for a in w.fired] == ["2"]


def test_ledger_entries_are_printed_once_and_actions_when_finished() -> None:
    tl, out = _timeline()
    w = LedgerWatcher("http://unused", "t", tl)
    inc: dict[str, Any] = {
        "id": 1,
        "signature": "gpu-memory-leak",
        "target_kind": "pod",
        "target_namespace": "serving",
        "target_pod": "chat-0",
        "history": [
            {"kind": "event", "status": "opened", "summary": "matched"},
            {"kind": "action", "rung": "restart", "status": "started", "summary": "restart"},
        ],
    }
    w.apply(inc)
    inc["history"][1] = {"kind": "action", "rung": "restart", "status": "success", "summary": "done"}
    w.apply(inc)
    w.apply(inc)
    text = out.getvalue()
    assert text.count("opened") == 1
    assert text.count("restart success") == 1 and "started" not in text


def test_a_job_is_shown_by_its_name() -> None:
    labels = {"alertname": "TrainingJobHung", "namespace": "research", "training_job": "llama-train"}
    assert describe_alert(labels) == "TrainingJobHung namespace=research training_job=llama-train []"
    inc = {"id": 4, "signature": "training-job-hung", "target_kind": "job", "target_namespace": "research"}
    entry = {"kind": "action", "rung": "restart", "status": "success", "summary": "ok"}
    assert describe_entry({**inc, "target_training_job": "llama-train"}, entry) == (
        "#4 training-job-hung job research/llama-train: restart success - ok"
    )


def test_missing_servers_give_a_clear_message(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("demo.binaries.find_binaries", lambda: None)
    with pytest.raises(MissingBinaryError, match="apt-get install prometheus prometheus-alertmanager"):
        ensure_binaries(install=False, say=lambda _t: None, line_name=DEBIAN)


def test_an_unbuilt_current_line_names_setup_and_the_debian_line(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("GPUPULSE_NEIGHBOURS", str(tmp_path / "empty"))
    with pytest.raises(MissingBinaryError, match=r"scripts/setup.*--neighbours 2\.42"):
        ensure_binaries(install=False, say=lambda _t: None)


def test_the_demo_runs_the_current_line_by_default() -> None:
    found = ensure_binaries(install=False, say=lambda _t: None)
    assert found.prometheus == str(line(CURRENT).prometheus)
    assert found.alertmanager == str(line(CURRENT).alertmanager)


def test_binaries_are_found_under_their_debian_names(tmp_path: Path) -> None:
    for name in ("prometheus", "prometheus-alertmanager", "promtool", "amtool"):
        (tmp_path / name).write_text("#!/bin/sh\n")
        (tmp_path / name).chmod(0o755)
    found = find_binaries(tmp_path)
    assert found is not None and found.alertmanager == str(tmp_path / "prometheus-alertmanager")
    (tmp_path / "prometheus").unlink()
    assert find_binaries(tmp_path) is None


def test_once_the_ladder_played_the_timeline_says_what_happens_next() -> None:
    from demo.cli import parse_args, played_line

    assert played_line(parse_args(["--duration", "120", "--stop-when-verified"])).endswith("stopping early")
    assert played_line(parse_args(["--duration", "90"])).endswith("keeps running until the 90 s are up")
    assert played_line(parse_args([])).endswith("keeps running until Ctrl-C")
