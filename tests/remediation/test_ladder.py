"""The ladder's own rules: next rung and attempt, the fall-back to a page, and target identity."""

from __future__ import annotations

from pathlib import Path

import pytest

from remediation.ladder import first_step, incident_identity, loop_identity, next_step, target_from_labels
from remediation.model import Target
from remediation.settings import EngineSettings
from remediation.signatures import LadderSpec
from tests.remediation.test_engine_support import XID_RESET, Rig

FULL = LadderSpec(rungs=("restart", "migrate", "page"), attempts={"restart": 2, "migrate": 1})


def test_a_rung_with_attempts_left_is_tried_again_before_the_next() -> None:
    assert next_step(FULL, "restart", 1) == ("restart", 2)
    assert next_step(FULL, "restart", 2) == ("migrate", 1)
    assert next_step(FULL, "migrate", 1) == ("page", 1)


def test_every_attempt_is_counted_up_to_the_last() -> None:
    three = LadderSpec(rungs=("restart", "migrate", "page"), attempts={"restart": 3, "migrate": 2})
    assert [next_step(three, "restart", a) for a in (1, 2, 3)] == [
        ("restart", 2),
        ("restart", 3),
        ("migrate", 1),
    ]
    assert [next_step(three, "migrate", a) for a in (1, 2)] == [("migrate", 2), ("page", 1)]


def test_an_incident_past_its_attempts_moves_on_when_the_signature_allows_fewer() -> None:
    # an incident at attempt 3 when a reloaded signature allows 2: never retried again and again
    fewer = LadderSpec(rungs=("restart", "migrate", "page"), attempts={"restart": 2})
    assert next_step(fewer, "restart", 3) == ("migrate", 1)
    assert next_step(fewer, "migrate", 2) == ("page", 1)


def test_a_blocked_rung_is_not_retried_even_with_attempts_left() -> None:
    assert next_step(FULL, "restart", 1, frozenset({"restart"})) == ("migrate", 1)


def test_every_rung_blocked_falls_back_to_a_page() -> None:
    everything = frozenset({"restart", "migrate"})
    assert first_step(FULL, everything) == ("page", 1)
    assert next_step(FULL, "restart", 1, everything) == ("page", 1)


def test_a_ladder_without_a_page_rung_still_ends_with_a_page() -> None:
    # validation requires page last; the ladder must not depend on it to reach a human
    bare = LadderSpec(rungs=("restart",), attempts={})
    assert next_step(bare, "restart", 1) == ("page", 1)
    assert first_step(bare, frozenset({"restart"})) == ("page", 1)


@pytest.mark.parametrize(
    ("labels", "kind"),
    [
        ({"pod": "p", "namespace": "ns", "uuid": "GPU-1", "node": "n"}, "pod"),
        ({"uuid": "GPU-1", "node": "n"}, "gpu"),
        ({"node": "n"}, "node"),
        ({"instance": "10.0.0.7:9400"}, "exporter"),
    ],
)
def test_without_target_kind_the_kind_is_guessed_but_never_trusted(labels: dict[str, str], kind: str) -> None:
    target, known = target_from_labels(labels)
    assert (target.kind, known) == (kind, False)


def test_an_exporter_target_takes_its_node_from_instance_when_no_node_label() -> None:
    target, known = target_from_labels({"target_kind": "exporter", "instance": "10.0.0.7:9400"})
    assert (target.node, known) == ("10.0.0.7:9400", True)
    named, _ = target_from_labels({"target_kind": "exporter", "instance": "10.0.0.7:9400", "node": "n1"})
    assert named.node == "n1"
    gpu, _ = target_from_labels({"target_kind": "gpu", "instance": "10.0.0.7:9400", "uuid": "GPU-1"})
    assert gpu.node == ""  # only exporters stand in their scrape address for a node


def test_each_kind_keeps_exactly_its_identity_labels() -> None:
    labels = {"node": "n", "namespace": "ns", "pod": "p", "uuid": "GPU-1"}
    assert target_from_labels({**labels, "target_kind": "pod"})[0] == Target("pod", "n", "ns", "p", "GPU-1")
    assert target_from_labels({**labels, "target_kind": "gpu"})[0] == Target("gpu", "n", "", "", "GPU-1")
    assert target_from_labels({**labels, "target_kind": "node"})[0] == Target("node", "n")


def test_the_identity_of_each_kind_names_exactly_what_identifies_it() -> None:
    pod_a, pod_b = Target("pod", "n1", "llm", "vllm-0"), Target("pod", "n1", "llm", "vllm-1")
    assert [incident_identity(t) for t in (pod_a, pod_b)] == ["pod:llm/vllm-0", "pod:llm/vllm-1"]
    assert incident_identity(Target("gpu", "n1", uuid="GPU-1")) == "gpu:n1/GPU-1"
    assert incident_identity(Target("node", "n1")) == "node:n1"
    assert incident_identity(Target("exporter", "10.0.0.7:9400")) == "exporter:10.0.0.7:9400"
    assert loop_identity(Target("exporter", "n1")) == "exporter:n1"


def test_gpus_on_one_node_are_distinct_targets() -> None:
    a = Target("gpu", "n1", uuid="GPU-1")
    b = Target("gpu", "n1", uuid="GPU-2")
    assert incident_identity(a) != incident_identity(b)
    assert loop_identity(a) != loop_identity(b)
    assert incident_identity(Target("node", "n1")) == "node:n1"


async def test_two_gpus_failing_on_one_node_open_two_incidents(tmp_path: Path) -> None:
    rig = Rig(tmp_path, EngineSettings())
    rig.build()
    try:
        await rig.fire({**XID_RESET, "uuid": "GPU-1", "gpu": "0"})
        await rig.fire({**XID_RESET, "uuid": "GPU-2", "gpu": "1"})
        targets = sorted(i["target"]["uuid"] for i in rig.incidents())
        assert targets == ["GPU-1", "GPU-2"]
    finally:
        await rig.engine.aclose()
