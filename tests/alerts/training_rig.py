"""The training-job replay rig: a 2 x 8 PyTorchJob per case, one `gpupulse-exporter --simulate` per node,
the real Prometheus with our rules, the real Alertmanager, and the real controller with the Kubernetes
backend against the in-process API server, which holds the job's PyTorchJob, its 16 pods and the nodes.

Used by tests/alerts/test_training_replay.py (the fast profile: scenarios played SPEED x fast with the
rules' windows and `for:` scaled to match) and bench/proofs/training.py (real speed, the shipped rules).

Each case is two scenario files, exporter/scenarios/training-<case>-{a,b}.yaml. Attribution is real:
a fake kubelet per node lists the pods' GPUs, a fake /proc holds each rank's cgroup and its launcher
environment (RANK, WORLD_SIZE, ...), and the exporter's pod watch reads the pods' labels and owner from
the API server. Training-operator, the scheduler and the kubelet around a restart are played by
`StandIn`: for the scenarios with hand-written curves a deleted rank pod comes back at once under the
same name with a new UID on the node it left, and the simulator keeps playing its fault after the
restart; for the scenarios whose ranks a `jobs` section plays (tests/alerts/test_training_lifecycle.py)
the restarted gang's pods come back on free GPUs after the scenario's `scheduler.delay_seconds` with
new UIDs and PIDs, and each simulated node plays the job's next run (exporter/sim/lifecycle.py).

Times: a fault's onset is a scenario time (Case.fault_at). The exporter's simulated clock starts before
its first log line, so onset (unix) = that line's timestamp + fault_at / speed, at most a few
milliseconds late; a detection latency is the first ALERTS{alertstate="firing"} sample minus that.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import json
import os
import shutil
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import AsyncExitStack, asynccontextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aiohttp
import yaml

from alerts.config import load_config
from alerts.generate import render_rules
from demo.configs import alertmanager_config
from exporter.sim.jobs import place_gang, plan_attempt, restart_count
from exporter.sim.scenario import load_scenario
from exporter.sim.scenario_types import ProcessSpec, Scenario
from gpupulse.durations import parse_duration
from tests.alerts.children import child_process, wait_http
from tests.alerts.ruleset import TESTS_DIR
from tests.attribution.helpers import (
    ProcfsTree,
    advance_host_cpu,
    cgroup_v2_systemd,
    procfs_from_scenario,
    write_pod_dir,
)
from tests.fakes.alertmanager_process import AlertmanagerHandle, running_alertmanager
from tests.fakes.kube_api import JSON, FakeKubeAPI
from tests.fakes.kubelet import FakeKubelet, pods_from_scenario
from tests.fakes.prometheus_process import PromHandle, free_port, running_prometheus

BIN = Path(sys.executable).parent
SCENARIOS = Path(__file__).resolve().parents[2] / "exporter" / "scenarios"
NAMESPACE = "research"
CONTROLLER_TOKEN = "gpupulse-training-replay"
# a training cluster bigger than the replay's nodes: the fraction budget counts migrated nodes
# against it (two cordons of 8 nodes would open the breaker at 0.2)
CLUSTER_NODES = 64


@dataclass(frozen=True)
class Case:
    """One replayed job: which alerts must fire, and what the controller must do."""

    name: str
    fault_at: float | None  # scenario seconds; None for the healthy job
    expected: frozenset[str]  # training alerts that must fire on the job
    action: str | None = None  # the ledger action the controller must take: restart or migrate
    suspect: Mapping[str, str] = field(default_factory=dict)  # labels the alert must name
    cordon: str | None = None  # the node a migrate cordons
    # alerts the suspect GPU may hold pending (never firing within the replay): what its fault is
    # besides a training fault, e.g. a throttled GPU's temperature alerts, whose `for:` is longer
    side_alerts: frozenset[str] = frozenset()
    # the job prints a step line (DeepSpeed's) every this many scenario seconds to rank 0's container
    # log until its fault's onset, and the exporters read their node's pod logs; None: no progress signal
    progress_step_seconds: float | None = None
    # alerts any of the case's GPUs or its job may hold pending (never firing within the replay): the
    # backstops a slow detection keeps pending until its alert fires and folds them in
    may_pend: frozenset[str] = frozenset()

    def owns(self, labels: Mapping[str, str]) -> bool:
        """An alert about this case: its job, one of its pods, or one of its nodes."""
        return (
            labels.get("training_job") == self.job
            or labels.get("pod", "").startswith(self.job + "-")
            or labels.get("node") in self.nodes
        )

    def excused(self, labels: Mapping[str, str]) -> bool:
        """A pending side alert on the suspect GPU, or one the case may hold pending anywhere."""
        return labels.get("alertname") in self.may_pend or (
            labels.get("alertname") in self.side_alerts
            and labels.get("node") == self.suspect.get("node")
            and labels.get("gpu") == self.suspect.get("gpu")
        )

    @property
    def job(self) -> str:
        return f"llama-{self.name}"

    @property
    def nodes(self) -> tuple[str, str]:
        return (f"training-{self.name}-a", f"training-{self.name}-b")

    def scenario(self, node: str) -> Path:
        return SCENARIOS / f"{node}.yaml"


CASES = {
    c.name: c
    for c in (
        Case("healthy", None, frozenset()),
        Case("hang", 60.0, frozenset({"TrainingJobHung"}), action="restart"),
        Case(
            "straggler",
            60.0,
            frozenset({"TrainingRankStraggler"}),
            action="migrate",
            suspect={"rank": "13", "gpu": "5", "node": "training-straggler-b", "signal": "sm_clock"},
            cordon="training-straggler-b",
            side_alerts=frozenset({"GPUThermalThrottling", "GPUTemperatureHigh"}),
        ),
        Case(
            "xid79",
            60.0,
            frozenset({"TrainingJobNodeFault"}),
            action="migrate",
            suspect={"rank": "6", "gpu": "6", "node": "training-xid79-a"},
            cordon="training-xid79-a",
        ),
    )
}


# not in CASES (the four-job replay): its detection takes the long way round (2m + 1m, shipped), so it
# is replayed alone, with a longer watch (tests/alerts/test_training_replay.py)
STALLED = Case(
    "stalled",
    60.0,
    frozenset({"TrainingRankStalled"}),
    action="restart",
    suspect={"rank": "11", "gpu": "3", "node": "training-stalled-b", "evidence": "disk_sleep"},
)


# pods that live and die (scenarios with `jobs`, tests/alerts/test_training_lifecycle.py): a hang the
# gang restart fixes, a job that finishes, one rank's container restarted into a rendezvous nobody joins
RESTARTED = Case("restart", 60.0, frozenset({"TrainingJobHung"}), action="restart")
FINISHED = Case("finish", None, frozenset())
FINISHED_AT = 120.0  # scenario seconds: every rank of llama-finish exits, its pods complete
REJOINED = Case(
    "rendezvous",
    60.0,
    frozenset({"TrainingRankStalled"}),
    action="restart",
    suspect={"rank": "11", "gpu": "3", "node": "training-rendezvous-b", "evidence": "blocked"},
    # through the 15-minute window (asleep, no I/O) every GPU of the job looks idle (the spinning ones
    # at 0.15 SM activity too) and the job's tensor work is gone: GPUIdleWhileAllocated (30m) and
    # TrainingJobDegraded (15m) stay pending for more than half their `for:` until TrainingRankStalled
    # fires and folds the idle warnings into the job's incident; neither may fire
    may_pend=frozenset({"GPUIdleWhileAllocated", "TrainingJobDegraded"}),
)
LIFECYCLE = (RESTARTED, FINISHED, REJOINED)


@dataclass(frozen=True)
class Profile:
    """How fast the scenarios play and which rules judge them."""

    name: str
    speed: float  # scenario seconds per wall second
    interval_seconds: float  # Prometheus scrape and rule evaluation
    overrides: Mapping[str, Any] | None  # over alerts/config.yaml; None: the shipped rules
    group_wait: str
    group_interval: str
    sampling_seconds: float  # exporter sampling and attribution interval (wall)

    def scenario_seconds(self, wall_seconds: float) -> float:
        return wall_seconds * self.speed


def _deep_merge(base: Mapping[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in over.items():
        if isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = _deep_merge(out[key], value)
        else:
            out[key] = value
    return out


def fast_overrides() -> dict[str, Any]:
    """tests/alerts/fast-overrides.yaml with training-fast-overrides.yaml over it."""
    base = yaml.safe_load((TESTS_DIR / "fast-overrides.yaml").read_text())
    training = yaml.safe_load((TESTS_DIR / "training-fast-overrides.yaml").read_text())
    return _deep_merge(base, training)


FAST = Profile("fast", 5.0, 1.0, None, "1s", "1s", 0.5)  # overrides filled in by fast_profile()
# the chart's defaults: a 15 s ServiceMonitor interval and evaluation, Alertmanager's groupWait 10s and
# groupInterval 1m (controller.alertmanagerConfig)
SHIPPED = Profile("shipped", 1.0, 15.0, None, "10s", "1m", 1.0)


def fast_profile() -> Profile:
    return Profile(
        FAST.name, FAST.speed, FAST.interval_seconds, fast_overrides(), FAST.group_wait,
        FAST.group_interval, FAST.sampling_seconds,
    )  # fmt: skip


@dataclass
class Exporter:
    case: Case
    node: str
    port: int
    proc: asyncio.subprocess.Process
    log: Path
    started_unix: float = 0.0  # the first log line's timestamp: the simulated clock runs from about then
    procfs: Path | None = None  # its fake /proc
    processes: tuple[ProcessSpec, ...] = ()  # the scenario's processes, whose host curves it plays
    scenario: Scenario | None = None
    doc: dict[str, Any] = field(default_factory=dict)  # the scenario file as YAML read it
    kubelet: FakeKubelet | None = None
    tree: ProcfsTree | None = None
    pods_dir: Path | None = None
    inbox: Path | None = None  # where the simulated node reads gang restarts (scheduler.inbox)

    def scenario_now(self, speed: float) -> float:
        """The exporter's scenario clock now (it started at about started_unix)."""
        return (time.time() - self.started_unix) * speed

    @property
    def job(self) -> str:
        return f"gpupulse-{self.node}"


