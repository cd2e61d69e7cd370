"""The size bound of a GpuIncident's status (remediation/kube/incidents.py bounded_status): the oldest
history goes first, the row and alert states never; tests/kube/test_shared_behaviour.py shows the
bounded write accepted by the fake and the real API server."""

from __future__ import annotations

import json
from typing import Any

from remediation.kube.incidents import bounded_status


def _size(status: dict[str, Any]) -> int:
    return len(json.dumps(status, separators=(",", ":")).encode())


def _status(entries: int = 0, diagnoses: int = 0, handled: int = 0, row_bytes: int = 10) -> dict[str, Any]:
    return {
        "row": {"id": 1, "pad": "r" * row_bytes},
        "entries": [{"id": i, "text": "e" * 100} for i in range(entries)],
        "diagnoses": [{"id": i, "text": "d" * 100} for i in range(diagnoses)],
        "handled": [{"key": f"h{i}", "at": -i} for i in range(handled)],  # newest first
        "alerts": [{"fingerprint": "f", "status": "firing"}],
    }


def test_a_status_within_the_bound_is_written_as_it_is() -> None:
    status = _status(entries=5, diagnoses=2, handled=5)
    assert bounded_status(status, _size(status)) == (status, {})


def test_the_oldest_entries_go_first_and_the_result_fits_exactly_measured() -> None:
    status = _status(entries=50, diagnoses=3, handled=10)
    limit = _size(status) - 1000
    out, dropped = bounded_status(status, limit)
    assert set(dropped) == {"entries"} and _size(out) <= limit
    ids = [e["id"] for e in out["entries"]]
    assert ids == list(range(50 - len(ids), 50))
    assert out["diagnoses"] == status["diagnoses"] and out["handled"] == status["handled"]
    assert status["entries"][0]["id"] == 0, "the caller's status is not changed"


def test_then_every_diagnosis_but_the_newest_then_the_oldest_handled_keys() -> None:
    status = _status(entries=3, diagnoses=3, handled=10)
    bare = _size({**status, "entries": [], "diagnoses": status["diagnoses"][-1:], "handled": []})
    out, dropped = bounded_status(status, bare + 40)
    assert dropped["entries"] == 3 and dropped["diagnoses"] == 2 and 0 < dropped["handled"] < 10
    assert out["diagnoses"] == status["diagnoses"][-1:]
    assert out["handled"] == status["handled"][: 10 - dropped["handled"]], "the newest keys stay"
    assert _size(out) <= bare + 40


def test_a_row_too_large_on_its_own_is_left_whole_for_the_server_to_refuse() -> None:
    status = _status(entries=2, diagnoses=2, handled=2, row_bytes=5000)
    out, _ = bounded_status(status, 1000)
    assert out["row"] == status["row"] and out["alerts"] == status["alerts"]
    assert out["entries"] == [] and out["handled"] == [] and len(out["diagnoses"]) == 1
