"""Blocking reads of many items (PIDs, files, endpoints' /proc entries) under one deadline, where
an item whose read hangs costs only itself.

A read in a thread cannot be cancelled. ItemReader runs the items of one round one after another on
a worker thread; when the round's deadline passes, the results so far are used, the item the worker
is stuck in is set aside (skipped by later rounds until its read returns), and the next round starts
a fresh worker for the other items. Threads are bounded: at most `max_stuck` hung reads plus one
worker; past that, rounds read nothing until a hung read returns.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Hashable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Generic, TypeVar

log = logging.getLogger(__name__)

K = TypeVar("K", bound=Hashable)
T = TypeVar("T")


@dataclass
class ReadResult(Generic[K, T]):
    """What one round read: values, per-item errors, and the items it could not read in time."""

    values: dict[K, T] = field(default_factory=dict)
    errors: dict[K, Exception] = field(default_factory=dict)
    unread: set[K] = field(default_factory=set)  # late this round, or set aside as hung


class ItemReader(Generic[K, T]):
    """Reads items on one worker thread per round; a hung item is set aside, the rest go on."""

    def __init__(self, name: str, max_stuck: int = 4) -> None:
        self.name = name
        self.max_stuck = max_stuck
        self._executor = ThreadPoolExecutor(max_workers=max_stuck + 1, thread_name_prefix=name)
        self._stuck: dict[K, asyncio.Future[None]] = {}
        self._generation = 0

    @property
    def stuck(self) -> frozenset[K]:
        """Items whose read has not returned since a deadline passed."""
        return frozenset(self._stuck)

    async def read(
        self,
        keys: Sequence[K],
        fn: Callable[[K], T],
        timeout_seconds: float,
        item_timeout_seconds: float | None = None,
    ) -> ReadResult[K, T]:
        """fn(key) for every key not set aside, in order, until done or the round's deadline.

        With `item_timeout_seconds`, an item that takes longer is set aside at once and a fresh worker
        goes on with the items after it in the same round, so one hung read does not leave the others
        unread until the next round.
        """
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_seconds
        out: ReadResult[K, T] = ReadResult(unread={k for k in keys if k in self._stuck})
        todo = [k for k in keys if k not in self._stuck]
        while todo:
            if len(self._stuck) >= self.max_stuck:
                break  # every spare thread hangs in a read: wait for one to return
            done = await self._run_worker(todo, fn, deadline, item_timeout_seconds, out)
            todo = [k for k in todo if k not in done and k not in self._stuck]
            if loop.time() >= deadline:
                break
        out.unread.update(k for k in keys if k not in out.values and k not in out.errors)
        return out

    async def _run_worker(
        self,
        todo: list[K],
        fn: Callable[[K], T],
        deadline: float,
        item_timeout_seconds: float | None,
        out: ReadResult[K, T],
    ) -> set[K]:
        """One worker over todo; returns the keys it finished (read or failed)."""
        loop = asyncio.get_running_loop()
        self._generation += 1
        generation = self._generation
        values: dict[K, T] = {}
        errors: dict[K, Exception] = {}
        current: list[tuple[K, float] | None] = [None]

        def work() -> None:  # on the worker thread
            for key in todo:
                if self._generation != generation:
                    return  # a deadline passed: a newer round owns the items now
                current[0] = (key, loop.time())
                try:
                    values[key] = fn(key)
                except Exception as exc:
                    errors[key] = exc
                current[0] = None

        job = loop.run_in_executor(self._executor, work)
        while not job.done():
            wait_until = deadline
            item = current[0]
            if item_timeout_seconds is not None and item is not None:
                wait_until = min(deadline, item[1] + item_timeout_seconds)
            elif item_timeout_seconds is not None:
                wait_until = min(deadline, loop.time() + item_timeout_seconds)
            try:
                await asyncio.wait_for(asyncio.shield(job), max(0.0, wait_until - loop.time()))
            except TimeoutError:
                item = current[0]
                over = item is not None and (
                    loop.time() >= deadline
                    or (item_timeout_seconds is not None and loop.time() - item[1] >= item_timeout_seconds)
                )
                if loop.time() >= deadline or over:
                    self._generation += 1  # the worker stops after the item it is in
                    if item is not None:
                        self._set_aside(item[0], job)
                    break
        out.values.update(values)
        out.errors.update(errors)
        return set(values) | set(errors)

    def _set_aside(self, key: K, job: asyncio.Future[None]) -> None:
        log.warning("%s: reading %s did not return in time; it is skipped until it does", self.name, key)
        self._stuck[key] = job

        def returned(_: asyncio.Future[None]) -> None:
            if self._stuck.get(key) is job:
                del self._stuck[key]
                log.info("%s: the read of %s returned", self.name, key)

        job.add_done_callback(returned)

    def close(self) -> None:
        """Stop taking work; hung threads are left to finish on their own."""
        self._executor.shutdown(wait=False, cancel_futures=True)
