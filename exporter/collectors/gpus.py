"""The GPUs every NVML collector shares: a tick's batches in a row, a worker thread per GPU for when
one hangs, deadlines, lost and stale state; and the shape of a collector whose reads ride in the
tick's one round (FleetCollector: plan the reads, publish from the answers)."""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Generic, TypeVar

from prometheus_client.core import Metric

from exporter.collectors.base import GpuRef, NodeState
from exporter.errors import GpuLostError, NvmlUnknownError
from exporter.nvml import Device, GpuWorker, Nvml, RoundRunner, WorkerJob, run_job, wake_loop
from gpupulse.clock import Clock

log = logging.getLogger(__name__)
T = TypeVar("T")


@dataclass
class GpuSlot:
    """One GPU with its worker; `lost` is permanent, `stale` lasts until a call answers again."""

    device: Device
    worker: GpuWorker
    lost: bool = False
    stale: bool = False
    uuid: str = field(init=False)
    index: str = field(init=False)  # the `gpu` label
    _ref: GpuRef | None = field(default=None, init=False, repr=False)

    def __post_init__(self) -> None:
        self.uuid = self.device.static.uuid
        self.index = str(self.device.static.index)

    def ref(self) -> GpuRef:
        """The GPU as NodeState names it (made once: its facts are static)."""
        found = self._ref
        if found is None:
            s = self.device.static
            found = self._ref = GpuRef(uuid=s.uuid, index=str(s.index), name=s.name, pci_bus_id=s.pci_bus_id)
        return found


class Outcome:
    """Why a GPU gave no result this round."""

    LOST = "lost"
    STALE = "stale"
    FAILED = "failed"
    UNKNOWN = "unknown"  # NVML_ERROR_UNKNOWN: in a container, usually a lost device cgroup


_Job = Callable[[Device], Any]
_PROBE = -1  # a fill's job position for a probe: answered by whether the GPU's batch came back


class _Round:
    """The reads queued in one event-loop turn: one batch of jobs per GPU, run as one round.

    Each read's answers list is filled in place once the round ends: `fills` says where each answer
    goes. No future or object per read: a tick queues ~100 of them.
    """

    __slots__ = ("batches", "done", "fills")

    def __init__(self, done: asyncio.Future[None]) -> None:
        self.batches: dict[str, tuple[GpuSlot, list[_Job]]] = {}  # by GPU index
        # (answers, position in it, the GPU, position of its job in the GPU's batch or _PROBE)
        self.fills: list[tuple[list[tuple[GpuSlot, Any]], int, GpuSlot, int]] = []
        self.done = done  # set when every answer is in place


def _run_jobs(device: Device, jobs: list[_Job]) -> list[tuple[bool, Any]]:
    # one GPU's batch, on the thread that runs it: a failing read fails only itself
    out: list[tuple[bool, Any]] = []
    for fn in jobs:
        try:
            out.append((True, fn(device)))
        except Exception as exc:
            out.append((False, exc))
    return out


Read = tuple[Callable[[Device], Any], Sequence[GpuSlot]]  # fn(device) on each of these GPUs
Answers = list[tuple[GpuSlot, Any]]  # per GPU of a read, in its order: the result or an Outcome string


