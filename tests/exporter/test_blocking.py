"""ItemReader: a blocking read that hangs costs only its item; the others are read, the hung one is set
aside until it returns, and threads stay bounded."""

from __future__ import annotations

import asyncio
import threading

from exporter.collectors.blocking import ItemReader


async def test_a_hung_item_is_set_aside_and_the_rest_read_in_the_same_round() -> None:
    release = threading.Event()
    calls: list[str] = []

    def read(key: str) -> str:
        calls.append(key)
        if key == "b":
            release.wait()
        if key == "c":
            raise OSError("gone")
        return key.upper()

    reader: ItemReader[str, str] = ItemReader("test", max_stuck=2)
    try:
        got = await reader.read(["a", "b", "c", "d"], read, timeout_seconds=5.0, item_timeout_seconds=0.1)
        assert got.values == {"a": "A", "d": "D"}
        assert isinstance(got.errors["c"], OSError)
        assert got.unread == {"b"}
        assert reader.stuck == frozenset({"b"})
        again = await reader.read(["a", "b"], read, timeout_seconds=5.0, item_timeout_seconds=0.1)
        assert again.values == {"a": "A"} and again.unread == {"b"}
        assert calls.count("b") == 1  # not started again while out
        release.set()
        for _ in range(100):
            if not reader.stuck:
                break
            await asyncio.sleep(0.01)
        assert not reader.stuck
        last = await reader.read(["b"], read, timeout_seconds=5.0)
        assert last.values == {"b": "B"}
    finally:
        release.set()
        reader.close()


async def test_the_round_deadline_bounds_all_items_together() -> None:
    release = threading.Event()

    def read(key: int) -> int:
        release.wait(timeout=0.05)  # each item is slowish, none hangs
        return key

    reader: ItemReader[int, int] = ItemReader("test")
    try:
        got = await reader.read(list(range(100)), read, timeout_seconds=0.3)
        assert 0 < len(got.values) < 100
        assert got.unread == set(range(100)) - set(got.values)
    finally:
        release.set()
        reader.close()


async def test_threads_stay_bounded_when_every_read_hangs() -> None:
    release = threading.Event()
    started: list[int] = []

    def read(key: int) -> int:
        started.append(key)
        release.wait()
        return key

    reader: ItemReader[int, int] = ItemReader("test", max_stuck=2)
    try:
        for _ in range(5):
            await reader.read(list(range(10)), read, timeout_seconds=1.0, item_timeout_seconds=0.05)
        assert len(started) == 2  # two hung reads fill the spare threads; nothing more is started
        assert len(reader.stuck) == 2
    finally:
        release.set()
        reader.close()
