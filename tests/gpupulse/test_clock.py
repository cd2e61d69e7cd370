"""The one clock protocol: the real clock, the scenario clocks and the test fake all speak it."""

from __future__ import annotations

import asyncio
import threading
import time
from datetime import UTC

import pytest

from exporter.sim.clock import ManualClock, RealClock
from gpupulse.clock import Clock, SystemClock
from tests.fakes.clock import FakeClock


@pytest.mark.parametrize("make", [SystemClock, ManualClock, RealClock, FakeClock])
def test_every_clock_has_the_whole_protocol(make: type[Clock]) -> None:
    clock = make()
    for method in ("time", "monotonic", "utcnow", "sleep"):
        assert callable(getattr(clock, method))
    assert clock.utcnow().tzinfo is UTC
    assert abs(clock.utcnow().timestamp() - clock.time()) < 1.0


def test_system_clock_reads_the_machine() -> None:
    clock = SystemClock()
    assert abs(clock.time() - time.time()) < 1.0
    assert abs(clock.monotonic() - time.monotonic()) < 1.0


async def test_manual_clock_sleep_returns_only_once_the_clock_is_moved_far_enough() -> None:
    clock = ManualClock(start=10.0, start_unix=1_800_000_000.0)
    sleeper = asyncio.create_task(clock.sleep(5.0))
    await asyncio.sleep(0)
    clock.advance(4.0)
    await asyncio.sleep(0)
    await asyncio.sleep(0)
    assert not sleeper.done()
    # a move from another thread (the simulator's threads move it too) wakes the sleeper
    mover = threading.Thread(target=clock.advance, args=(1.0,))
    mover.start()
    mover.join()
    await asyncio.wait_for(sleeper, 5)
    assert clock.monotonic() == 15.0
    assert clock.time() == 1_800_000_005.0  # wall time moves with scenario time


async def test_manual_clock_sleep_of_nothing_returns_at_once() -> None:
    clock = ManualClock()
    await asyncio.wait_for(clock.sleep(0), 1)
    await asyncio.wait_for(clock.sleep(-1), 1)


async def test_fake_clock_sleep_moves_time_and_records_it() -> None:
    clock = FakeClock(start=100.0, monotonic_start=5.0)
    await clock.sleep(2.5)
    assert (clock.time(), clock.monotonic(), clock.sleeps) == (102.5, 7.5, [2.5])
    with pytest.raises(ValueError):
        clock.advance(-1)
