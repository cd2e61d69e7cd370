"""Lemons (remediation/lemons.py): a GPU or node quarantined N times within the window stays out, and
its fault history survives a restart of the ledger and of the engine."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import cast

import pytest

from remediation.control_cli import render_status
from remediation.ledger import Ledger, connect
from remediation.lemons import Lemon, LemonBook, Quarantine
from remediation.model import Target
from remediation.replication import TrackedLedger, restore
from remediation.settings import LemonSettings
from tests.remediation.test_engine_support import XID_RESET, Rig, ScriptedBackend, engine_settings

DAY = 86400.0
NOW = 1_780_000_000.0
RULE = LemonSettings(quarantines=2, window_seconds=7 * DAY)


@pytest.fixture
def ledger(tmp_path: Path) -> Iterator[Ledger]:
    conn = connect(tmp_path / "ledger.db")
    yield Ledger(conn)
    conn.close()


def _quarantine(
    book: LemonBook, at: float, uuid: str = "GPU-1", node: str = "n1", incident: int = 1
) -> list[Lemon]:
    with book.ledger.transaction():
        return book.record(Quarantine(at, incident, "xid-reset", "xid_reset", node, uuid, "1650"), at)


def test_second_quarantine_within_the_window_makes_a_lemon_once(ledger: Ledger) -> None:
    book = LemonBook(ledger, RULE)
    assert _quarantine(book, NOW - 6 * DAY) == []
    lemons = _quarantine(book, NOW, incident=2)
    assert [(lemon.kind, lemon.ident) for lemon in lemons] == [("gpu", "GPU-1"), ("node", "n1")]
    why = lemons[0].describe(RULE.window_seconds)
    assert why.startswith("GPU GPU-1 (serial 1650) on node n1 quarantined 2 times within 1w")
    assert "incident 1 xid-reset" in why and "incident 2 xid-reset" in why
    assert book.refusal(Target("gpu", "n1", uuid="GPU-1")).startswith("GPU GPU-1 is a lemon")
    # a third quarantine is history, not another page
    assert _quarantine(book, NOW + 60, incident=3) == []
    assert len(book.history("gpu", "GPU-1")) == 3


def test_quarantines_further_apart_than_the_window_make_no_lemon(ledger: Ledger) -> None:
    book = LemonBook(ledger, RULE)
    _quarantine(book, NOW - 7 * DAY - 1)
    assert _quarantine(book, NOW) == []
    assert book.refusal(Target("gpu", "n1", uuid="GPU-1")) == ""
    # another GPU of the same node counts for the node, not for the first GPU
    assert [(lemon.kind, lemon.ident) for lemon in _quarantine(book, NOW + 1, uuid="GPU-2")] == [
        ("node", "n1")
    ]
    assert book.refusal(Target("gpu", "n9", uuid="GPU-1")) == ""
    assert book.refusal(Target("node", "n1")).startswith("node n1 is a lemon")


def test_the_rule_off_makes_no_lemon(ledger: Ledger) -> None:
    book = LemonBook(ledger, LemonSettings())
    for i in range(5):
        assert _quarantine(book, NOW + i) == []


def test_history_survives_reopening_the_ledger(tmp_path: Path) -> None:
    path = tmp_path / "ledger.db"
    conn = connect(path)
    _quarantine(LemonBook(Ledger(conn), RULE), NOW - DAY)
    conn.close()
    conn = connect(path)
    try:
        lemons = _quarantine(LemonBook(Ledger(conn), RULE), NOW)
        assert [lemon.ident for lemon in lemons] == ["GPU-1", "n1"]
    finally:
        conn.close()


def test_stale_history_is_forgotten_but_a_lemon_is_kept(ledger: Ledger) -> None:
    book = LemonBook(ledger, RULE)
    _quarantine(book, NOW - 20 * DAY, uuid="GPU-old", node="n-old")
    _quarantine(book, NOW - 2 * DAY, uuid="GPU-bad", node="n-bad")
    _quarantine(book, NOW - DAY, uuid="GPU-bad", node="n-bad")
    _quarantine(book, NOW, uuid="GPU-3", node="n3")
    kept = set(ledger.states("faults:"))
    assert kept == {"faults:gpu:GPU-bad", "faults:node:n-bad", "faults:gpu:GPU-3", "faults:node:n3"}


async def test_engine_pages_a_lemon_for_rma_after_its_second_quarantine_across_a_restart(
    tmp_path: Path,
) -> None:
    rig = Rig(tmp_path, engine_settings(lemons=RULE))
    rig.build()
    try:
        labels = {**XID_RESET, "serial": "1652021001234"}
        first = await rig.fire(labels)
        assert rig.backend.rungs == ["migrate"]
        await rig.resolve(first)
        await rig.advance(3 * 3600)  # verified, cooled down and closed
        assert not any("lemon" in p.summary for p in rig.pager.pages)
        await rig.restart_controller()
        await rig.fire(labels)
        assert rig.backend.rungs == ["migrate"]
        pages = [p for p in rig.pager.pages if "lemon" in p.summary]
        assert len(pages) == 1
        summary = pages[0].summary
        assert "GPU GPU-bbbb (serial 1652021001234) on node node-b quarantined 2 times" in summary
        assert "needs RMA" in summary
        assert LemonBook(rig.engine._ro, RULE).refusal(Target("gpu", "node-b", uuid="GPU-bbbb"))
        lemons = rig.engine.stats()["lemons"]
        assert [(lemon["kind"], lemon["id"], lemon["quarantines"]) for lemon in lemons] == [
            ("gpu", "GPU-bbbb", 2),
            ("node", "node-b", 2),
        ]
        status = render_status("http://controller", rig.engine.stats())
        assert (
            "lemons      GPU GPU-bbbb on node-b (serial 1652021001234): 2 quarantines, out for RMA" in status
        )
        assert "            node node-b: 2 quarantines" in status
    finally:
        await rig.engine.aclose()


def test_history_travels_to_a_new_leader_with_the_switches(tmp_path: Path) -> None:
    """Cluster mode: the rows ride the switches snapshot (GpuRemediationState) and a new leader's
    restored ledger counts the old leader's quarantines."""
    old = TrackedLedger(connect(tmp_path / "old.db"))
    try:
        _quarantine(LemonBook(old, RULE), NOW - DAY)
        snapshot = old.collect()
        assert snapshot.switches is not None and "faults:gpu:GPU-1" in snapshot.switches
    finally:
        old.conn.close()
    new = Ledger(connect(tmp_path / "new.db"))
    try:
        restore(new, snapshot)
        assert [lemon.ident for lemon in _quarantine(LemonBook(new, RULE), NOW)] == ["GPU-1", "n1"]
    finally:
        new.conn.close()


