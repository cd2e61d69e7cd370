"""The end-of-run verdict: each expected step of the ladder is checked from ledger and pages."""

from __future__ import annotations

from typing import Any

from demo.pager_sink import ReceivedPage
from demo.verdict import (
    Expectations,
    HungJob,
    check_bad_gpu,
    check_hung_job,
    check_leak,
    check_loop,
    evaluate,
    expectations_from,
)
from demo.world import World

LEAK, LOOP, UUID = "serving/chat-1", "serving/rag-1", "GPU-bad"


def _action(rung: str, status: str = "success") -> dict[str, Any]:
    return {"kind": "action", "rung": rung, "status": status, "summary": ""}


def _event(status: str) -> dict[str, Any]:
    return {"kind": "event", "rung": None, "status": status, "summary": ""}


def _inc(i: int, fault_class: str, target: str, history: list[dict[str, Any]], **kw: Any) -> dict[str, Any]:
    ns, _, pod = target.partition("/")
    base = {"id": i, "fault_class": fault_class, "state": "closed", "resolution": None}
    if fault_class == "xid_reset":
        base.update(target_kind="gpu", target_uuid=target, target_namespace="", target_pod="")
    elif fault_class == "training_hang":
        base.update(
            target_kind="job", target_uuid="", target_namespace=ns, target_pod="", target_training_job=pod
        )
    else:
        base.update(target_kind="pod", target_uuid="", target_namespace=ns, target_pod=pod)
    return {**base, "history": history, **kw}


def _page(i: int, resolved: bool = False) -> ReceivedPage:
    return ReceivedPage(
        {"dedup_key": f"gpupulse-incident-{i}", "status": "resolved" if resolved else "firing"}
    )


GOOD = [
    _inc(1, "xid_reset", UUID, [_event("opened"), _action("migrate"), _action("page")], state="paged"),
    _inc(2, "memory_leak", LEAK, [_action("restart"), _event("verified")], resolution="automated"),
    _inc(
        3,
        "xid_app",
        LOOP,
        [
            _action("restart"),
            _action("restart"),
            _event("restart_loop"),
            _action("restart", "skipped"),
            _action("migrate"),
            _action("page"),
        ],
        state="paged",
    ),
    _inc(
        4, "training_hang", "research/train", [_action("restart"), _event("verified")], resolution="automated"
    ),
]
GANG = HungJob("research", "train", "1", ("research/train-master-0", "research/train-worker-0"))
EXPECT = Expectations(leak_pods=(LEAK,), bad_gpu_uuids=(UUID,), loop_pods=(LOOP,), hung_jobs=(GANG,))


def test_the_whole_ladder_passes() -> None:
    checks = evaluate(EXPECT, GOOD, [_page(1), _page(3)])
    assert [c.ok for c in checks] == [True, True, True, True]
    assert checks[3].name == "(d) training job research/train hung (rank 1 died)"
    assert checks[3].detail == "whole job restarted once (2 ranks), recovered: incident #4 closed automated"


def test_a_hung_job_needs_one_job_restart_that_held_and_no_pod_restart() -> None:
    assert "did TrainingJobHung fire" in check_hung_job(GANG, GOOD[:3], []).detail
    assert not check_hung_job(GANG, GOOD, [_page(4)]).ok  # paged: not recovered by the restart
    twice = [
        _inc(
            4,
            "training_hang",
            "research/train",
            [_action("restart"), _action("restart")],
            resolution="automated",
        )
    ]
    assert not check_hung_job(GANG, twice, []).ok
    unresolved = [_inc(4, "training_hang", "research/train", [_action("restart")], state="cooldown")]
    assert not check_hung_job(GANG, unresolved, []).ok
    # a restart of one rank's pod fails the check even when the job restart held as well
    one_pod = _inc(5, "xid_app", "research/train-worker-0", [_action("restart")])
    check = check_hung_job(GANG, [*GOOD, one_pod], [])
    assert not check.ok and "research/train-worker-0" in check.detail
    other_job = _inc(4, "training_hang", "research/other", [_action("restart")], resolution="automated")
    assert not check_hung_job(GANG, [other_job], []).ok


def test_a_paged_leak_is_not_an_automated_fix() -> None:
    assert not check_leak(LEAK, GOOD, [_page(2)]).ok
    still_open = [_inc(2, "memory_leak", LEAK, [_action("restart")], state="cooldown")]
    check = check_leak(LEAK, still_open, [])
    assert not check.ok and "cooldown" in check.detail


def test_a_bad_gpu_needs_both_the_migration_and_the_page() -> None:
    assert not check_bad_gpu(UUID, GOOD, []).ok
    no_migrate = [_inc(1, "xid_reset", UUID, [_action("migrate", "failed")])]
    assert not check_bad_gpu(UUID, no_migrate, [_page(1)]).ok
    assert "no incident" in check_bad_gpu("GPU-other", GOOD, [_page(1)]).detail


def test_a_loop_needs_restarts_detection_and_a_page() -> None:
    one_restart = [_inc(3, "xid_app", LOOP, [_action("restart"), _event("restart_loop")])]
    check = check_loop(LOOP, one_restart, [_page(3)])
    assert not check.ok and "1 restart(s)" in check.detail
    assert not check_loop(LOOP, GOOD, [_page(3, resolved=True)]).ok


def test_expectations_come_from_the_scenario(world: World) -> None:
    expect = expectations_from(world)
    assert expect.leak_pods == ("serving/chat-7d9f8b6c5d-x2x4z",)
    assert expect.loop_pods == ("serving/rag-5c8d9f7b6-k2m4p",)
    assert expect.bad_gpu_uuids == (world.uuid(2),)
    assert expect.hung_jobs == (
        HungJob(
            "research",
            "llama-train",
            "1",
            (
                "research/llama-train-master-0",
                "research/llama-train-worker-0",
                "research/llama-train-worker-1",
            ),
        ),
    )