@dataclass(frozen=True)
class Quiet:
    """Alerts besides a case's expected ones: firing (alertname, node, gpu), the longest pending
    episode per alert (scenario seconds), and the alerts pending for more than half their `for:`."""

    firing: list[tuple[str, str, str]]
    pending: dict[str, float]
    too_long: list[str]

    @property
    def ok(self) -> bool:
        return not self.firing and not self.too_long

    def describe(self) -> str:
        shown = ", ".join(f"{n} {s:.0f} s" for n, s in sorted(self.pending.items()))
        return f"firing: {self.firing or 'none'}; longest pending (scenario s): {shown or 'none'}"


@dataclass
class Replay:
    """What a run measured; the live handles stay usable inside `running_replay`."""

    profile: Profile
    cases: tuple[Case, ...]
    api: FakeKubeAPI
    prom: PromHandle
    am: AlertmanagerHandle
    controller_url: str
    exporters: list[Exporter]
    t_start: float  # unix, before Prometheus's first scrape
    jobs: dict[str, JSON] = field(default_factory=dict)  # case name -> PyTorchJob object
    stand_in: StandIn | None = None

    def onset(self, case: Case) -> float:
        """Unix time of the case's fault onset (the later of its two exporters' clocks)."""
        assert case.fault_at is not None
        start = max(e.started_unix for e in self.exporters if e.case == case)
        return start + case.fault_at / self.profile.speed

    async def firing_since(self, case: Case, alertname: str) -> list[dict[str, Any]]:
        """ALERTS{firing} series of this alert on this case's job since the start, with their samples."""
        window = int(time.time() - self.t_start) + 5
        selector = (
            f'alertname="{alertname}", alertstate="firing", namespace="{NAMESPACE}", '
            f'training_job="{case.job}"'
        )
        return await self.prom.query(f"ALERTS{{{selector}}}[{window}s]")

    async def first_firing(self, case: Case, alertname: str) -> float | None:
        stamps = [float(ts) for s in await self.firing_since(case, alertname) for ts, _ in s["values"]]
        return min(stamps) if stamps else None

    async def alerts_during_run(self) -> list[tuple[str, str, dict[str, str], float]]:
        """(alertname, alertstate, labels, first sample unix) of every ALERTS series since the start."""
        window = int(time.time() - self.t_start) + 5
        out = []
        for series in await self.prom.query(f"ALERTS[{window}s]"):
            labels = dict(series["metric"])
            first = min(float(ts) for ts, _ in series["values"])
            out.append((labels["alertname"], labels["alertstate"], labels, first))
        return out

    async def pending_runs(self, case_filter: Callable[[dict[str, str]], bool]) -> dict[str, float]:
        """Alert name -> its longest pending episode (wall seconds, first to last sample) since the
        start, over the ALERTS{alertstate="pending"} series whose labels pass the filter."""
        window = int(time.time() - self.t_start) + 5
        gap = 1.5 * self.profile.interval_seconds
        out: dict[str, float] = {}
        for series in await self.prom.query(f'ALERTS{{alertstate="pending"}}[{window}s]'):
            labels = dict(series["metric"])
            if not case_filter(labels):
                continue
            stamps = sorted(float(ts) for ts, _ in series["values"])
            longest, begin = 0.0, stamps[0]
            for prev, ts in itertools.pairwise(stamps):
                if ts - prev > gap:
                    begin = ts
                longest = max(longest, ts - begin)
            name = labels["alertname"]
            out[name] = max(out.get(name, 0.0), longest + self.profile.interval_seconds)
        return out

    def for_seconds(self, alertname: str) -> float:
        """The alert's `for:` in this run's rules, wall seconds."""
        return parse_duration(load_config(overrides=self.profile.overrides).for_(alertname))

    async def quiet(self, case: Case) -> Quiet:
        """What fired or went pending on the case besides its expected alerts, judged: nothing may
        fire, and a pending episode must stay under half the alert's `for:`. Pending is reached on
        transients by design: at a phase change (the end of a checkpoint) the two nodes are sampled and
        scraped up to an interval apart, so for one evaluation half the ranks look busy and half idle
        and the straggler's tensor signal holds; GPUIdleWhileAllocated reads the SM activity of the
        moment, so every pause (a checkpoint, a loader stall, a hang's spin) holds it while it lasts.
        `for:` filters both, and Alertmanager never sees a pending alert. The suspect GPU's side alerts
        (Case.side_alerts) may stay pending however long."""
        firing = sorted(
            {
                (name, labels.get("node", ""), labels.get("gpu", ""))
                for name, state, labels, _ in await self.alerts_during_run()
                if state == "firing" and case.owns(labels) and name not in case.expected
            }
        )
        runs = await self.pending_runs(lambda labels: case.owns(labels) and not case.excused(labels))
        pending = {n: s * self.profile.speed for n, s in runs.items() if n not in case.expected}
        too_long = sorted(
            n for n, s in runs.items() if n not in case.expected and s > self.for_seconds(n) / 2
        )
        return Quiet(firing, pending, too_long)

    async def timeline(self, case: Case) -> str:
        """What the training rules read on this case, as change points in scenario seconds after its
        onset (the start where it has none): written into a failure, so a flake explains itself."""
        job = f'namespace="{NAMESPACE}", training_job="{case.job}"'
        nodes = "|".join(case.nodes)
        queries = {
            "ALERTS": f"ALERTS{{{job}}}",
            "ranks": f"training_job:gpu_training_ranks:count{{{job}}}",
            "all ranks busy-idle": f"min(max by (rank) (rank:gpu_training_busy_idle:bool{{{job}}}))",
            "gpu_up == 0": f'gpu_up{{node=~"{nodes}"}} == 0',
            "stale": f'gpupulse_gpu_stale{{node=~"{nodes}"}} == 1',
            "xid": f'gpu_xid_errors_total{{node=~"{nodes}"}}',
            "rank_info": f"count by (node) (gpu_training_rank_info{{{job}}})",
        }
        now = time.time()
        zero = self.onset(case) if case.fault_at is not None else self.t_start
        step = self.profile.interval_seconds
        lines = []
        for name, expr in queries.items():
            data = await self.prom.api(
                "query", query=f"({expr})[{int(now - self.t_start) + 5}s:{step:g}s]", time=str(now)
            )
            for series in data["result"]:
                labels = {
                    k: v
                    for k, v in series["metric"].items()
                    if k in ("alertname", "alertstate", "node", "gpu", "xid")
                }
                changes, last, prev_ts = [], None, None
                for ts, value in series["values"]:
                    at = (float(ts) - zero) * self.profile.speed
                    if value != last or (prev_ts is not None and float(ts) - prev_ts > 1.5 * step):
                        changes.append(f"{at:.0f}s={value}")
                    last, prev_ts = value, float(ts)
                end = (float(series["values"][-1][0]) - zero) * self.profile.speed
                lines.append(f"  {name} {labels}: {' '.join(changes)} (to {end:.0f}s)")
        return "\n".join(lines)

    def pod_deletes(self, case: Case) -> list[str]:
        """Pod DELETE requests the controller sent for this case's job."""
        prefix = f"/api/v1/namespaces/{NAMESPACE}/pods/{case.job}-"
        return [r.path for r in self.api.requests if r.method == "DELETE" and r.path.startswith(prefix)]

    def cordoned(self, node: str) -> bool:
        return bool(self.api.nodes[node]["spec"].get("unschedulable"))

    def cordon_index(self, node: str) -> int | None:
        """Index in the request log of the PATCH that cordoned `node`."""
        for i, r in enumerate(self.api.requests):
            if (
                r.method == "PATCH"
                and r.path == f"/api/v1/nodes/{node}"
                and "unschedulable" in json.dumps(r.body)
            ):
                return i
        return None

    def first_delete_index(self, case: Case) -> int | None:
        prefix = f"/api/v1/namespaces/{NAMESPACE}/pods/{case.job}-"
        for i, r in enumerate(self.api.requests):
            if r.method == "DELETE" and r.path.startswith(prefix):
                return i
        return None

    async def controller(self, path: str) -> Any:
        headers = {"Authorization": f"Bearer {CONTROLLER_TOKEN}"}
        async with aiohttp.ClientSession() as s, s.get(f"{self.controller_url}{path}", headers=headers) as r:
            r.raise_for_status()
            return await r.json()

    async def incidents(self, case: Case) -> list[dict[str, Any]]:
        """The controller's incidents on this case's job, each with its ledger history."""
        out = []
        for item in (await self.controller("/api/v1/incidents?limit=500"))["incidents"]:
            if incident_of(case, item):
                out.append(await self.controller(f"/api/v1/incidents/{item['id']}"))
        return out

    async def actions(self, case: Case) -> list[tuple[str, str]]:
        """(rung, status) of every ledger action on this case's job."""
        return [
            (str(h["rung"]), str(h["status"]))
            for inc in await self.incidents(case)
            for h in inc["history"]
            if h["kind"] == "action"
        ]


