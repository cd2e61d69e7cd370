"""The fault-signature library: shipped defaults, strict validation, precedence, and the CLI."""

from __future__ import annotations

import argparse
import io
import json
import re
from pathlib import Path

import pytest
import yaml

from remediation import signatures_cli
from remediation.errors import SignatureError
from remediation.signatures import KNOWN_FAULT_CLASSES, load_library, parse_document

REPO = Path(__file__).resolve().parents[2]

VALID = {
    "name": "my-sig",
    "fault_class": "memory_leak",
    "match": {"alertname": "X"},
    "ladder": {"rungs": ["restart", "page"]},
    "restart_fixes": True,
    "reason": "because",
}


def _doc(**changes: object) -> str:
    sig = {**VALID, **changes}
    sig = {k: v for k, v in sig.items() if v is not None}
    return yaml.safe_dump({"signatures": [sig]})


def test_fault_classes_match_the_alerts_contract() -> None:
    text = (REPO / "docs" / "alerts.md").read_text(encoding="utf-8")
    section = text.split("## Fault classes", 1)[1]
    documented = set(re.findall(r"^\| `([a-z_]+)` \|", section, flags=re.M))
    assert documented == KNOWN_FAULT_CLASSES


def test_shipped_library_loads_and_covers_every_fault_class() -> None:
    lib = load_library()
    assert {s.fault_class for s in lib} == KNOWN_FAULT_CLASSES
    for sig in lib:
        assert sig.reason.strip()
        assert sig.restart_fixes == ("restart" in sig.ladder.rungs)


@pytest.mark.parametrize(
    ("xid", "signature", "rungs"),
    [
        *[
            (x, "xid-restart-app", ("restart", "migrate", "page"))
            for x in ("13", "31", "32", "43", "68", "69", "94")
        ],
        *[
            (x, "xid-reset-gpu", ("migrate", "page"))
            for x in ("48", "62", "64", "95", "109", "119", "120", "136", "140", "143", "155", "158")
        ],
        ("79", "xid-79-fell-off-bus", ("migrate", "page")),
    ],
)
def test_xid_codes_follow_nvidia_actions(xid: str, signature: str, rungs: tuple[str, ...]) -> None:
    sig = load_library().match({"alertname": "GPUXidError", "xid": xid, "fault_class": "xid_app"}, {})
    assert (sig.name, sig.ladder.rungs) == (signature, rungs)


def test_xid_not_in_catalog_falls_back_to_fault_class_or_unknown() -> None:
    lib = load_library()
    assert lib.match({"xid": "1313", "fault_class": "xid_app"}, {}).name == "xid-app-class"
    assert lib.match({"xid": "1313"}, {}).name == "unknown-fault"
    assert lib.match({"xid": "130"}, {}).name == "unknown-fault"  # regexes match the whole value


def test_restart_is_ruled_out_where_it_never_helps() -> None:
    lib = load_library()
    for fault_class in ("model_artifact", "xid_reset", "gpu_lost", "gpu_hardware", "crash_loop", "thermal"):
        sig = lib.match({"fault_class": fault_class}, {})
        assert "restart" not in sig.ladder.rungs, fault_class
        assert not sig.restart_fixes
    assert lib.match({"fault_class": "model_artifact"}, {}).ladder.rungs == ("page",)
    assert lib.match({"fault_class": "memory_leak"}, {}).ladder.rungs == ("restart", "migrate", "page")


def test_most_specific_signature_wins(tmp_path: Path) -> None:
    (tmp_path / "mine.yaml").write_text(
        yaml.safe_dump(
            {
                "signatures": [
                    {
                        **VALID,
                        "name": "leak-on-vllm",
                        "match": {"labels": {"fault_class": "memory_leak", "container": "vllm"}},
                        "ladder": {"rungs": ["restart", "page"]},
                    }
                ]
            }
        )
    )
    lib = load_library([tmp_path])
    assert lib.match({"fault_class": "memory_leak", "container": "vllm"}, {}).name == "leak-on-vllm"
    assert lib.match({"fault_class": "memory_leak", "container": "tgi"}, {}).name == "gpu-memory-leak"
    # explicit priority beats a larger number of conditions
    crash = {"fault_class": "crash_loop"}
    note = {"description": "weights.safetensors: checksum mismatch"}
    assert lib.match(crash, note).name == "model-artifact-by-message"