class MarkingBackend(ScriptedBackend):
    """A backend that labels lemon nodes (as the Kubernetes backend does); the first `fail` marks fail."""

    def __init__(self, fail: int = 0) -> None:
        super().__init__()
        self.marks: list[tuple[str, tuple[str, ...]]] = []
        self.fail = fail

    async def mark_lemon(self, node: str, uuids: Sequence[str], detail: str) -> None:
        if self.fail:
            self.fail -= 1
            raise ConnectionError("API server unreachable")
        self.marks.append((node, tuple(uuids)))


async def test_a_mark_that_failed_is_sent_again_on_start_and_a_confirmed_one_is_not(tmp_path: Path) -> None:
    rig = Rig(tmp_path, engine_settings(lemons=RULE), backend=MarkingBackend(fail=1))
    rig.build()
    try:
        for _ in range(2):
            ev = await rig.fire(XID_RESET)
            await rig.resolve(ev)
            await rig.advance(3 * 3600)
        assert [p for p in rig.pager.pages if "needs RMA" in p.summary]
        assert cast(MarkingBackend, rig.backend).marks == []  # the one try failed
        await rig.restart_controller(MarkingBackend())
        await rig.advance(1)  # effects decided at start go out with the first tick
        assert cast(MarkingBackend, rig.backend).marks == [("node-b", ("GPU-bbbb",))]
        await rig.restart_controller(MarkingBackend())
        await rig.advance(1)
        assert cast(MarkingBackend, rig.backend).marks == []  # confirmed: not marked again
    finally:
        await rig.engine.aclose()


async def test_a_lemon_gpu_is_never_validated_back_into_service(tmp_path: Path) -> None:
    """A device quarantine whose alert resolves is validated (--engine.return-to-service), unless the
    GPU is a lemon: then no validation runs and the RMA page stays open."""
    from tests.remediation.test_return_to_service import QuarantiningBackend

    backend = QuarantiningBackend(["pass", "pass"])
    rig = Rig(tmp_path, engine_settings(lemons=RULE, return_to_service=True))
    rig.backend = cast(ScriptedBackend, backend)
    rig.build()
    try:
        first = await rig.fire(XID_RESET)
        await rig.resolve(first)
        assert len(backend.validations) == 1  # the first time, the GPU is tested and returned
        await rig.advance(2 * 3600)  # past "migrated recently": the recurrence is migrated again
        second = await rig.fire(XID_RESET)
        await rig.resolve(second)
        assert len(backend.validations) == 1  # the second quarantine made a lemon: not tested
        lemon = max(rig.incidents(), key=lambda i: int(i["id"]))
        full = rig.engine.get_incident(int(lemon["id"]))
        assert full is not None
        assert (full["state"], full["resolution"]) == ("closed", "human")
        kept = [h["summary"] for h in full["history"] if h["status"] == "kept_out"]
        assert kept and "GPU GPU-bbbb is a lemon" in kept[0]
        rma = [p for p in rig.pager.pages if "needs RMA" in p.summary]
        assert rma and not any(p.resolved for p in rig.pager.pages if p.dedup_key == rma[0].dedup_key)
    finally:
        await rig.engine.aclose()
