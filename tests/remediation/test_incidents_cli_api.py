"""`gpupulse-remediation incidents` reads the running controller's API by default (a real `serve`),
kubectl-style: `list`, `get ID`, `-o table|wide|json|yaml`; the ledger file gives the same answer with
--db; a missing incident, a refused token and an unreachable controller are one line each."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from remediation.incidents_cli import for_reading
from tests.fakes.intake import TOKEN, alert, notification, wait_until
from tests.remediation.test_cli_serve import Serve
from tests.remediation.test_control_cli import cli, one_line_error

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def controller(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Serve, list[str]]]:
    """A real controller with one incident (a leak restarted by the local backend), and the flags
    that reach its API."""
    tmp = tmp_path_factory.mktemp("incidents")
    token = tmp / "token"
    token.write_text(TOKEN + "\n")
    restart = f"--backend.local.restart-command={sys.executable} -c pass"
    serve = Serve(tmp, restart, "--scope.namespaces=serving")
    try:
        leak = alert(
            fingerprint="1eak0000000000d1", fault_class="memory_leak", namespace="serving", pod="llm-0"
        )
        leak["labels"].update(target_kind="pod", alertname="GPUProcessMemoryAboveHardLimit")
        assert serve.post(notification([leak])) == 200
        flags = ["--url", serve.url, "--auth.token-file", str(token)]
        wait_until(lambda: "GPUProcessMemoryAboveHardLimit" in cli("incidents", *flags, "-o", "json").stdout,
                   20, "the incident in the API")  # fmt: skip
        yield serve, flags
    finally:
        serve.stop()


def test_list_and_get_read_the_api_in_every_output(controller: tuple[Serve, list[str]]) -> None:
    _, flags = controller
    table = cli("incidents", *flags)
    assert table.returncode == 0, table.stderr
    header, row = table.stdout.splitlines()
    assert header.split() == ["ID", "STATE", "SIGNATURE", "TARGET", "OPENED", "DIAGNOSIS"]
    assert "serving/llm-0" in row
    assert cli("incidents", "list", *flags).stdout == table.stdout
    wide = cli("incidents", *flags, "-o", "wide").stdout.splitlines()
    assert wide[0].split()[5:10] == ["RUNG", "ATTEMPT", "ALERT", "RESOLUTION", "REASON"]
    assert "GPUProcessMemoryAboveHardLimit" in wide[1]
    [item] = json.loads(cli("incidents", *flags, "-o", "json").stdout)
    assert item["target"]["pod"] == "llm-0" and item["alertname"] == "GPUProcessMemoryAboveHardLimit"
    # YAML is for reading (RFC 3339 times, no empty fields); JSON is the API's document
    assert yaml.safe_load(cli("incidents", *flags, "-o", "yaml").stdout) == [for_reading(item)]
    shown = cli("incidents", "get", str(item["id"]), *flags)
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.startswith(f"incident {item['id']}: GPUProcessMemoryAboveHardLimit on ")
    assert "history:" in shown.stdout and "restart" in shown.stdout
    got = json.loads(cli("incidents", str(item["id"]), *flags, "-o", "json").stdout)
    assert got["id"] == item["id"] and got["history"]


def test_the_ledger_file_answers_as_the_api_does(controller: tuple[Serve, list[str]]) -> None:
    serve, flags = controller
    from_api = json.loads(cli("incidents", *flags, "-o", "json").stdout)
    from_file = json.loads(cli("incidents", "--storage.path", str(serve.tmp / "state"), "-o", "json").stdout)
    assert from_file == from_api


def test_failures_are_one_line(controller: tuple[Serve, list[str]], tmp_path: Path) -> None:
    serve, flags = controller
    missing = cli("incidents", "get", "999", *flags)
    assert missing.returncode == 1 and "incident 999 not found" in one_line_error(missing)
    wrong = tmp_path / "wrong"
    wrong.write_text("nope")
    refused = cli("incidents", "--url", serve.url, "--auth.token-file", str(wrong))
    assert refused.returncode == 1 and "(401)" in one_line_error(refused)
    gone = cli("incidents", "--url", "http://127.0.0.1:9", "--auth.token-file", str(wrong))
    assert gone.returncode == 1 and "cannot reach the controller" in one_line_error(gone)
    bad = cli("incidents", "frobnicate", *flags)
    assert bad.returncode == 2 and "expected `list`" in one_line_error(bad)
    nofile = cli("incidents", "--db", str(tmp_path / "none.db"))
    assert nofile.returncode == 2 and "does not exist" in one_line_error(nofile)