class GpuFleet:
    """Runs per-GPU NVML work off the event loop, GPU after GPU, each GPU behind its own deadline."""

    def __init__(
        self,
        nvml: Nvml,
        clock: Clock,
        call_timeout_seconds: float,
        unknown_rounds_fatal: int = 10,
        serial_seconds: float = 0.05,
    ) -> None:
        self.nvml, self.clock = nvml, clock
        self.call_timeout_seconds = call_timeout_seconds
        # how long a round runs its GPUs' batches in a row before the rest start side by side
        self.serial_seconds = serial_seconds
        self.slots = [GpuSlot(dev, GpuWorker(f"nvml-gpu{dev.static.index}")) for dev in nvml.devices]
        # a hung GPU holds the runner thread it hangs on: one thread per GPU, plus one, at most
        self._runner = RoundRunner("nvml-round", len(self.slots) + 1)
        self.answered = False  # did any GPU answer in the last device round
        self.unknown_rounds = 0
        self.unknown_rounds_fatal = unknown_rounds_fatal
        self.fatal: str | None = None  # set when the exporter should exit (see note_device_round)
        self._pending: _Round | None = None  # the round of this event-loop turn, until it starts

    @property
    def driver_version(self) -> str:
        return self.nvml.driver_version

    def live(self) -> list[GpuSlot]:
        """GPUs not lost."""
        return [s for s in self.slots if not s.lost]

    async def answer(self, reads: Sequence[Read]) -> list[Answers]:
        """Every read on its GPUs; per read, (GPU, result or Outcome string) in the read's GPU order.

        Reads queued in the same event-loop turn (all collectors of a tick, or several callers) go to
        each GPU as one batch, and all batches run as one round (see _start): one thread hand-over
        per tick instead of one per read, and one deadline for each GPU's whole batch. A lost or stuck
        GPU is answered at once, without queueing anything.
        """
        pending = self._pending
        if pending is None:
            loop = asyncio.get_running_loop()
            pending = self._pending = _Round(loop.create_future())
            loop.call_soon(self._flush)
        batches, fills = pending.batches, pending.fills
        out: list[Answers] = []
        for fn, slots in reads:
            answers: Answers = []
            for slot in slots:
                if slot.lost:
                    answers.append((slot, Outcome.LOST))
                    continue
                if slot.worker.stuck:
                    slot.stale = True
                    answers.append((slot, Outcome.STALE))
                    continue
                batch = batches.get(slot.index)
                if batch is None:
                    batch = batches[slot.index] = (slot, [])
                if fn is _probe:  # no job: the GPU's batch coming back is the answer
                    fills.append((answers, len(answers), slot, _PROBE))
                else:
                    fills.append((answers, len(answers), slot, len(batch[1])))
                    batch[1].append(fn)
                answers.append((slot, None))
            out.append(answers)
        # one caller's cancellation must not cancel the round for the others queued in it
        await asyncio.shield(pending.done)
        return out

    async def map(
        self, fn: Callable[[Device], T], slots: Sequence[GpuSlot] | None = None
    ) -> list[tuple[GpuSlot, T | str]]:
        """fn on every GPU (or on `slots`) in this turn's round; results in GPU order."""
        return (await self.answer([(fn, self.slots if slots is None else slots)]))[0]

    async def run(self, slot: GpuSlot, fn: Callable[[Device], T]) -> T | str:
        """fn(device) in this turn's round, or an Outcome string when the GPU is lost, stale or failed."""
        value: T | str = (await self.answer([(fn, (slot,))]))[0][0][1]
        return value

    def submit(self, slot: GpuSlot, fn: Callable[[Device], T]) -> asyncio.Future[T | str]:
        """Queue fn(device) for this turn's round now; the future holds the result or an Outcome string."""
        task = asyncio.ensure_future(self.run(slot, fn))
        return task

    def _flush(self) -> None:
        pending, self._pending = self._pending, None
        assert pending is not None
        if pending.batches:
            self._start(pending)
        elif not pending.done.done():
            pending.done.set_result(None)

    def _start(self, pending: _Round) -> None:
        """The GPUs' batches in a row on one RoundRunner thread; whatever has not started after
        `serial_seconds` (a GPU hung or slow inside its batch) starts at once, each batch on its own
        GPU's worker thread. Every batch is one job of its GPU under the round's deadline, and the
        round ends (on the loop) when the last batch hands back or the deadline passes, whichever is
        first: no task and no future per GPU.

        Measured on the simulation, 16 GPUs: the same reads cost ~0.7 ms more CPU per tick on 16
        threads woken together than in a row (GIL hand-overs), and a chain of the GPU threads (each
        waking the next) kept most of that. A GPU hung in its batch delays the GPUs after it by at most
        `serial_seconds`, and only on the tick it hangs: from then on it is stuck and not queued.
        """
        loop = asyncio.get_running_loop()
        batches = list(pending.batches.values())
        results: dict[str, tuple[bool, Any]] = {}
        remaining = [len(batches)]
        next_up = [0]  # position of the first batch not started
        lock = threading.Lock()

        def finished(index: str, ok: bool, value: Any) -> bool:  # on the thread that ran the batch
            results[index] = (ok, value)
            with lock:
                remaining[0] -= 1
                return remaining[0] == 0  # the round's last batch

        def on_own_thread(index: str, ok: bool, value: Any) -> None:  # a batch fanned out to its GPU
            if finished(index, ok, value):
                wake_loop(loop, end)

        started = [
            WorkerJob(partial(_run_jobs, slot.device, jobs), partial(on_own_thread, slot.index))
            for slot, jobs in batches
        ]
        runner = self._runner

        def in_a_row() -> None:  # on the runner thread: claim and run batches until none is left
            last = False
            while True:
                with lock:
                    i = next_up[0]
                    if i >= len(started):
                        break
                    next_up[0] = i + 1
                    job = started[i]
                last = finished(batches[i][0].index, *run_job(job)) or last
            # idle before the loop is woken: the next tick's round comes back to this thread
            runner.release()
            if last:
                wake_loop(loop, end)

        def fan_out() -> None:  # every batch not claimed yet, each on its own GPU's thread
            with lock:
                first, next_up[0] = next_up[0], len(started)
                todo = started[first:]
            for i, job in enumerate(todo, first):
                batches[i][0].worker.put(job)

        def end() -> None:  # on the loop, once: every batch handed back, or the deadline passed
            if pending.done.done():
                return
            deadline.cancel()
            if spread is not None:
                spread.cancel()
            fan_out()  # a round cut short leaves no batch unstarted (and then abandoned below)
            self._hand_out(pending, batches, started, results)
            with lock:  # the jobs refer to `finished`, which refers to this: no cycle left for the GC
                started.clear()
            pending.done.set_result(None)

        spread = None
        if self._runner.submit(in_a_row):
            spread = loop.call_later(min(self.serial_seconds, self.call_timeout_seconds), fan_out)
        else:  # every runner thread is inside a hung call
            fan_out()
        deadline = loop.call_later(self.call_timeout_seconds, end)

    def _hand_out(
        self,
        pending: _Round,
        batches: list[tuple[GpuSlot, list[_Job]]],
        started: list[WorkerJob],
        results: dict[str, tuple[bool, Any]],
    ) -> None:
        """Each answer into its place: the result, or the Outcome of the GPU or of the failed read."""
        values: dict[str, list[Any] | None] = {}
        for (slot, jobs), job in zip(batches, started, strict=True):
            got = results.get(slot.index)
            if got is None:
                slot.worker.abandon(job)
                if not slot.stale:
                    log.warning(
                        "GPU %s (%s) is stale: no answer within %g s",
                        slot.index,
                        slot.uuid,
                        self.call_timeout_seconds,
                    )
                slot.stale = True
                values[slot.index] = None
                continue
            slot.stale = False
            ok, outs = got
            if not ok:  # the batch itself failed (not one read of it)
                outs = [(False, outs)] * len(jobs)
            values[slot.index] = [v if good else self._failure(slot, v) for good, v in outs]
        # after every failure is known: a probe of a GPU that another read found lost says so
        for answers, position, slot, place in pending.fills:
            got_values = values[slot.index]
            if got_values is None:
                value: Any = Outcome.STALE
            elif place == _PROBE:
                value = Outcome.LOST if slot.lost else None
            else:
                value = got_values[place]
            answers[position] = (slot, value)

    def _failure(self, slot: GpuSlot, exc: Exception) -> str:
        if isinstance(exc, GpuLostError):
            if not slot.lost:
                log.error(
                    "GPU %s (%s) is lost; its series are removed until the exporter restarts",
                    slot.index,
                    slot.uuid,
                )
            slot.lost = True
            return Outcome.LOST
        log.warning("GPU %s: %s", slot.index, exc)
        return Outcome.UNKNOWN if isinstance(exc, NvmlUnknownError) else Outcome.FAILED

    def note_device_round(self, outcomes: Sequence[object]) -> None:
        """Track device rounds in which every live GPU failed with Unknown Error; fatal after a run of them.

        Re-initialising NVML does not bring back a container's lost device cgroup; exiting lets the
        orchestrator restart the container, which is what fixes it.
        """
        if outcomes and all(o == Outcome.UNKNOWN for o in outcomes):
            self.unknown_rounds += 1
        else:
            self.unknown_rounds = 0
        if self.unknown_rounds >= self.unknown_rounds_fatal and self.fatal is None:
            self.fatal = (
                f"every GPU answered NVML Unknown Error for {self.unknown_rounds} samples in a row; "
                "in a container this usually means its device cgroup lost /dev/nvidia*"
            )

    def stale_gpus(self) -> Sequence[tuple[str, str, bool]]:
        """(uuid, index, stale) for every GPU not lost."""
        return [(s.uuid, s.index, s.stale or s.worker.stuck) for s in self.live()]

    def gpu_states(self) -> Sequence[tuple[GpuRef, str]]:
        """Every GPU with "up", "stale" or "lost" (for the landing page)."""
        out: list[tuple[GpuRef, str]] = []
        for s in self.slots:
            state = "lost" if s.lost else "stale" if s.stale or s.worker.stuck else "up"
            out.append((s.ref(), state))
        return out

    def close(self) -> bool:
        """Stop the workers; False when one is still inside a driver call."""
        for slot in self.slots:
            slot.worker.stop()
        self._runner.stop()
        return all([slot.worker.join(0.5) for slot in self.slots]) and self._runner.join(0.5)