def test_user_signature_replaces_shipped_one_of_same_name(tmp_path: Path) -> None:
    (tmp_path / "override.yaml").write_text(
        _doc(name="gpu-memory-leak", match={"labels": {"fault_class": "memory_leak"}})
    )
    sig = load_library([tmp_path]).match({"fault_class": "memory_leak"}, {})
    assert (sig.name, sig.origin, sig.ladder.rungs) == ("gpu-memory-leak", "user", ("restart", "page"))


@pytest.mark.parametrize(
    ("changes", "field", "message"),
    [
        ({"fault_class": "disk_full"}, "fault_class", "unknown fault_class"),
        ({"ladder": {"rungs": ["migrate", "restart", "page"]}}, "ladder.rungs", "order"),
        ({"ladder": {"rungs": ["restart"]}}, "ladder.rungs", "must end with page"),
        ({"ladder": {"rungs": ["reboot", "page"]}}, "ladder.rungs", "unknown rung"),
        ({"ladder": {"rungs": ["page"]}}, "restart_fixes", "must be true exactly when"),
        ({"reason": None}, "reason", "is required"),
        ({"restart_fixes": "yes"}, "restart_fixes", "true or false"),
        ({"match": {}}, "match", "at least one condition"),
        ({"match": {"label_regex": {"xid": "(13"}}}, "match.label_regex.xid", "invalid regular expression"),
        ({"match": {"labels": {"fault_class": "nope"}}}, "match.labels.fault_class", "unknown fault_class"),
        ({"colour": "red"}, "colour", "unknown field"),
        (
            {"ladder": {"rungs": ["restart", "page"], "attempts": {"restart": 0}}},
            "ladder.attempts.restart",
            "1 to 10",
        ),
        (
            {"ladder": {"rungs": ["restart", "page"], "cooldown_seconds": -1}},
            "ladder.cooldown_seconds",
            "non-negative",
        ),
        ({"name": "Bad Name"}, "name", "lower-case"),
    ],
)
def test_validation_errors_name_file_signature_and_field(
    tmp_path: Path, changes: dict[str, object], field: str, message: str
) -> None:
    path = tmp_path / "broken.yaml"
    path.write_text(_doc(**changes))
    with pytest.raises(SignatureError) as err:
        load_library([tmp_path], include_builtin=False)
    text = str(err.value)
    assert str(path) in text
    assert f"field {field!r}" in text
    assert message in text


def test_duplicate_names_and_bad_yaml_are_errors(tmp_path: Path) -> None:
    with pytest.raises(SignatureError, match="defined twice"):
        parse_document(yaml.safe_dump({"signatures": [VALID, VALID]}), "x.yaml", "user")
    with pytest.raises(SignatureError, match="not valid YAML"):
        parse_document("signatures: [", "x.yaml", "user")
    (tmp_path / "a.yaml").write_text(_doc())
    (tmp_path / "b.yaml").write_text(_doc())
    with pytest.raises(SignatureError, match="also defined in"):
        load_library([tmp_path])
    with pytest.raises(SignatureError, match="does not exist"):
        load_library([tmp_path / "missing"])


# --------------------------------------------------------------------------------------------- CLI


def _cli(*argv: str) -> tuple[int, str, str]:
    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers(dest="command")
    signatures_cli.register(sub)
    ns = parser.parse_args(["signatures", *argv])
    out, err = io.StringIO(), io.StringIO()
    code = ns.func(ns, out=out, err=err, environ={})
    return code, out.getvalue(), err.getvalue()


def test_cli_list_prints_library() -> None:
    code, out, _ = _cli("list")
    assert code == 0
    assert "xid-reset-gpu" in out and "migrate->page" in out
    code, out, _ = _cli("list", "--output", "json")
    assert {s["name"] for s in json.loads(out)} >= {"gpu-memory-leak", "model-artifact"}


