"""A tick's GPU batches run in a row on one RoundRunner thread; a GPU that hangs inside its batch holds
that thread alone, the GPUs after it start on their own threads, and the next tick gets a fresh runner."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import yaml

from exporter.config import ExporterSettings
from exporter.nvml import RoundRunner
from tests.exporter.harness import simulated_exporter

UUIDS = [f"GPU-00000000-0000-4000-8000-00000000000{i}" for i in range(3)]


def _until(condition: object, what: str, timeout_seconds: float = 30.0) -> None:
    """Wait for a thread to get somewhere (the bound only turns a hang into a failure)."""
    deadline = time.monotonic() + timeout_seconds
    while not condition():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise AssertionError(what)
        time.sleep(0.001)


def test_runner_refuses_a_round_while_every_thread_is_busy_and_reuses_one_that_returned() -> None:
    runner = RoundRunner("test-round", max_threads=1)
    release, ran = threading.Event(), []
    try:
        assert runner.submit(release.wait)  # a round stuck in a call
        assert not runner.submit(lambda: ran.append("refused"))  # no thread left: the caller fans out
        release.set()
        _until(lambda: runner.idle == 1, "the thread did not come back")
        done = threading.Event()
        assert runner.submit(lambda: (ran.append("second"), done.set()))
        assert done.wait(30)
        assert ran == ["second"] and runner.threads == 1  # the same thread ran it
    finally:
        release.set()
        runner.stop()
        assert runner.join(5)


def test_a_round_that_fails_leaves_its_thread_running_the_next() -> None:
    runner = RoundRunner("test-round", max_threads=1)
    done = threading.Event()
    try:

        def broken() -> None:
            raise RuntimeError("a bug in a round")

        assert runner.submit(broken)
        _until(lambda: runner.idle == 1, "the thread did not survive the failed round")
        assert runner.submit(done.set)
        assert done.wait(30) and runner.threads == 1
    finally:
        runner.stop()
        assert runner.join(5)


def test_a_round_that_released_its_thread_gets_the_next_round_on_it() -> None:
    # The loop woken by a round's hand-back may submit the next round before the runner thread is
    # back on its queue (the loop preempts it on its CPU): released, the thread takes that round.
    runner = RoundRunner("test-round", max_threads=4)
    released, go_on, done, ran = threading.Event(), threading.Event(), threading.Event(), []

    def first() -> None:
        runner.release()  # its GPU calls are done
        runner.release()  # once per round: a second call counts nothing
        released.set()
        go_on.wait(30)  # still handing back
        ran.append("first")

    try:
        runner.release()  # not a runner thread: nothing
        assert runner.idle == 0
        assert runner.submit(first)
        assert released.wait(30)
        assert runner.submit(lambda: (ran.append("second"), done.set()))
        assert runner.threads == 1  # queued for the released thread, not a new one
        go_on.set()
        assert done.wait(30)
        assert ran == ["first", "second"]
        _until(lambda: runner.idle == 1, "the thread did not come back")
        assert runner.threads == 1
    finally:
        go_on.set()
        runner.stop()
        assert runner.join(5)


async def test_back_to_back_ticks_keep_one_runner_thread(tmp_path: Path) -> None:
    scenario = {"name": "eight", "gpus": [{"model": "H100"} for _ in range(8)]}
    path = tmp_path / "scenario.yaml"
    path.write_text(yaml.safe_dump(scenario))
    # a deadline that only bounds a hang: no round here ends by it
    settings = ExporterSettings(sampling_interval_seconds=1.0, gpu_call_timeout_seconds=30.0)
    async with simulated_exporter(path, start_seconds=1.0, settings=settings) as h:
        for _ in range(50):  # each tick submits its round as soon as the last one handed back
            await h.tick(1.0)
        assert h.fleet._runner.threads == 1


async def test_gpus_hung_in_a_round_hold_only_their_threads(tmp_path: Path) -> None:
    # GPUs 0 and 1 hang inside their batches at t = 3; GPU 2, last in the row, is read on every tick
    scenario = {
        "name": "hung-in-a-row",
        "duration_seconds": 120,
        "gpus": [{"model": "H100", "uuid": u} for u in UUIDS],
        "faults": [
            {"gpu": g, "call": "nvmlDeviceGetPowerUsage", "kind": "hang", "from": 3, "until": 100}
            for g in (0, 1)
        ],
    }
    path = tmp_path / "scenario.yaml"
    path.write_text(yaml.safe_dump(scenario))
    async with simulated_exporter(path, start_seconds=1.0) as h:
        await h.tick(0)
        assert h.fleet._runner.threads == 1
        for _ in range(3):
            await h.tick(1.0)
            text = h.text()
            assert f'gpu_up{{gpu="2",uuid="{UUIDS[2]}"}} 1.0' in text
            assert f'gpu_temperature_celsius{{gpu="2",uuid="{UUIDS[2]}"}}' in text
        assert [s.worker.stuck for s in h.fleet.slots] == [True, True, False]
        # GPU 0 hung on the runner thread (or on its own, had the fan-out come first), GPU 1 on its
        # own; the later ticks, which skip both, needed one more runner thread at most, not one each
        assert h.fleet._runner.threads <= 2
        h.clock.advance(100.0)  # the hangs end
        await h.returned(0)
        await h.returned(1)
        await h.tick(0)
        assert all(f'gpu_up{{gpu="{i}",uuid="{u}"}} 1.0' in h.text() for i, u in enumerate(UUIDS))
