"""The demo's pager sink receives the controller's generic webhook pages."""

from __future__ import annotations

from collections.abc import AsyncIterator

import aiohttp
import pytest

from demo.pager_sink import PagerSink, ReceivedPage, describe_diagnosis, describe_page
from remediation.backends.pager import page_to_dict
from remediation.model import Page, Target


@pytest.fixture
async def sink() -> AsyncIterator[tuple[PagerSink, list[ReceivedPage]]]:
    seen: list[ReceivedPage] = []
    s = PagerSink(on_page=seen.append)
    await s.start()
    yield s, seen
    await s.stop()


def _page(resolved: bool = False) -> Page:
    return Page(
        dedup_key="gpupulse-incident-3",
        summary="restart loop",
        severity="warning",
        fault_class="xid_app",
        signature="xid-restart-app",
        runbook_url="https://example.invalid/rb",
        target=Target(kind="pod", node="n", namespace="serving", pod="rag-0", uuid=""),
        history=[],
        resolved=resolved,
    )


async def test_pages_are_recorded_and_reported(sink: tuple[PagerSink, list[ReceivedPage]]) -> None:
    s, seen = sink
    async with aiohttp.ClientSession() as session:
        for resolved in (False, True):
            async with session.post(s.url, json=page_to_dict(_page(resolved))) as resp:
                assert resp.status == 200
    assert [p.resolved for p in seen] == [False, True]
    assert [p.dedup_key for p in s.for_incident(3)] == ["gpupulse-incident-3"] * 2
    assert s.for_incident(4) == []
    line = describe_page(seen[0])
    assert "[WARNING]" in line and "serving/rag-0" in line and "restart loop" in line


async def test_wrong_url_or_garbage_is_refused(sink: tuple[PagerSink, list[ReceivedPage]]) -> None:
    s, seen = sink
    base = f"http://127.0.0.1:{s.port}/pages/"
    async with aiohttp.ClientSession() as session:
        async with session.post(base + "guess", json=page_to_dict(_page())) as resp:
            assert resp.status == 404
        async with session.post(s.url, data=b"{not json") as resp:
            assert resp.status == 400
        async with session.post(s.url, json={"summary": "no key"}) as resp:
            assert resp.status == 400
    assert seen == [] and s.pages == []


def test_a_page_diagnosis_is_shown_with_its_layer_and_evidence() -> None:
    body = page_to_dict(_page())
    assert describe_diagnosis(ReceivedPage(dict(body))) is None  # a page without one shows none
    diagnosed = {
        "headline": "host CPU starvation",
        "status": "diagnosed",
        "layer": "host",
        "evidence": [{"signal": "host_cpu_cores"}, {"signal": "sm_activity"}],
    }
    line = describe_diagnosis(ReceivedPage({**body, "diagnosis": diagnosed}))
    assert line == (
        "gpupulse-incident-3: host CPU starvation (layer host; evidence: host_cpu_cores, sm_activity)"
    )
    undiagnosed = {"headline": "no diagnosis: nothing lines up", "status": "no_diagnosis"}
    assert describe_diagnosis(ReceivedPage({**body, "diagnosis": undiagnosed})) == (
        "gpupulse-incident-3: no diagnosis: nothing lines up"
    )
