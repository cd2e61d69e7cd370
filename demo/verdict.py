"""Did the ladder play as the scenario expects? Checked from the controller's ledger and the pages."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from demo.pager_sink import ReceivedPage
from demo.world import World

Incident = Mapping[str, Any]


@dataclass(frozen=True)
class HungJob:
    """A training job one of whose ranks dies: the whole job restarted once fixes it."""

    namespace: str
    name: str
    dead_rank: str
    pods: tuple[str, ...]  # "namespace/pod" of every rank


@dataclass(frozen=True)
class Expectations:
    """What the scenario promises, by target."""

    leak_pods: tuple[str, ...]  # "namespace/pod": restart fixes it, closed as automated, no page
    bad_gpu_uuids: tuple[str, ...]  # GPUs that stay bad: migrated, then paged
    loop_pods: tuple[str, ...]  # "namespace/pod": restarted, loop detected, paged
    hung_jobs: tuple[HungJob, ...] = ()


@dataclass(frozen=True)
class Check:
    """One expectation and whether it held."""

    name: str
    ok: bool
    detail: str


def _pod(inc: Incident) -> str:
    return f"{inc.get('target_namespace', '')}/{inc.get('target_pod', '')}"


def _actions(inc: Incident, rung: str, status: str = "success") -> list[Mapping[str, Any]]:
    return [
        h
        for h in inc.get("history") or []
        if h.get("kind") == "action" and h.get("rung") == rung and h.get("status") == status
    ]


def _events(inc: Incident, status: str) -> list[Mapping[str, Any]]:
    return [h for h in inc.get("history") or [] if h.get("kind") == "event" and h.get("status") == status]


def _pages(inc: Incident, pages: Sequence[ReceivedPage]) -> list[ReceivedPage]:
    key = f"gpupulse-incident-{inc.get('id')}"
    return [p for p in pages if p.dedup_key == key and not p.resolved]


def _states(incs: Sequence[Incident]) -> str:
    return ", ".join(
        f"#{i.get('id')} {i.get('state')}/{i.get('resolution') or '-'} "
        f"(restarts {len(_actions(i, 'restart'))}, migrations {len(_actions(i, 'migrate'))})"
        for i in incs
    )


def check_leak(pod: str, incidents: Sequence[Incident], pages: Sequence[ReceivedPage]) -> Check:
    """(a) memory leak: restarted, the alert resolved, closed as automated, nobody paged."""
    name = f"(a) leak in {pod} fixed by a restart"
    mine = [i for i in incidents if i.get("fault_class") == "memory_leak" and _pod(i) == pod]
    if not mine:
        return Check(
            name, False, "no memory_leak incident was opened (did GPUProcessMemoryAboveHardLimit fire?)"
        )
    for inc in mine:
        if inc.get("resolution") == "automated" and _actions(inc, "restart") and not _pages(inc, pages):
            return Check(name, True, f"incident #{inc['id']}: restart, resolved, closed automated")
    return Check(name, False, f"not closed as automated after a restart: {_states(mine)}")


def check_bad_gpu(uuid: str, incidents: Sequence[Incident], pages: Sequence[ReceivedPage]) -> Check:
    """(b) reset-class fault: migrated off the GPU, then paged because the GPU stays bad."""
    name = f"(b) GPU {uuid} migrated, then paged"
    mine = [i for i in incidents if i.get("target_kind") == "gpu" and i.get("target_uuid") == uuid]
    if not mine:
        return Check(name, False, "no incident on this GPU (did GPUXidResetRequired fire?)")
    for inc in mine:
        migrated = _actions(inc, "migrate")
        paged = _pages(inc, pages)
        if migrated and paged:
            return Check(name, True, f"incident #{inc['id']}: migrate, not fixed, paged")
    return Check(name, False, f"expected a migrate and then a page: {_states(mine)}")


def check_loop(
    pod: str, incidents: Sequence[Incident], pages: Sequence[ReceivedPage], min_restarts: int = 2
) -> Check:
    """(c) restart loop: restarted at least min_restarts times, loop detected, paged."""
    name = f"(c) restart loop of {pod} stopped and paged"
    mine = [i for i in incidents if _pod(i) == pod and i.get("fault_class") == "xid_app"]
    if not mine:
        return Check(name, False, "no xid_app incident was opened (did GPUXidAppError fire?)")
    restarts = sum(len(_actions(i, "restart")) for i in mine)
    loops = [e for i in mine for e in _events(i, "restart_loop")]
    paged = [p for i in mine for p in _pages(i, pages)]
    if restarts >= min_restarts and loops and paged:
        return Check(name, True, f"{restarts} restarts, loop detected, paged")
    return Check(
        name,
        False,
        f"{restarts} restart(s), loop detected: {'yes' if loops else 'no'}, paged: {'yes' if paged else 'no'}"
        f" ({_states(mine)})",
    )


def check_hung_job(job: HungJob, incidents: Sequence[Incident], pages: Sequence[ReceivedPage]) -> Check:
    """(d) a hung gang: the whole job restarted once (never one of its pods), the alert resolved,
    closed as automated, nobody paged."""
    name = f"(d) training job {job.namespace}/{job.name} hung (rank {job.dead_rank} died)"
    single = [
        f"#{i.get('id')} {_pod(i)}"
        for i in incidents
        if i.get("target_kind") == "pod"
        and _pod(i) in job.pods
        and (_actions(i, "restart") or _actions(i, "migrate"))
    ]
    if single:
        return Check(name, False, f"a pod of the job was restarted or moved on its own: {', '.join(single)}")
    mine = [
        i
        for i in incidents
        if i.get("target_kind") == "job"
        and i.get("target_namespace") == job.namespace
        and i.get("target_training_job") == job.name
        and i.get("fault_class") == "training_hang"
    ]
    if not mine:
        return Check(
            name, False, "no training_hang incident for the job was opened (did TrainingJobHung fire?)"
        )
    restarts = sum(len(_actions(i, "restart")) for i in mine)
    for inc in mine:
        if (
            restarts == 1
            and _actions(inc, "restart")
            and inc.get("resolution") == "automated"
            and not _pages(inc, pages)
        ):
            return Check(
                name,
                True,
                f"whole job restarted once ({len(job.pods)} ranks), recovered: "
                f"incident #{inc['id']} closed automated",
            )
    return Check(name, False, f"expected one job restart that held: {_states(mine)}")


def evaluate(
    expect: Expectations, incidents: Sequence[Incident], pages: Sequence[ReceivedPage]
) -> list[Check]:
    """Every expectation of the scenario, checked."""
    return (
        [check_leak(p, incidents, pages) for p in expect.leak_pods]
        + [check_bad_gpu(u, incidents, pages) for u in expect.bad_gpu_uuids]
        + [check_loop(p, incidents, pages) for p in expect.loop_pods]
        + [check_hung_job(j, incidents, pages) for j in expect.hung_jobs]
    )


def expectations_from(world: World) -> Expectations:
    """What the scenario's `x-demo` section promises."""
    by_name = {p.name: p for p in world.pods}
    leak = tuple(by_name[n].key for n, b in world.behaviours.items() if b.restart_memory_bytes is not None)
    loop = tuple(by_name[n].key for n, b in world.behaviours.items() if b.xid_loop is not None)
    bad = tuple(world.uuid(r.gpu) for r in world.repeats)
    jobs = tuple(
        HungJob(h.namespace, h.job, h.rank, tuple(p.key for p in world.gang_pods(h))) for h in world.hangs
    )
    return Expectations(leak_pods=leak, bad_gpu_uuids=bad, loop_pods=loop, hung_jobs=jobs)