def incident_of(case: Case, item: Mapping[str, Any]) -> bool:
    """An incident (as the controller's API lists it) whose target is this case's job, one of its pods
    or nodes: by the target's fields, exactly (a job `llama-a` is not `llama-a2`)."""
    target = item.get("target")
    if not isinstance(target, Mapping):
        return False
    labels = {k: str(v) for k, v in target.items() if isinstance(v, str)}
    return labels.get("namespace", NAMESPACE) in (NAMESPACE, "") and case.owns(labels)


def _seed_cluster(api: FakeKubeAPI, cases: Sequence[Case]) -> dict[str, JSON]:
    """Nodes, each case's PyTorchJob (with the UID its pods' ownerReferences carry) and its 16 pods."""
    jobs: dict[str, JSON] = {}
    for case in cases:
        docs = [yaml.safe_load(case.scenario(node).read_text()) for node in case.nodes]
        owner = docs[0]["pods"][0]["owner"]
        job = api.add_object(
            "kubeflow.org/v1",
            "pytorchjobs",
            NAMESPACE,
            case.job,
            spec={"pytorchReplicaSpecs": {"Master": {"replicas": 1}, "Worker": {"replicas": 15}}},
        )
        job["metadata"]["uid"] = owner["uid"]
        jobs[case.name] = job
        for node, doc in zip(case.nodes, docs, strict=True):
            api.add_node(node, labels={"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"})
            for entry in doc["pods"]:
                api.add_pod(
                    NAMESPACE, entry["name"], node, labels=dict(entry["labels"]), gpus=1, controller=job
                )
    return jobs


