"""The stalled-rank hang's ladder on the real engine and Kubernetes backend: a 2 x 8 PyTorchJob hung on
one idle rank restarts as a gang, as for a dead rank; when it hangs on that rank again within the
cooldown, the rank's node is cordoned before the second restart, and a human is paged with the evidence."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from remediation.kube.client import KubeClient
from tests.fakes.kube_api import FakeKubeAPI
from tests.kube.conftest import StepClock
from tests.kube.test_job_ladder_e2e import JOB, Rig, _event, _play_operator
from tests.kube.test_job_restart import NODES, pytorchjob

STALLED = {
    "alertname": "TrainingRankStalled",
    "severity": "critical",
    "layer": "training",
    "fault_class": "training_hang",
    **JOB,
    "node": "gpu-b",
    "uuid": "GPU-b2",
    "gpu": "2",
    "rank": "10",
    "pod": "llama-worker-10",
    "evidence": "disk_sleep",
}


async def test_a_rank_stalled_twice_restarts_the_job_then_cordons_its_node_before_the_second_restart(
    kube_api: FakeKubeAPI, kube_client: KubeClient, clock: StepClock, tmp_path: Path
) -> None:
    for node in NODES:
        kube_api.add_node(node)
    pytorchjob(kube_api)
    rig = Rig(kube_api, kube_client, clock, tmp_path)
    stalled = _event(rig.clock, STALLED, "fp-stalled")
    await rig.send(stalled)
    # first time: the whole gang restarts through its owner, no node is touched
    assert len(kube_api.deleted) == 16
    assert not any(n.get("spec", {}).get("unschedulable") for n in kube_api.nodes.values())
    assert rig.actions() == [("restart", "success")]
    (incident,) = rig.engine.list_incidents(limit=10)
    assert incident["signature"] == "training-job-hung"
    _play_operator(kube_api)
    rig.clock.advance(300)
    await rig.send(replace(stalled, status="resolved", received_at=rig.clock.utcnow()))
    # the same rank stalls again within the cooldown: cordon its node, then restart the job
    rig.clock.advance(600)
    await rig.send(_event(rig.clock, STALLED, "fp-stalled"))
    assert kube_api.nodes["gpu-b"]["spec"]["unschedulable"] is True
    assert not kube_api.nodes["gpu-a"].get("spec", {}).get("unschedulable")
    assert len(kube_api.deleted) == 32, "the second restart is a gang restart too"
    assert not kube_api.calls("POST", "/eviction")
    assert rig.actions() == [("restart", "success"), ("migrate", "success"), ("page", "success")]
    # the node stays cordoned for a human, who is paged with the suspect
    (page,) = rig.pager.firing
    for evidence in ("rank 10", "pod train/llama-worker-10", "GPU 2 (GPU-b2)", "node gpu-b"):
        assert evidence in page.summary, (evidence, page.summary)
    await rig.engine.aclose()


async def test_a_hang_that_returns_on_another_node_pages_and_cordons_nothing(
    kube_api: FakeKubeAPI, kube_client: KubeClient, clock: StepClock, tmp_path: Path
) -> None:
    for node in NODES:
        kube_api.add_node(node)
    pytorchjob(kube_api)
    rig = Rig(kube_api, kube_client, clock, tmp_path)
    stalled = _event(rig.clock, STALLED, "fp-stalled")
    await rig.send(stalled)
    _play_operator(kube_api)
    rig.clock.advance(300)
    await rig.send(replace(stalled, status="resolved", received_at=rig.clock.utcnow()))
    rig.clock.advance(600)
    # the job hangs again, now on a rank of the other node: neither node is shown to be the cause
    other = {**STALLED, "node": "gpu-a", "uuid": "GPU-a4", "gpu": "4", "rank": "4", "pod": "llama-worker-4"}
    await rig.send(_event(rig.clock, other, "fp-stalled-a"))
    assert not any(n.get("spec", {}).get("unschedulable") for n in kube_api.nodes.values())
    assert len(kube_api.deleted) == 16
    assert rig.actions() == [("restart", "success"), ("page", "success")]
    assert len(rig.pager.firing) == 1
    await rig.engine.aclose()
