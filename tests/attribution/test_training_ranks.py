"""gpu_training_rank_info end to end: simulated NVML + the fake kubelet (pod-resources) + a fake /proc
(environ per PID) + the in-process API server (pod labels and owners, watched through
the exporter's own client), through the exporter's sampler to /metrics."""

from __future__ import annotations

import asyncio
import contextlib
import copy
import logging
import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from exporter.attribution.collector import AttributionCollector, AttributionSettings
from exporter.attribution.podmeta import pod_metas
from exporter.attribution.ranks import EnvironCache, RankRow, rank_info_family
from exporter.collectors.training import pod_meta
from exporter.host.procfs import Procfs
from exporter.kube.client import ApiSettings
from exporter.kube.pods import PodStore
from tests.attribution.helpers import ProcfsTree, procfs_from_scenario
from tests.exporter.harness import simulated_exporter
from tests.fakes.kube_api import FakeKubeAPI, pods_to_api_from_scenario
from tests.fakes.kubelet import FakeKubelet, pods_from_scenario

SCENARIO = Path(__file__).resolve().parents[1] / "fixtures" / "attribution" / "training-node.yaml"
DOC: dict[str, Any] = yaml.safe_load(SCENARIO.read_text())
UUIDS = [str(g["uuid"]) for g in DOC["gpus"]]
LABELS = ("gpu", "namespace", "pod", "training_job_kind", "training_job", "rank", "local_rank", "world_size")
TORCHRUN_ENV = {
    "RANK": "3",
    "LOCAL_RANK": "3",
    "WORLD_SIZE": "4",
    "MASTER_ADDR": "10.0.0.5",
    "MASTER_PORT": "29500",
}

PYTORCHJOB = "PyTorchJob.kubeflow.org"
EXPECTED = {
    ("0", "research", "llama-train-worker-3", PYTORCHJOB, "llama-train", "8", "0", "16"),
    ("1", "research", "llama-train-worker-3", PYTORCHJOB, "llama-train", "8", "0", "16"),
    ("2", "research", "mix-workers-0-1-x7k2p", "JobSet.jobset.x-k8s.io", "mix", "1", "0", "4"),
    ("3", "batch", "sweep-2-q8d9z", "Job.batch", "sweep", "2", "", ""),
    ("4", "", "", "torchrun", "10.0.0.5:29500", "3", "3", "4"),
    ("6", "research", "bert-train-worker-5", PYTORCHJOB, "bert-train", "5", "", ""),
    ("7", "research", "short-train-worker-0", PYTORCHJOB, "short-train", "0", "0", "1"),
}


def ranks(text: str) -> set[tuple[str, ...]]:
    """gpu_training_rank_info rows of an exposition (parsed by the client library, escapes and all)."""
    out = set()
    for fam in text_string_to_metric_families(text):
        if fam.name == "gpu_training_rank_info":
            for s in fam.samples:
                assert s.value == 1.0
                assert s.labels["uuid"] == UUIDS[int(s.labels["gpu"])]
                out.add(tuple(s.labels[k] for k in LABELS))
    return out


def dropped(text: str) -> float:
    for fam in text_string_to_metric_families(text):
        if fam.name == "gpupulse_series_dropped":
            for s in fam.samples:
                if s.labels.get("collector") == "attribution" and s.name.endswith("_total"):
                    return s.value
    return 0.0


@pytest.fixture
async def api() -> AsyncIterator[FakeKubeAPI]:
    server = FakeKubeAPI()
    await server.start()
    yield server
    await server.stop()