# the controller deletes a gang's pods one by one: the node's restart waits for all of the job's pods
# there, or this long after the first deletion (a pod the controller left alone: 409 on its UID)
RESTART_BATCH_SECONDS = 5.0
# the pids of a job's n-th run on a node: 9000 + rank + this x n
PID_STRIDE_PER_RUN = 10000


@dataclass(frozen=True)
class Restart:
    """One gang restart as the scheduler stand-in carried it out on one node."""

    job: str
    node: str
    attempt: int
    deleted_unix: float  # the first deletion of the batch
    started_unix: float  # the new pods bound and their processes started (0 until then)
    deleted_at: float  # scenario seconds
    start_at: float
    placements: Mapping[int, tuple[int, int]]  # rank -> (GPU index, pid)


class StandIn:
    """Plays training-operator, the scheduler and the kubelet around the controller's gang restarts.

    A deleted rank pod of a case whose scenarios have no `jobs` comes back at once under the same name
    with a new UID, on the node it left, while its simulated process plays on (the four-job replay).
    A case whose scenarios have `jobs` lives and dies: the kubelet kills the deleted pods' containers
    (their GPUs are free: pod-resources stops listing them), training-operator recreates the pods,
    which the scheduler stand-in places on the node's free GPUs `scheduler.delay_seconds` later (new
    UIDs, new PIDs, `exporter.sim.jobs.place_gang`), and the node's simulation is told through its
    inbox (exporter/sim/lifecycle.py). The scenario's own pod events play too: a container restart
    counts in its pod's status, a completed job's pods succeed and release their GPUs.
    """

    def __init__(self, api: FakeKubeAPI, jobs: Mapping[str, JSON], speed: float) -> None:
        self.api = api
        self.speed = speed
        self.by_uid = {str(j["metadata"]["uid"]): j for j in jobs.values()}
        self.exporters: list[Exporter] = []
        self.restarts: list[Restart] = []
        self.restart_counts: dict[str, int] = {}  # pod name -> its container's restart count
        self.errors: list[str] = []
        self._attempts: dict[tuple[str, str], int] = {}
        self._batches: dict[tuple[str, str], list[tuple[float, JSON]]] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._remove = api._remove_pod
        api._remove_pod = self._removed  # type: ignore[method-assign]

    def start(self, exporters: Sequence[Exporter]) -> None:
        """Begin playing the scenarios' pod events; deletions before this are only recreated."""
        self.exporters = list(exporters)
        for e in self.exporters:
            if e.scenario is not None and e.scenario.jobs:
                self._spawn(self._play_pod_events(e))

    def stop(self) -> None:
        for task in self._tasks:
            task.cancel()

    def _spawn(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            self.errors.append(repr(task.exception()))  # the replay checks that the world kept up

    def _exporter(self, node: str) -> Exporter | None:
        return next((e for e in self.exporters if e.node == node), None)

    def _removed(self, pod: JSON, via: str) -> None:
        self._remove(pod, via)
        meta = pod["metadata"]
        refs = meta.get("ownerReferences") or [{}]
        job = self.by_uid.get(str(refs[0].get("uid")))
        if job is None:
            return
        node = str(pod["spec"]["nodeName"])
        exporter = self._exporter(node)
        if exporter is None or exporter.scenario is None or not exporter.scenario.jobs:
            labels = dict(meta.get("labels") or {})
            self.api.add_pod(meta["namespace"], meta["name"], node, labels=labels, gpus=1, controller=job)
            return
        key = (str(job["metadata"]["name"]), node)
        batch = self._batches.setdefault(key, [])
        batch.append((time.time(), pod))
        here = {str(p["name"]) for p in exporter.doc["pods"]}
        if {str(p["metadata"]["name"]) for _, p in batch} >= here:
            self._flush(key, exporter, job)
        elif len(batch) == 1:
            asyncio.get_running_loop().call_later(RESTART_BATCH_SECONDS, self._flush, key, exporter, job)

    def _flush(self, key: tuple[str, str], exporter: Exporter, job: JSON) -> None:
        if self._batches.get(key):
            self._spawn(self._restart(key, exporter, job, self._batches.pop(key)))

    async def _restart(
        self, key: tuple[str, str], e: Exporter, owner: JSON, batch: list[tuple[float, JSON]]
    ) -> None:
        assert e.scenario is not None and e.kubelet is not None and e.inbox is not None
        job = next(j for j in e.scenario.jobs if j.name == key[0])
        names = {str(p["metadata"]["name"]) for _, p in batch}
        entries = [p for p in e.doc["pods"] if p["name"] in names]
        # the kubelet kills the deleted pods' containers: their GPUs are free again
        e.kubelet.pods = tuple(p for p in e.kubelet.pods if p.name not in names)
        held = {
            _gpu_index(d)
            for p in e.kubelet.pods
            for c in p.containers
            for dev in c.devices
            for d in dev.device_ids
        }
        free = [g.index for g in e.scenario.gpus if g.index not in held]
        ranks = [_rank_of(p) for p in entries]
        attempt = self._attempts[key] = self._attempts.get(key, 0) + 1
        placements = place_gang(ranks, free, 9000 + PID_STRIDE_PER_RUN * attempt + min(ranks))
        deleted_unix = batch[0][0]
        deleted_at = (deleted_unix - e.started_unix) * self.speed
        start_at = deleted_at + e.scenario.scheduler.delay_seconds
        command = {
            "op": "restart_gang", "job": job.name, "deleted_at": deleted_at, "start_at": start_at,
            "ranks": [{"rank": r, "gpu": g, "pid": pid} for r, (g, pid) in sorted(placements.items())],
        }  # fmt: skip
        with e.inbox.open("a") as f:
            f.write(json.dumps(command) + "\n")
        index = len(self.restarts)
        self.restarts.append(
            Restart(job.name, e.node, attempt, deleted_unix, 0.0, deleted_at, start_at, placements)
        )
        await asyncio.sleep(max(0.0, e.started_unix + start_at / self.speed - time.time()))
        # bound: the kubelet starts the new pods' containers on their GPUs
        assert e.tree is not None and e.pods_dir is not None
        models = {g.index: g.model for g in e.scenario.gpus}
        plan = plan_attempt(job, attempt, start_at, placements, models)
        e.processes = (*e.processes, *plan.processes)
        fresh = []
        for entry in entries:
            gpu, pid = placements[_rank_of(entry)]
            namespace, name = str(entry["namespace"]), str(entry["name"])
            pod = self.api.add_pod(
                namespace, name, e.node, labels=dict(entry["labels"]), gpus=1, controller=owner
            )
            uid = str(pod["metadata"]["uid"])
            write_pod_dir(e.pods_dir, uid, namespace, name)
            container = entry["containers"][0]
            e.tree.add(pid, cgroup_v2_systemd(uid, f"{pid:064x}"), comm=job.process_name[:15])
            e.tree.set_environ(pid, {str(k): str(v) for k, v in container["env"].items()})
            fresh.append({**entry, "containers": [{**container, "gpus": [gpu], "pids": [pid]}]})
        e.kubelet.pods = (*e.kubelet.pods, *pods_from_scenario({"gpus": e.doc["gpus"], "pods": fresh}))
        self.restarts[index] = dataclasses.replace(self.restarts[index], started_unix=time.time())

    async def _play_pod_events(self, e: Exporter) -> None:
        """The first run's pod events at their scenario times: restart counts, completion."""
        assert e.scenario is not None and e.kubelet is not None
        mine = {_rank_of(p): p for p in e.doc["pods"]}
        for job in e.scenario.jobs:
            for event in job.events_of(0):
                await asyncio.sleep(max(0.0, e.started_unix + event.at_seconds / self.speed - time.time()))
                if self._attempts.get((job.name, e.node), 0) > 0:
                    return  # the controller restarted the job: that run's events are over
                if event.kind == "container_restart" and event.rank in mine:
                    entry = mine[event.rank]
                    count = restart_count(job, event.rank, event.at_seconds)
                    self.restart_counts[str(entry["name"])] = count
                    self.api.update_pod(entry["namespace"], entry["name"], _restarted(count))
                elif event.kind == "complete":
                    names = {str(p["name"]) for p in mine.values()}
                    e.kubelet.pods = tuple(p for p in e.kubelet.pods if p.name not in names)
                    for entry in mine.values():
                        self.api.update_pod(entry["namespace"], entry["name"], _succeeded)


def _rank_of(entry: Mapping[str, Any]) -> int:
    return int(entry["containers"][0]["env"]["RANK"])


def _gpu_index(device_id: str) -> int:
    """A kubelet device id of the scenarios' GPUs (`nvidia<index>`, GKE's spelling) as its index."""
    return int(device_id.removeprefix("nvidia"))


def _container_status(restarts: int, ready: bool, state: JSON) -> JSON:
    """A containerStatuses entry with every field the API requires (the client validates them)."""
    return {
        "name": "pytorch", "image": "registry.example/app:1",
        "imageID": "registry.example/app@sha256:" + "0" * 64, "ready": ready, "restartCount": restarts,
        "started": ready, "state": state,
    }  # fmt: skip


def _restarted(count: int) -> Callable[[JSON], None]:
    def change(pod: JSON) -> None:
        running = {"running": {"startedAt": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")}}
        pod["status"]["containerStatuses"] = [_container_status(count, True, running)]

    return change


def _succeeded(pod: JSON) -> None:
    pod["status"]["phase"] = "Succeeded"
    done = {"terminated": {"exitCode": 0, "reason": "Completed"}}
    restarts = [int(c.get("restartCount", 0)) for c in pod["status"].get("containerStatuses") or ()]
    pod["status"]["containerStatuses"] = [_container_status(max(restarts, default=0), False, done)]


def _log_start(log: Path) -> float | None:
    """Unix time of an exporter log's first line (`2026-12-01T14:51:26.889Z INFO ...`)."""
    try:
        first = log.read_text(errors="replace").split("\n", 1)[0]
    except OSError:
        return None
    stamp = first.split(" ", 1)[0]
    if not stamp.endswith("Z"):
        return None
    try:
        return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


async def _wait(url: str, proc: asyncio.subprocess.Process) -> None:
    await wait_http(url, proc, 60.0)  # eight exporters start at once on two cores


def exporter_kube_flags(api: FakeKubeAPI, node: str, token_file: Path) -> list[str]:
    """The exporter's pod-watch flags (issue 13, part A; one store for every plug-in since issue 37):
    API server, this node, credentials."""
    return ["--kube.api-url", api.url, "--kube.node-name", node, "--kube.token-file", str(token_file)]


async def _start_exporter(
    stack: AsyncExitStack, case: Case, node: str, profile: Profile, api: FakeKubeAPI, tmp: Path, short: Path
) -> Exporter:
    doc = yaml.safe_load(case.scenario(node).read_text())
    scenario = load_scenario(str(case.scenario(node)))
    simulate, inbox = case.scenario(node), None
    if scenario.jobs:  # ranks that live and die: the node reads the stand-in's restarts from its inbox
        inbox = tmp / f"{node}.inbox.jsonl"
        simulate = tmp / f"{node}.yaml"
        simulate.write_text(
            yaml.safe_dump({**doc, "scheduler": {**doc.get("scheduler", {}), "inbox": str(inbox)}})
        )
    kubelet = FakeKubelet(str(short / f"{node}.sock"), pods_from_scenario(doc))
    await kubelet.start()
    stack.push_async_callback(kubelet.stop)
    tree = ProcfsTree(tmp / f"{node}-proc")
    # a job's processes are made by its `jobs` entry, not listed under `processes`
    listed = [{"pid": p.pid, "name": p.name} for p in scenario.processes]
    procfs_from_scenario(tree, tmp / f"{node}-pods", {**doc, "processes": listed})
    token = tmp / "token"
    token.write_text(api.token)
    port = free_port()
    interval = f"{profile.sampling_seconds:g}"
    args = [
        str(BIN / "gpupulse-exporter"),
        "--simulate", str(simulate),
        "--simulate.speed", f"{profile.speed:g}",
        "--attribution.kubelet-socket", kubelet.socket_path,
        "--attribution.kubelet-pods-dir", str(tmp / f"{node}-pods"),
        "--path.procfs", str(tree.root),
        "--attribution.interval", interval,
        "--attribution.kubelet-refresh-interval", "1",
        *exporter_kube_flags(api, node, token),
        *(_progress_flags(api, node, token, tmp, interval) if case.progress_step_seconds else []),
        "--web.listen-address", f"127.0.0.1:{port}",
        "--sampling.interval", interval,
        "--log.format", "text",
    ]  # fmt: skip
    log = tmp / f"{node}.log"
    proc = await stack.enter_async_context(child_process(args, log))
    return Exporter(
        case, node, port, proc, log, procfs=tree.root, processes=scenario.processes, scenario=scenario,
        doc=doc, kubelet=kubelet, tree=tree, pods_dir=tmp / f"{node}-pods", inbox=inbox,
    )  # fmt: skip


def _progress_flags(api: FakeKubeAPI, node: str, token: Path, tmp: Path, interval: str) -> list[str]:
    """The progress collector on this node's pod logs (kubelet's /var/log/pods, here under tmp); its
    pods come from the shared store of exporter_kube_flags."""
    return [
        "--progress.pod-logs-dir", str(tmp / f"{node}-logs"),
        "--progress.interval", interval,
    ]  # fmt: skip


async def _play_steps(exporters: Sequence[Exporter], api: FakeKubeAPI, tmp: Path, speed: float) -> None:
    """Rank 0 of each job with a progress signal prints DeepSpeed's step line, in kubelet's CRI format,
    every progress_step_seconds of scenario time until its fault's onset, then nothing (it hangs)."""
    written: dict[Path, int] = {}
    while True:
        now = time.time()
        for e in exporters:
            case, step_seconds = e.case, e.case.progress_step_seconds
            if not step_seconds or e.node != case.nodes[0] or not e.started_unix:
                continue
            pod = api.pods.get((NAMESPACE, f"{case.job}-master-0"))
            scenario_t = (now - e.started_unix) * speed
            if pod is None or (case.fault_at is not None and scenario_t >= case.fault_at):
                continue
            meta = pod["metadata"]
            log = tmp / f"{e.node}-logs" / f"{NAMESPACE}_{meta['name']}_{meta['uid']}" / "main" / "0.log"
            step = int(scenario_t // step_seconds)
            if written.get(log) != step:
                log.parent.mkdir(parents=True, exist_ok=True)
                stamp = datetime.fromtimestamp(now, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
                with log.open("a") as f:
                    f.write(
                        f"{stamp} stderr F [Rank 0] step={step}, skipped=0, lr=[0.0003], mom=[(0.9, 0.95)]\n"
                    )
                written[log] = step
        await asyncio.sleep(0.1)


async def _play_host(exporters: Sequence[Exporter], speed: float) -> None:
    """Each exporter's fake /proc along its scenario's host curves (CPU, I/O bytes, state), in
    scenario time, until cancelled: what the kernel would show of the simulated processes."""
    ticks = os.sysconf("SC_CLK_TCK")
    while True:
        now = time.time()
        for e in exporters:
            if e.procfs is not None and e.started_unix:
                advance_host_cpu(e.procfs, e.processes, (now - e.started_unix) * speed, ticks)
        await asyncio.sleep(0.2)


def _prometheus_config(exporters: Sequence[Exporter], rules: Sequence[str], am: str, interval: float) -> str:
    every = f"{interval:g}s"
    return yaml.safe_dump(
        {
            "global": {
                "scrape_interval": every,
                "scrape_timeout": f"{int(min(interval * 0.9, 10) * 1000)}ms",
                "evaluation_interval": every,
            },
            "rule_files": list(rules),
            "alerting": {"alertmanagers": [{"static_configs": [{"targets": [am]}]}]},
            "scrape_configs": [
                {
                    "job_name": e.job,
                    # the node label comes from the scrape config, never from the exporter
                    "static_configs": [{"targets": [f"127.0.0.1:{e.port}"], "labels": {"node": e.node}}],
                }
                for e in exporters
            ],
        }
    )


@asynccontextmanager
async def running_replay(
    cases: Sequence[Case], profile: Profile, tmp: Path, signatures: Sequence[Mapping[str, Any]] = ()
) -> AsyncIterator[Replay]:
    """Start everything for these cases; yields once Prometheus scrapes every exporter. `signatures`
    replace the controller's shipped ones of the same name (e.g. shorter timers)."""
    rules = []
    for name, text in render_rules(overrides=profile.overrides).items():
        (tmp / name).write_text(text)
        rules.append(tmp / name)
    async with AsyncExitStack() as stack:
        short = Path(tempfile.mkdtemp(prefix="gp-"))  # unix socket paths are limited to 108 bytes
        stack.callback(shutil.rmtree, short, True)
        api = FakeKubeAPI()
        await api.start()
        stack.push_async_callback(api.stop)
        jobs = _seed_cluster(api, cases)
        stand_in = StandIn(api, jobs, profile.speed)
        stack.callback(stand_in.stop)

        # the controller and Alertmanager first: the scenarios' clocks start with the exporters
        controller = await _start_controller(stack, api, tmp, signatures)
        token_file = tmp / "controller-token"
        token_file.write_text(CONTROLLER_TOKEN)
        am_config = alertmanager_config(f"{controller}/api/v1/alerts", token_file)
        am_config["route"]["group_wait"] = profile.group_wait
        am_config["route"]["group_interval"] = profile.group_interval
        am = await stack.enter_async_context(running_alertmanager(am_config))
        # Prometheus too, scraping nothing yet: its config is reloaded with the exporters once they
        # answer (a scrape of an exporter still starting would be an exporter-down alert)
        rule_names = [r.name for r in rules]
        prom = await stack.enter_async_context(
            running_prometheus(
                _prometheus_config([], rule_names, am.address, profile.interval_seconds),
                rule_files=rules,
                extra_args=["--web.enable-lifecycle"],
            )
        )

        exporters = [
            await _start_exporter(stack, case, node, profile, api, tmp, short)
            for case in cases
            for node in case.nodes
        ]
        await asyncio.gather(*(_wait(f"http://127.0.0.1:{e.port}/metrics", e.proc) for e in exporters))
        for e in exporters:
            started = _log_start(e.log)
            if started is None:
                raise RuntimeError(f"{e.node}: no timestamped first log line in {e.log}")
            e.started_unix = started
        host = asyncio.create_task(_play_host(exporters, profile.speed))
        stack.callback(host.cancel)
        if any(c.progress_step_seconds for c in cases):
            steps = asyncio.create_task(_play_steps(exporters, api, tmp, profile.speed))
            stack.callback(steps.cancel)
        stand_in.start(exporters)
        t_start = time.time()
        config = _prometheus_config(exporters, rule_names, am.address, profile.interval_seconds)
        (prom.workdir / "prometheus.yml").write_text(config)
        async with aiohttp.ClientSession() as session, session.post(f"{prom.url}/-/reload") as resp:
            if resp.status != 200:
                raise RuntimeError(f"prometheus reload: {resp.status} {await resp.text()}")
        for e in exporters:
            await prom.wait_for(f'up{{job="{e.job}"}} == 1', timeout_seconds=60)
        yield Replay(profile, tuple(cases), api, prom, am, controller, exporters, t_start, jobs, stand_in)


async def _start_controller(
    stack: AsyncExitStack, api: FakeKubeAPI, tmp: Path, signatures: Sequence[Mapping[str, Any]] = ()
) -> str:
    kubeconfig = api.write_kubeconfig(tmp / "kubeconfig")
    extra = []
    if signatures:
        folder = tmp / "signatures"
        folder.mkdir()
        (folder / "replay.yaml").write_text(yaml.safe_dump({"signatures": list(signatures)}, sort_keys=False))
        extra.append(f"--signatures={folder}")
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUPULSE_REMEDIATION_")}
    env["GPUPULSE_REMEDIATION_TOKEN"] = CONTROLLER_TOKEN
    args = [
        str(BIN / "gpupulse-remediation"),
        "serve",
        f"--web.listen-address=127.0.0.1:{port}",
        f"--storage.path={tmp / 'controller'}",
        "--backend=kubernetes",
        f"--kube.kubeconfig={kubeconfig}",
        "--kube.namespace=gpupulse",
        "--kube.identity=gpupulse-remediation-0",
        f"--scope.namespaces={NAMESPACE}",
        f"--cluster.node-count={CLUSTER_NODES}",
        "--engine.tick-interval=200ms",
        *extra,
    ]
    proc = await stack.enter_async_context(child_process(args, tmp / "controller.log", env))
    url = f"http://127.0.0.1:{port}"
    await _wait(f"{url}/readyz", proc)
    return url
