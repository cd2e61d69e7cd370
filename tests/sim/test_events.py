"""XID events through the event-set API, on the scenario clock."""

from __future__ import annotations

import threading
import time

import pynvml as N
import pytest

from exporter.sim import ManualClock
from tests.sim.helpers import Installer, handles


def _event_set(hs: list[object]) -> object:
    es = N.nvmlEventSetCreate()
    for h in hs:
        mask = N.nvmlDeviceGetSupportedEventTypes(h) & N.nvmlEventTypeXidCriticalError
        N.nvmlDeviceRegisterEvents(h, mask, es)
    return es


def test_xids_are_delivered_in_order_at_their_time(sim: Installer, clock: ManualClock) -> None:
    sim("faults")
    hs = handles()
    es = _event_set(hs)
    with pytest.raises(N.NVMLError_Timeout):
        N.nvmlEventSetWait_v2(es, 0)
    clock.set(15.7)
    got = []
    for _ in range(2):
        ev = N.nvmlEventSetWait_v2(es, 0)
        got.append((N.nvmlDeviceGetIndex(ev.device), ev.eventType, ev.eventData, ev.gpuInstanceId))
    assert got == [
        (0, N.nvmlEventTypeXidCriticalError, 13, 0xFFFFFFFF),
        (0, N.nvmlEventTypeXidCriticalError, 31, 0xFFFFFFFF),
    ]
    with pytest.raises(N.NVMLError_Timeout):
        N.nvmlEventSetWait_v2(es, 10)  # XID 48 is due at t=16
    clock.set(30)
    assert N.nvmlEventSetWait_v2(es, 0).eventData == 48
    ev = N.nvmlEventSetWait_v2(es, 0)  # GPU 1 fell off the bus at t=20
    assert ev.eventData == 79
    with pytest.raises(N.NVMLError_GpuIsLost):
        N.nvmlDeviceGetIndex(ev.device)
    with pytest.raises(N.NVMLError_Timeout):
        N.nvmlEventSetWait_v2(es, 0)
    N.nvmlEventSetFree(es)


def test_events_before_registration_are_not_recorded(sim: Installer, clock: ManualClock) -> None:
    sim("faults")
    clock.set(15.6)
    es = _event_set(handles())
    clock.set(16)
    assert N.nvmlEventSetWait_v2(es, 0).eventData == 48


def test_count_repeats_an_event(sim: Installer, clock: ManualClock) -> None:
    sim({"gpus": [{"model": "H100"}], "events": [{"at": 1, "gpu": 0, "xid": 94, "count": 3}]})
    es = _event_set(handles())
    clock.set(1)
    assert [N.nvmlEventSetWait_v2(es, 0).eventData for _ in range(3)] == [94, 94, 94]
    with pytest.raises(N.NVMLError_Timeout):
        N.nvmlEventSetWait_v2(es, 0)


def test_a_blocked_wait_wakes_when_the_clock_reaches_the_event(sim: Installer, clock: ManualClock) -> None:
    sim("faults")
    es = _event_set(handles())
    clock.set(14)
    got: list[int] = []
    waiting = threading.Event()

    def waiter() -> None:
        waiting.set()
        got.append(N.nvmlEventSetWait_v2(es, 30_000).eventData)

    thread = threading.Thread(target=waiter, daemon=True)
    thread.start()
    assert waiting.wait(5)
    thread.join(0.2)
    assert thread.is_alive()  # nothing due yet
    started = time.monotonic()
    clock.set(15)
    thread.join(5)
    assert not thread.is_alive() and got == [13]
    assert time.monotonic() - started < 5


def test_wait_times_out_in_real_time(sim: Installer) -> None:
    sim("basic")
    es = _event_set(handles())
    started = time.monotonic()
    with pytest.raises(N.NVMLError_Timeout):
        N.nvmlEventSetWait_v2(es, 150)
    assert 0.14 <= time.monotonic() - started < 2.0


def test_uninstall_releases_a_blocked_wait(sim: Installer) -> None:
    nv = sim("basic")
    es = _event_set(handles())
    errors: list[BaseException] = []

    def waiter() -> None:
        try:
            N.nvmlEventSetWait_v2(es, 60_000)
        except N.NVMLError as exc:
            errors.append(exc)

    thread = threading.Thread(target=waiter, daemon=True)
    thread.start()
    thread.join(0.2)
    assert thread.is_alive()
    nv.uninstall()
    thread.join(5)
    assert not thread.is_alive()
    assert len(errors) == 1


def test_an_xid_repeats_until_its_process_exits(sim: Installer, clock: ManualClock) -> None:
    sim(
        {
            "duration_seconds": 60,
            "gpus": [{"model": "H100"}],
            "processes": [{"pid": 500, "gpu": 0, "end": 12}],
            "events": [{"at": 2, "gpu": 0, "xid": 43, "repeat_seconds": 4, "until_process_exits": 500}],
        }
    )
    es = _event_set(handles())
    clock.set(30)
    got = []
    with pytest.raises(N.NVMLError_Timeout):
        while True:
            got.append(N.nvmlEventSetWait_v2(es, 0).eventData)
    assert got == [43, 43, 43]  # at 2, 6 and 10; at 14 the process had ended at 12


def test_a_restart_stops_the_xid_its_process_caused(sim: Installer, clock: ManualClock) -> None:
    from exporter.sim.interventions import restart_process

    nv = sim(
        {
            "duration_seconds": 60,
            "gpus": [{"model": "H100"}],
            "processes": [{"pid": 500, "gpu": 0}],
            "events": [{"at": 1, "gpu": 0, "xid": 13, "repeat_seconds": 2, "until_process_exits": 500}],
        }
    )
    es = _event_set(handles())
    clock.set(5)
    assert [N.nvmlEventSetWait_v2(es, 0).eventData for _ in range(3)] == [13, 13, 13]  # 1, 3, 5
    restart_process(nv, 500, 501)  # the controller restarted the pod
    clock.set(20)
    with pytest.raises(N.NVMLError_Timeout):
        N.nvmlEventSetWait_v2(es, 0)