class Node:
    """The scenario's node: kubelet, /proc and API server seeded from one (possibly edited) doc."""

    def __init__(self, api: FakeKubeAPI, kubelet: FakeKubelet, procfs: ProcfsTree, tmp_path: Path) -> None:
        self.api, self.kubelet, self.procfs, self.tmp = api, kubelet, procfs, tmp_path
        self.doc = copy.deepcopy(DOC)

    def seed(self, *, api: bool = True) -> None:
        self.kubelet.pods = pods_from_scenario(self.doc)
        procfs_from_scenario(self.procfs, self.tmp / "pods", self.doc)
        self.procfs.set_environ(9301, TORCHRUN_ENV)  # the torchrun process outside any pod
        (self.procfs.root / "9501" / "environ").mkdir()  # reading it fails (EISDIR), as EACCES would
        if api:
            pods_to_api_from_scenario(self.api, self.doc)

    def collector(self, *, watch: bool = True, **overrides: Any) -> AttributionCollector:
        settings = AttributionSettings(
            interval_seconds=1.0,
            kubelet_socket_path=self.kubelet.socket_path,
            kubelet_pods_dir=str(self.tmp / "pods"),
            procfs_path=str(self.procfs.root),
            kubelet_first_wait_seconds=5,
            **{"procfs_timeout_seconds": 10.0, "pod_lookup_timeout_seconds": 10.0, **overrides},
        )
        collector = AttributionCollector(settings, procfs=Procfs(str(self.procfs.root), 100))
        if watch:
            token = self.tmp / "token"
            token.write_text(self.api.token)
            node = str(self.doc["node"])
            collector.use_pods(
                PodStore(ApiSettings(node, self.api.url, token_path=token, ca_path=None, retry_seconds=0.05))
            )
        return collector


@contextlib.asynccontextmanager
async def exporter(collector: AttributionCollector) -> AsyncIterator[Any]:
    try:
        async with simulated_exporter(SCENARIO, collectors=["device", "processes"], extra=[collector]) as h:
            for _ in range(3):  # publish processes, attribute them, label them
                await h.tick(1.0)
            yield h
    finally:
        await collector.close()
        if collector.pods is not None:  # the exporter's shared store, closed after its readers
            await collector.pods.store.close()


@pytest.fixture
def node(api: FakeKubeAPI, kubelet: FakeKubelet, procfs: ProcfsTree, tmp_path: Path) -> Node:
    return Node(api, kubelet, procfs, tmp_path)


async def test_one_series_per_rank_and_gpu_for_every_job_kind(node: Node) -> None:
    node.seed()
    async with exporter(node.collector()) as h:
        text = h.text()
    # PyTorchJob from its owner (one process on two GPUs: two rows), the JobSet label over its child
    # Job, an indexed Job's rank from its completion index, a torchrun process without a pod named
    # after its rendezvous, the Deployment's pod absent, the unreadable environ's rank from the pod
    assert ranks(text) == EXPECTED
    assert 'gpupulse_collector_success{collector="attribution"} 1.0' in text


async def test_a_deleted_pods_series_is_removed_and_the_others_stay(node: Node) -> None:
    node.seed()
    async with exporter(node.collector()) as h:
        assert ("7", "research", "short-train-worker-0") in {r[:3] for r in ranks(h.text())}
        # the process ends at 60 s; its pod goes from the kubelet and the API server
        node.api.remove_pod("research", "short-train-worker-0")
        node.kubelet.pods = tuple(p for p in node.kubelet.pods if p.name != "short-train-worker-0")
        node.procfs.remove(9601)
        for _ in range(3):
            await h.tick(30.0)
        text = h.text()
    assert ranks(text) == {r for r in EXPECTED if r[0] != "7"}


async def test_without_the_pod_watch_the_environ_alone_names_ranks(node: Node) -> None:
    node.seed(api=False)
    async with exporter(node.collector(watch=False)) as h:
        text = h.text()
    # without labels and owners, a process with the launcher variables is a torchrun job named after
    # its rendezvous; the pods' namespace and name still come from the kubelet
    assert ranks(text) == {
        ("0", "research", "llama-train-worker-3", "torchrun", "llama-train-master-0:23456", "8", "0", "16"),
        ("1", "research", "llama-train-worker-3", "torchrun", "llama-train-master-0:23456", "8", "0", "16"),
        ("2", "research", "mix-workers-0-1-x7k2p", "torchrun", "mix-workers-0-0.mix:29500", "1", "0", "4"),
        ("4", "", "", "torchrun", "10.0.0.5:29500", "3", "3", "4"),
        ("7", "research", "short-train-worker-0", "torchrun", "localhost:29500", "0", "0", "1"),
    }


