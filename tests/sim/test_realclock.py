"""With a RealClock, hangs and event waits follow real time scaled by the clock's speed."""

from __future__ import annotations

import threading
import time

import pynvml as N
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from exporter.sim import ManualClock, RealClock, install, load_scenario
from exporter.sim.__main__ import main
from exporter.sim.scenario import parse_scenario

FAST = parse_scenario(
    {
        "gpus": [{"model": "H100"}],
        "events": [{"at": 5, "gpu": 0, "xid": 43}],
        "faults": [{"gpu": 0, "call": "nvmlDeviceGetPowerUsage", "kind": "hang", "until": 10}],
    }
)


def test_hang_ends_in_real_time_at_the_clock_speed() -> None:
    with install(FAST, RealClock(speed=100.0)) as nv:  # 10 scenario seconds = 0.1 s real
        N.nvmlInit()
        h = N.nvmlDeviceGetHandleByIndex(0)
        started = time.monotonic()
        assert N.nvmlDeviceGetPowerUsage(h) > 0
        assert nv.clock.monotonic() >= 10.0  # it answered only once the hang window had passed
        assert time.monotonic() - started < 3.0


def test_event_wait_returns_when_the_event_falls_due() -> None:
    with install(FAST, RealClock(speed=100.0)) as nv:
        N.nvmlInit()
        es = N.nvmlEventSetCreate()
        N.nvmlDeviceRegisterEvents(N.nvmlDeviceGetHandleByIndex(0), N.nvmlEventTypeXidCriticalError, es)
        started = time.monotonic()
        assert N.nvmlEventSetWait_v2(es, 10_000).eventData == 43
        assert nv.clock.monotonic() >= 5.0
        assert time.monotonic() - started < 3.0  # woke when due, not at the 10 s timeout
        N.nvmlEventSetFree(es)


def test_default_clock_is_real() -> None:
    with install(load_scenario("basic")) as nv:
        assert isinstance(nv.clock, RealClock)
        assert 0 <= nv.clock.monotonic() < 5


@settings(max_examples=40, deadline=None)
@given(st.lists(st.floats(0, 900), min_size=1, max_size=6))
def test_memory_invariant_holds_at_any_time(times: list[float]) -> None:
    clock = ManualClock()
    with install(load_scenario("mig"), clock):
        N.nvmlInit()
        hs = [N.nvmlDeviceGetHandleByIndex(i) for i in range(2)]
        migs = [N.nvmlDeviceGetMigDeviceHandleByIndex(hs[1], j) for j in range(4)]
        for t in sorted(times):
            clock.set(t)
            for h in hs + migs:
                m = N.nvmlDeviceGetMemoryInfo(h, version=N.nvmlMemory_v2)
                assert m.total == m.reserved + m.free + m.used and m.free >= 0


def test_manual_clock_wakes_listeners_from_another_thread() -> None:
    clock = ManualClock()
    woke = threading.Event()
    clock.add_listener(woke.set)
    threading.Thread(target=clock.advance, args=(1.0,)).start()
    assert woke.wait(5)
    assert clock.monotonic() == 1.0


def test_clocks_refuse_nonsense() -> None:
    clock = ManualClock(10.0)
    with pytest.raises(ValueError, match="backwards"):
        clock.set(5.0)
    with pytest.raises(ValueError, match="backwards"):
        clock.advance(-1.0)
    with pytest.raises(ValueError, match="speed"):
        RealClock(0.0)


def test_cli_validates_scenarios(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["basic", "faults"]) == 0
    assert "basic: 2 GPU(s) [H100-SXM5-80GB], 3 process(es)" in capsys.readouterr().out
    assert main(["/nonexistent/scenario.yaml"]) == 1
    assert "cannot read file" in capsys.readouterr().err