def test_cli_test_shows_signature_and_ladder(tmp_path: Path) -> None:
    payload = {
        "version": "4",
        "alerts": [
            {
                "labels": {
                    "alertname": "GPUXidResetRequired",
                    "xid": "95",
                    "target_kind": "gpu",
                    "node": "n1",
                    "uuid": "GPU-1",
                },
                "annotations": {},
            },
            {"labels": {"alertname": "Mystery"}, "annotations": {}},
        ],
    }
    path = tmp_path / "payload.json"
    path.write_text(json.dumps(payload))
    code, out, _ = _cli("test", str(path))
    assert code == 0
    assert "GPUXidResetRequired -> xid-reset-gpu (xid_reset)" in out
    assert "ladder: migrate -> page  restart_fixes: false" in out
    assert "Mystery -> unknown-fault" in out
    code, out, _ = _cli("test", str(path), "--output", "json")
    assert [r["signature"] for r in json.loads(out)] == ["xid-reset-gpu", "unknown-fault"]


def test_cli_add_from_flags_then_test_uses_it(tmp_path: Path) -> None:
    user = tmp_path / "sigs"
    code, _out, err = _cli(
        "add",
        "--signatures",
        str(user),
        "--name",
        "nccl-timeout",
        "--fixed-by",
        "restart",
        "--fault-class",
        "xid_app",
        "--alertname",
        "NCCLWatchdogTimeout",
        "--reason",
        "a fresh communicator works",
    )
    assert code == 0, err
    assert (user / "nccl-timeout.yaml").exists()
    lib = load_library([user])
    sig = lib.match({"alertname": "NCCLWatchdogTimeout"}, {})
    assert (sig.name, sig.ladder.rungs, sig.restart_fixes) == (
        "nccl-timeout",
        ("restart", "migrate", "page"),
        True,
    )
    code, _, err = _cli(
        "add",
        "--signatures",
        str(user),
        "--name",
        "nccl-timeout",
        "--fixed-by",
        "none",
        "--fault-class",
        "xid_app",
        "--alertname",
        "NCCLWatchdogTimeout",
    )
    assert code == 2 and "already exists" in err
    code, _, err = _cli("add", "--signatures", str(user), "--fixed-by", "none", "--alertname", "Y")
    assert code == 2 and "--fault-class is required" in err


async def test_cli_add_from_resolved_incident(tmp_path: Path) -> None:
    from tests.remediation.test_engine_support import Rig, engine_settings

    rig = Rig(tmp_path, engine_settings())
    rig.build()
    labels = {
        "alertname": "EngineWedged",
        "fault_class": "serving_latency",
        "target_kind": "pod",
        "namespace": "llm",
        "pod": "vllm-0",
        "node": "n1",
    }
    ev = await rig.fire(labels)
    await rig.resolve(ev)  # paged, then a human fixed it
    incident_id = int(rig.incidents()[0]["id"])
    await rig.engine.aclose()

    user = tmp_path / "sigs"
    code, _out, err = _cli(
        "add",
        "--signatures",
        str(user),
        "--incident",
        str(incident_id),
        "--db",
        str(rig.db_path),
        "--fixed-by",
        "restart",
        "--fault-class",
        "memory_leak",
    )
    assert code == 0, err
    written = next(user.glob("*.yaml"))
    assert f"learned from incident {incident_id}" in written.read_text()
    sig = load_library([user]).match(labels, {})
    assert sig.origin == "user" and sig.ladder.rungs[0] == "restart"


def test_cli_add_refuses_open_incident_and_invalid_signature(tmp_path: Path) -> None:
    code, _, err = _cli(
        "add",
        "--signatures",
        str(tmp_path),
        "--fixed-by",
        "restart",
        "--fault-class",
        "memory_leak",
        "--label-regex",
        "xid=(13",
    )
    assert code == 2 and "invalid regular expression" in err
    assert list(tmp_path.glob("*.yaml")) == []