async def test_an_api_server_that_refuses_leaves_environ_identities(node: Node) -> None:
    node.seed()
    node.api.fail("GET", "/api/v1/pods", 403, "Forbidden", times=1000)
    async with exporter(node.collector()) as h:
        text = h.text()
    assert ("4", "", "", "torchrun", "10.0.0.5:29500", "3", "3", "4") in ranks(text)
    assert {r[3] for r in ranks(text)} == {"torchrun"}


async def test_the_cap_bounds_series_counts_the_rest_and_keeps_exported_rows(
    node: Node, caplog: pytest.LogCaptureFixture
) -> None:
    node.seed()
    with caplog.at_level(logging.WARNING, "exporter.attribution.collector"):
        async with exporter(node.collector(max_ranks=3)) as h:
            first, before = ranks(h.text()), dropped(h.text())
            for _ in range(2):
                await h.tick(1.0)
            text = h.text()
    assert len(first) == 3 and ranks(text) == first  # the same three, round after round
    assert dropped(text) - before == 2 * (len(EXPECTED) - 3)  # every round counts the four left out
    warnings = [r for r in caplog.records if "max-ranks" in r.getMessage()]
    assert len(warnings) == 1  # once when the cap is reached, not every round


async def test_hostile_environs_and_labels(node: Node) -> None:
    pods = {p["name"]: p for p in node.doc["pods"]}
    odd = 'mix"\\\n{x="y"}'  # quotes, a backslash, a newline, braces: escaped in the exposition
    pods["mix-workers-0-1-x7k2p"]["labels"]["jobset.sigs.k8s.io/jobset-name"] = odd
    node.seed()
    # llama: RANK beyond the 256 KiB read (a huge environ): the rank comes from the pod's index label
    node.procfs.set_environ(9001, b"PAD=" + b"x" * (300 * 1024) + b"\0RANK=8\0WORLD_SIZE=16\0")
    # short-train: a RANK that is no integer and a WORLD_SIZE too large to be one: empty labels
    node.procfs.set_environ(9601, {"RANK": "eight", "WORLD_SIZE": "9" * 40, "LOCAL_RANK": "-1"})
    async with exporter(node.collector()) as h:
        text = h.text()
    rows = {r[0]: r for r in ranks(text)}
    assert rows["0"] == ("0", "research", "llama-train-worker-3", PYTORCHJOB, "llama-train", "3", "", "")
    assert rows["2"][3:5] == ("JobSet.jobset.x-k8s.io", odd)
    assert rows["7"] == ("7", "research", "short-train-worker-0", PYTORCHJOB, "short-train", "0", "", "")


async def test_a_hung_environ_read_costs_only_its_pid(node: Node) -> None:
    node.seed()
    fifo = node.procfs.root / "9101" / "environ"
    fifo.unlink()
    os.mkfifo(fifo)  # opening it blocks until a writer comes: a read stuck in the kernel
    collector = node.collector(procfs_timeout_seconds=0.5, procfs_item_timeout_seconds=0.1)
    try:
        async with exporter(collector) as h:
            text = h.text()
    finally:
        fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)  # let the stuck reader return
        os.close(fd)
    rows = {r[0]: r for r in ranks(text)}
    # the JobSet pod's rank falls back to its completion index; every other rank is there
    assert rows["2"] == (
        "2",
        "research",
        "mix-workers-0-1-x7k2p",
        "JobSet.jobset.x-k8s.io",
        "mix",
        "1",
        "",
        "",
    )
    assert set(rows) == {r[0] for r in EXPECTED}


async def test_environ_is_read_once_per_pid_and_dropped_when_the_pid_is_gone(procfs: ProcfsTree) -> None:
    procfs.add(1, "0::/\n")
    procfs.add(2, "0::/\n")
    procfs.set_environ(1, {"RANK": "1"})
    procfs.set_environ(2, {"RANK": "2"})
    cache = EnvironCache(str(procfs.root))
    try:
        assert await cache.read({1, 2}, 1.0, 0.5) == {1: {"RANK": "1"}, 2: {"RANK": "2"}}
        procfs.set_environ(1, {"RANK": "9"})  # never happens after exec; shows it is not re-read
        assert await cache.read({1}, 1.0, 0.5) == {1: {"RANK": "1"}}
        assert len(cache) == 1
        await asyncio.sleep(0)
    finally:
        cache.close()


