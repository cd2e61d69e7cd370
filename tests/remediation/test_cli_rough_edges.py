"""What a new user types first, accepted or refused clearly: `--version` on every program (from the
package metadata), `incidents list` / `incidents get ID`, and `signatures test` on something that is
not an alert."""

from __future__ import annotations

import importlib.metadata
import io
import json
from pathlib import Path

import pytest

from costreport import cli as report_cli
from exporter import cli as exporter_cli
from remediation import cli as remediation_cli
from remediation.cli import build_parser
from tests.remediation.test_engine_support import LEAK, Rig, engine_settings


@pytest.mark.parametrize(
    ("main", "prog"),
    [(remediation_cli.main, "gpupulse-remediation"), (report_cli.main, "gpupulse")],
)
def test_version_comes_from_the_package_metadata(
    main: object, prog: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as done:
        main(["--version"])  # type: ignore[operator]
    assert done.value.code == 0
    assert capsys.readouterr().out == f"{prog} {importlib.metadata.version('gpupulse')}\n"


def test_the_exporter_version_is_the_same(capsys: pytest.CaptureFixture[str]) -> None:
    assert exporter_cli.main(["--version"], environ={}) == 0
    assert capsys.readouterr().out == f"gpupulse-exporter {importlib.metadata.version('gpupulse')}\n"


def _run(*argv: str) -> tuple[int, str, str]:
    ns = build_parser().parse_args(list(argv))
    out, err = io.StringIO(), io.StringIO()
    if ns.command == "incidents":
        code = ns.func(ns, {}, out, err)
    else:
        code = ns.func(ns, out=out, err=err, environ={})
    return int(code), out.getvalue(), err.getvalue()


@pytest.fixture
async def ledger(tmp_path: Path) -> Path:
    """A controller database with one incident."""
    rig = Rig(tmp_path, engine_settings())
    rig.build()
    await rig.fire(LEAK)
    await rig.engine.aclose()
    return rig.db_path


async def test_incidents_list_and_get_are_accepted(ledger: Path) -> None:
    code, table, err = _run("incidents", "list", "--db", str(ledger))
    assert code == 0, err
    assert table.splitlines()[0].split()[:2] == ["ID", "STATE"] and len(table.splitlines()) == 2
    assert _run("incidents", "--db", str(ledger))[1] == table
    code, shown, err = _run("incidents", "get", "1", "--db", str(ledger))
    assert code == 0, err
    assert shown.startswith("incident 1: GPUProcessMemoryAboveHardLimit")
    assert _run("incidents", "1", "--db", str(ledger))[1] == shown


@pytest.mark.parametrize("words", [["lst"], ["get"], ["get", "x"], ["1", "2"]])
async def test_incidents_with_words_it_does_not_know_is_a_clear_error(ledger: Path, words: list[str]) -> None:
    code, out, err = _run("incidents", *words, "--db", str(ledger))
    assert code == 2 and out == ""
    assert err.startswith(
        "gpupulse-remediation incidents: error: expected `list`, an incident ID or `get ID`"
    )


@pytest.mark.parametrize(
    ("doc", "says"),
    [
        ({"foo": 1}, "alert 1 has no alertname label"),
        (
            {"alerts": [{"labels": {"alertname": "A"}}, {"labels": {"severity": "critical"}}]},
            "alert 2 has no",
        ),
        ({"alertname": "A", "node": {"name": "n1"}}, "alert 1: 'node' must be a string, not dict"),
        ([1], "alert 1: each alert must be a mapping"),
    ],
)
def test_signatures_test_refuses_what_is_not_an_alert(tmp_path: Path, doc: object, says: str) -> None:
    path = tmp_path / "alert.json"
    path.write_text(json.dumps(doc))
    code, out, err = _run("signatures", "test", str(path))
    assert code == 2 and out == ""
    assert err.startswith("gpupulse-remediation signatures: error: ") and says in err


def test_signatures_test_still_takes_a_bare_label_map(tmp_path: Path) -> None:
    path = tmp_path / "alert.yaml"
    path.write_text("alertname: GPUXidResetRequired\nxid: '95'\ntarget_kind: gpu\nnode: n1\nuuid: GPU-1\n")
    code, out, err = _run("signatures", "test", str(path))
    assert code == 0, err
    assert "GPUXidResetRequired -> xid-reset-gpu" in out


def _diagnosed(ledger: Path, samples: int) -> None:
    """Store a diagnosis whose top cause carries a series of `samples` points, as a real one does."""
    import sqlite3
    from contextlib import closing

    from remediation.diagnosis.types import Candidate, Diagnosis, Point, SignalEvidence
    from remediation.ledger import Ledger

    t0 = 1_780_000_000.0
    points = tuple(Point(t0 - 2400 + 15 * i, 0.5) for i in range(samples))
    evidence = SignalEvidence(
        signal="page_cache_residency", title="page cache", query="q", direction="down", changed=True,
        change_at=t0 - 60.5, before=1.0, after=0.1, lead_seconds=30.0, strength=0.9, alignment=0.9,
        passed_gate=True, note="evicted", points=points,
    )  # fmt: skip
    top = Candidate(cause="host.page_cache_eviction", layer="host", title="page-cache eviction",
                    score=0.9, evidence=(evidence,))  # fmt: skip
    diagnosis = Diagnosis(status="diagnosed", reason_code="", reason="it lines up", symptom_onset=t0 - 30,
                          window_start=t0 - 2400, window_end=t0, computed_at=t0, candidates=(top,),
                          confident=True, layers={"host": "cause"})  # fmt: skip
    with closing(sqlite3.connect(ledger, isolation_level=None)) as conn:
        Ledger(conn).add_diagnosis(1, t0, "open", diagnosis)


async def test_incidents_yaml_is_short_with_rfc3339_times_json_stays_the_api_document(ledger: Path) -> None:
    import yaml

    _diagnosed(ledger, samples=160)
    code, as_json, err = _run("incidents", "get", "1", "--db", str(ledger), "-o", "json")
    assert code == 0, err
    doc = json.loads(as_json)
    # JSON is the API's document for scripts: Unix seconds and every sample
    assert isinstance(doc["opened_at"], float)
    assert len(doc["diagnosis"]["candidates"][0]["evidence"][0]["points"]) == 160

    code, compact, err = _run("incidents", "get", "1", "--db", str(ledger), "-o", "yaml")
    assert code == 0, err
    assert len(compact.splitlines()) < 150
    shown = yaml.safe_load(compact)
    assert shown["opened_at"] == "2026-05-28T20:26:40Z"
    assert shown["diagnosis"]["window_start"] == "2026-05-28T19:46:40Z"
    ev = shown["diagnosis"]["candidates"][0]["evidence"][0]
    assert ev["change_at"] == "2026-05-28T20:25:39.500Z"
    assert "points" not in ev and ev["samples"] == 160
    assert "closed_at" not in shown and "page_next_at" not in shown  # unset: left out
    assert "1780000000" not in compact

    code, full, err = _run("incidents", "get", "1", "--db", str(ledger), "-o", "yaml", "--full")
    assert code == 0, err
    whole = yaml.safe_load(full)
    assert whole["closed_at"] is None and whole["page_next_at"] == 0
    points = whole["diagnosis"]["candidates"][0]["evidence"][0]["points"]
    assert len(points) == 160 and points[0] == ["2026-05-28T19:46:40Z", 0.5]
    assert set(whole) == set(doc)

    code, rows, err = _run("incidents", "--db", str(ledger), "-o", "yaml")
    assert code == 0, err
    [row] = yaml.safe_load(rows)
    assert row["opened_at"] == "2026-05-28T20:26:40Z"


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["serve", "--dryrun"], "gpupulse-remediation serve: error: unrecognized arguments: --dryrun "
         "(did you mean --dry-run?)"),
        (["resume", "--reasn", "x"], "gpupulse-remediation resume: error: unrecognized arguments: --reasn x "
         "(did you mean --reason?)"),
        (["breaker", "reset", "--by", "a", "--nope"], "gpupulse-remediation breaker reset: error: "
         "unrecognized arguments: --nope"),
    ],
)  # fmt: skip
def test_a_misspelt_flag_after_a_command_is_that_commands_error(
    argv: list[str], says: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as done:
        remediation_cli.main(argv)
    assert done.value.code == 2
    prog = says.split(": error")[0]
    assert capsys.readouterr().err.splitlines() == [says, f"See '{prog} --help'."]
