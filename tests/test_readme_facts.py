"""Statements of the README and the design docs that code can hold true: how many alerts ship, which
collectors there are, which alerts the incident replay proves and which it leaves to other proofs."""

from __future__ import annotations

import re
from pathlib import Path

from exporter import registry
from tests.alerts.ruleset import load_rules

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
ALERTS_DESIGN = ROOT / "docs" / "design" / "alerts.md"


def test_the_readme_counts_the_alerts_that_ship() -> None:
    shipped = sum(1 for rule in load_rules() if "alert" in rule)
    counts = {int(n) for n in re.findall(r"\b(\d+) alerts with runbooks", README.read_text())}
    assert counts == {shipped}


def test_the_readme_lists_every_collector_flag() -> None:
    text = " ".join(README.read_text().split())
    listed = re.search(r"`--no-collector\.<name>` \(([a-z, ]+)\)", text)
    assert listed is not None
    names = [n.strip() for n in listed.group(1).split(",")]
    assert names == [*registry.BUILTINS, *(p.name for p in registry.PLUGINS)]


def test_the_alerts_design_counts_what_the_incident_replay_proves() -> None:
    from tests.alerts.test_incidents import INCIDENTS

    shipped = {rule["alert"] for rule in load_rules() if "alert" in rule}
    replayed = {name for incident in INCIDENTS for names in incident.expected.values() for name in names}
    training = {name for name in shipped if name.startswith("Training")}
    controller = {name for name in shipped if name.startswith("GPUPulseController")}
    text = " ".join(ALERTS_DESIGN.read_text().split())
    said = re.search(
        r"the (\d+) alerts these incidents name .* every alert of the (\d+) that ship but the (\d+) training "
        r"alerts, .* and the (\d+) controller alerts",
        text,
    )
    assert said is not None, "docs/design/alerts.md no longer says what the replay proves"
    assert [int(n) for n in said.groups()] == [len(replayed), len(shipped), len(training), len(controller)]
    # "every alert but": the replay, the training rig and promtool's controller file cover all of them
    # longer than any incident (6 hours idle): promtool (usage.test.yaml) and the benign fleet prove it
    idle = {"GPUIdleWhileAllocated"}
    assert replayed | training | controller | idle == shipped
    assert not replayed & (training | controller | idle)
    assert not re.search(r"\ball \d+ alerts\b", text)