def test_pod_meta_keeps_string_labels_and_only_the_controller_reference() -> None:
    pod = {
        "metadata": {
            "labels": {"a": "1", "b": 2},
            "ownerReferences": [
                {"apiVersion": "v1", "kind": "ConfigMap", "name": "x", "uid": "u0"},
                {
                    "apiVersion": "kubeflow.org/v1",
                    "kind": "PyTorchJob",
                    "name": "j",
                    "uid": "u1",
                    "controller": True,
                },
            ],
        }
    }
    meta = pod_meta(pod)
    assert meta.labels == {"a": "1"}
    assert [r["name"] for r in meta.owner_refs] == ["j"]
    assert pod_meta({"metadata": {"labels": "junk", "ownerReferences": "junk"}}).owner_refs == ()


def test_rank_info_family_is_one_series_per_row() -> None:
    row = RankRow("GPU-1", "0", "ns", "p", PYTORCHJOB, "j", "0", "0", "2")
    fam = rank_info_family([row])
    assert [(s.labels["training_job"], s.value) for s in fam.samples] == [("j", 1.0)]


def test_the_cap_keeps_rows_exported_before_over_newcomers() -> None:
    from exporter.attribution.ranks import cap_rows

    a, b, c = (RankRow(f"GPU-{i}", str(i), "ns", "p", PYTORCHJOB, "j", str(i), "", "") for i in range(3))
    assert cap_rows([a, b, c], {c}, 1) == [c]
    assert cap_rows([c, b, a], set(), 2) == [a, b]


def test_the_series_the_training_rules_read_is_the_catalogs() -> None:
    from alerts.rules.hardware import RANK_INFO
    from gpupulse.metrics.catalog import ALL_SPECS
    from tests.alerts.ruleset import known_metrics

    (spec,) = [s for s in ALL_SPECS if s.name == RANK_INFO]
    assert spec.labels == ("uuid", "gpu", *LABELS[1:])
    assert spec.type == "info"
    assert RANK_INFO in known_metrics()


async def test_the_pod_watch_follows_adds_changes_and_deletes(api: FakeKubeAPI, tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text(api.token)
    api.add_pod("research", "w-0", "gpu-node-train", labels={"jobset.sigs.k8s.io/jobset-name": "a"})
    api.add_pod("research", "elsewhere", "other-node", labels={"jobset.sigs.k8s.io/jobset-name": "b"})
    source = PodStore(
        ApiSettings("gpu-node-train", api.url, token_path=token, ca_path=None, retry_seconds=0.05)
    )
    metas = source.view("attribution", pod_metas)
    source.start()
    try:
        await source.wait_until(lambda: ("research", "w-0") in metas.value, 10)
        assert ("research", "elsewhere") not in metas.value  # only this node's pods
        api.update_pod("research", "w-0", lambda p: p["metadata"]["labels"].update({"x": "1"}))
        await source.wait_until(
            lambda: (m := metas.value.get(("research", "w-0"))) is not None and "x" in m.labels, 10
        )
        api.remove_pod("research", "w-0")
        await source.wait_until(lambda: ("research", "w-0") not in metas.value, 10)
        assert len(metas.value) == 0 and source.stats.lists == 1
    finally:
        await source.close()


async def test_a_pod_the_watch_has_not_delivered_yet_gets_no_row_until_it_does(node: Node) -> None:
    node.seed()
    # the kubelet lists the pod before the API server's watch delivers it
    node.api.remove_pod("research", "llama-train-worker-3")
    async with exporter(node.collector()) as h:
        early = ranks(h.text())
        (entry,) = [p for p in node.doc["pods"] if p["name"] == "llama-train-worker-3"]
        pods_to_api_from_scenario(node.api, {**node.doc, "pods": [entry]})
        for _ in range(3):
            await h.tick(1.0)
        late = ranks(h.text())
    # never a `torchrun` identity that would flip to the PyTorchJob's a round later (two jobs for one)
    worker = "llama-train-worker-3"
    assert {r for r in early if r[2] == worker} == set()
    assert {r for r in late if r[2] == worker} == {r for r in EXPECTED if r[2] == worker}
    assert early == {r for r in EXPECTED if r[2] != worker}