def _probe(_: Device) -> None:
    """No NVML call: only whether the GPU's worker answers this tick."""
    return None


class Tiered(Generic[T]):
    """Reads of fields that change slowly, on their own interval (DCGM field groups have an update
    frequency): ECC and row-remap counters, NVLink link states, power limit, PCIe link and replays.

    Between reads, a GPU that answers this tick (a probe: no NVML call, only whether the GPU's batch
    of the tick came back) serves its last reading; a stale or lost GPU serves nothing and forgets it,
    so it is read afresh in the first tick it is queued again. interval_seconds 0 reads every tick.
    """

    def __init__(self, fleet: GpuFleet, fn: Callable[[Device], T], interval_seconds: float) -> None:
        self.fleet, self.fn, self.interval_seconds = fleet, fn, interval_seconds
        self._due_at: float | None = None
        self._last: dict[str, T] = {}  # by GPU UUID
        self._fresh = False  # whether this tick's plan reads every GPU

    def plan(self) -> list[Read]:
        """This tick's reads: every GPU when due; else a probe of the GPUs with a last reading and a
        read of those without one (back from stale, or never answered)."""
        now = self.fleet.clock.monotonic()
        slots = self.fleet.slots
        if self._due_at is None or now >= self._due_at or self.interval_seconds <= 0:
            self._due_at = now + self.interval_seconds
            self._fresh = True
            return [(self.fn, slots)]
        self._fresh = False
        last = self._last
        known = [s for s in slots if s.uuid in last]
        return [(_probe, known), (self.fn, [s for s in slots if s.uuid not in last])]

    def settle(self, answers: Sequence[Answers]) -> list[tuple[GpuSlot, T | str]]:
        """Per GPU in fleet order, a reading (fresh, or the last one) or an Outcome string."""
        if self._fresh:
            results = answers[0]
            self._last = {slot.uuid: r for slot, r in results if not isinstance(r, str)}
            return results
        probes, reads = answers
        last = self._last
        for slot, r in probes:
            if isinstance(r, str):
                last.pop(slot.uuid, None)
        for slot, r in reads:
            if not isinstance(r, str):
                last[slot.uuid] = r
        if not reads:  # the usual tick: the probes are every GPU with a reading, in fleet order
            return [(slot, r if isinstance(r, str) else last[slot.uuid]) for slot, r in probes]
        by_uuid = {slot.uuid: r for slot, r in (*probes, *reads)}
        out: list[tuple[GpuSlot, T | str]] = []
        for slot in self.fleet.slots:
            r = by_uuid.get(slot.uuid, Outcome.FAILED)
            out.append((slot, r if isinstance(r, str) else last.get(slot.uuid, Outcome.FAILED)))
        return out


class FleetCollector:
    """An NVML collector whose reads ride in the tick's one GPU round.

    `plan` says what to read this tick, `publish` turns the answers (one list per planned read, in
    order) into families. The sampler plans every such collector, runs their reads as one round and
    publishes each; `collect` runs one collector alone (tests, or a sampler of one).
    """

    name: str
    interval_seconds: float | None = None

    def __init__(self, fleet: GpuFleet) -> None:
        self.fleet = fleet

    def plan(self, state: NodeState) -> Sequence[Read]:
        """The reads of this tick."""
        raise NotImplementedError

    def publish(self, answers: Sequence[Answers], state: NodeState) -> Sequence[Metric]:
        """Families from the answers to this tick's plan; may update NodeState."""
        raise NotImplementedError

    async def collect(self, state: NodeState) -> Sequence[Metric]:
        """Plan, read and publish on its own."""
        return self.publish(await self.fleet.answer(self.plan(state)), state)

    async def close(self) -> None:
        """Nothing to release: the GPU fleet is closed by the exporter."""
