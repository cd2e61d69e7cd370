"""Scenario loading and strict validation."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from exporter.errors import ScenarioError
from exporter.sim import list_scenarios, load_scenario
from exporter.sim.scenario import parse_scenario

SHIPPED = ["basic", "mixed-fleet", "mig", "faults", "thermal", "leak", "demo", "large"]


def test_every_required_scenario_is_shipped() -> None:
    assert set(SHIPPED) <= set(list_scenarios())


@pytest.mark.parametrize("name", sorted(set(SHIPPED) | set(list_scenarios())))
def test_every_shipped_scenario_loads(name: str) -> None:
    scenario = load_scenario(name)
    assert scenario.name == name
    assert scenario.gpus
    assert len({g.uuid for g in scenario.gpus}) == len(scenario.gpus)


def test_large_scenario_has_the_benchmark_size() -> None:
    s = load_scenario("large")
    assert (len(s.gpus), len(s.processes)) == (16, 64)


def test_load_by_path(tmp_path: Path) -> None:
    path = tmp_path / "one.yaml"
    path.write_text("gpus:\n  - model: L40S\n")
    scenario = load_scenario(str(path))
    assert scenario.name == "one"
    assert scenario.gpus[0].model.name == "NVIDIA L40S"


def test_unknown_scenario_name_lists_the_shipped_ones() -> None:
    with pytest.raises(ScenarioError, match=r"no such scenario.*basic"):
        load_scenario("does-not-exist")


def test_foreign_sections_are_kept_raw() -> None:
    s = parse_scenario(
        {"gpus": [{"model": "H100"}], "pods": [{"name": "p"}], "engines": {"a": 1}, "page_cache": []}
    )
    assert s.extra == {"pods": [{"name": "p"}], "engines": {"a": 1}, "page_cache": []}


def _error(doc: dict[str, Any]) -> ScenarioError:
    with pytest.raises(ScenarioError) as info:
        parse_scenario(doc, source="bad.yaml")
    return info.value


@pytest.mark.parametrize(
    ("doc", "field_path", "words"),
    [
        ({"gpus": [{"model": "H100"}], "gpu": []}, "gpu", "unknown field"),
        ({"gpus": []}, "gpus", "at least one GPU"),
        ({"gpus": [{"model": "K80"}]}, "gpus[0].model", "unknown GPU model"),
        ({"gpus": [{"model": "H100", "utilization": 1.5}]}, "gpus[0].utilization", "<= 1"),
        (
            {"gpus": [{"model": "H100", "utilization": [[0, 0.1], [5]]}]},
            "gpus[0].utilization[1]",
            "[t, value]",
        ),
        (
            {"gpus": [{"model": "H100", "power_watts": [[10, 1], [5, 2]]}]},
            "gpus[0].power_watts[1][0]",
            "decrease",
        ),
        (
            {"gpus": [{"model": "H100", "memory_used_bytes": "12 parsecs"}]},
            "gpus[0].memory_used_bytes",
            "12GiB",
        ),
        (
            {"gpus": [{"model": "H100", "clock_event_reasons": [{"reasons": ["too_hot"]}]}]},
            "gpus[0].clock_event_reasons[0].reasons[0]",
            "unknown reason",
        ),
        (
            {"gpus": [{"model": "V100", "remapped_rows": [{"at": 1}]}]},
            "gpus[0].remapped_rows",
            "no row remapper",
        ),
        ({"gpus": [{"model": "L40S", "mig": {"instances": []}}]}, "gpus[0].mig", "does not support MIG"),
        (
            {"gpus": [{"model": "A100", "mig": {"instances": [{"profile": "9g.99gb"}]}}]},
            "gpus[0].mig.instances[0].profile",
            "unknown profile",
        ),
        ({"gpus": [{"model": "H100"}], "processes": [{"pid": 1, "gpu": 3}]}, "processes[0].gpu", "<= 0"),
        (
            {
                "gpus": [{"model": "A100", "mig": {"instances": [{"profile": "1g.10gb"}]}}],
                "processes": [{"pid": 1, "gpu": 0}],
            },
            "processes[0].mig_instance",
            "MIG mode",
        ),
        ({"gpus": [{"model": "H100"}], "events": [{"at": 1, "gpu": 0}]}, "events[0].xid", "required"),
        (
            {"gpus": [{"model": "H100"}], "faults": [{"gpu": 0, "call": "*", "kind": "melt"}]},
            "faults[0].kind",
            "hang",
        ),
        (
            {
                "gpus": [{"model": "H100"}],
                "faults": [{"gpu": 0, "call": "*", "kind": "error", "error": "OOPS"}],
            },
            "faults[0].error",
            "GPU_IS_LOST",
        ),
        (
            {"gpus": [{"model": "H100"}], "faults": [{"gpu": 0, "call": "*", "kind": "slow"}]},
            "faults[0].seconds",
            "slow",
        ),
        (
            {"gpus": [{"model": "H100", "nvlink": {"peers": [{"link": 0, "peer_gpu_index": 0}]}}]},
            "gpus[0].nvlink.peers[0].peer_gpu_index",
            "no other GPU",
        ),
        ({"gpus": [{"model": "H100", "uuid": "abc"}]}, "gpus[0].uuid", "GPU-"),
        ({"gpus": [{"model": "H100", "xid_on_loss": True}]}, "gpus[0].xid_on_loss", "lost_at"),
    ],
)
def test_validation_errors_name_file_and_field(doc: dict[str, Any], field_path: str, words: str) -> None:
    err = _error(doc)
    assert err.source == "bad.yaml"
    assert err.field_path == field_path
    assert words in err.problem
    assert str(err).startswith(f"bad.yaml: {field_path}: ")


def test_invalid_yaml_names_the_file(tmp_path: Path) -> None:
    path = tmp_path / "broken.yaml"
    path.write_text("gpus: [\n")
    with pytest.raises(ScenarioError, match=r"broken\.yaml: invalid YAML"):
        load_scenario(str(path))


def test_defaults_follow_the_model() -> None:
    s = parse_scenario({"gpus": [{"model": "H100"}, {"model": "A100"}]})
    h100, a100 = s.gpus
    assert h100.model.gpm_supported and not a100.model.gpm_supported
    assert h100.pci_bus_id != a100.pci_bus_id
    assert h100.sm_clock_hertz.at(0) == h100.model.sm_clock_max_hertz
    assert s.cuda_driver_version == 12080


def test_sizes_and_exponents_are_understood() -> None:
    s = parse_scenario(
        {"gpus": [{"model": "H100", "memory_used_bytes": "1.5GiB", "sm_clock_hertz": "1.2e9"}]}
    )
    g = s.gpus[0]
    assert g.memory_used_bytes is not None and g.memory_used_bytes.at(0) == 1.5 * 2**30
    assert g.sm_clock_hertz.at(0) == 1.2e9


def test_symbol_names_are_checked() -> None:
    err = _error({"gpus": [{"model": "H100", "not_supported": ["nvmlDeviceGetPowerUsag"]}]})
    assert err.field_path == "gpus[0].not_supported[0]" and "not a C symbol" in err.problem
    err = _error({"gpus": [{"model": "H100"}], "faults": [{"gpu": 0, "call": "GetPower", "kind": "hang"}]})
    assert err.field_path == "faults[0].call"


def test_a_gpu_model_outside_the_table_is_described_in_the_scenario() -> None:
    doc = {
        "gpu_models": {
            "L4": {
                "like": "L40S",
                "name": "NVIDIA L4",
                "architecture": "ada",
                "compute_capability": "8.9",
                "memory_total_bytes": "23034MiB",
                "power_limit_watts": 72,
                "power_idle_watts": 16,
                "pcie_generation_max": 4,
            }
        },
        "gpus": [{"model": "L4"}, {"model": "H100"}],
    }
    s = parse_scenario(doc)
    l4 = s.gpus[0].model
    assert (l4.key, l4.name, l4.memory_total_bytes, l4.power_limit_watts) == (
        "L4",
        "NVIDIA L4",
        23034 << 20,
        72,
    )
    assert l4.pcie_width_max == 16  # from L40S
    assert not l4.gpm_supported and not l4.mig_supported
    assert s.gpus[1].model.key == "H100-SXM5-80GB"


@pytest.mark.parametrize(
    ("models", "field_path", "words"),
    [
        ({"L4": {"name": "NVIDIA L4"}}, "gpu_models.L4.like", "required"),
        ({"L4": {"like": "L3", "name": "x"}}, "gpu_models.L4.like", "not a built-in model"),
        (
            {"L4": {"like": "L40S", "name": "x", "architecture": "pascal"}},
            "gpu_models.L4.architecture",
            "one of",
        ),
        ({"L4": {"like": "L40S", "name": "x", "wattage": 1}}, "gpu_models.L4.wattage", "unknown field"),
    ],
)
def test_a_bad_gpu_model_is_refused_by_field(models: dict[str, Any], field_path: str, words: str) -> None:
    with pytest.raises(ScenarioError) as err:
        parse_scenario({"gpu_models": models, "gpus": [{"model": "L4"}]})
    assert err.value.field_path == field_path and words in err.value.problem


def test_an_unknown_model_points_at_gpu_models() -> None:
    with pytest.raises(ScenarioError) as err:
        parse_scenario({"gpus": [{"model": "L4"}]})
    assert "gpu_models" in err.value.problem


def test_host_cpu_per_process_is_a_curve_integrated_over_its_life() -> None:
    s = parse_scenario(
        {
            "gpus": [{"model": "H100"}],
            "processes": [
                {
                    "pid": 1,
                    "gpu": 0,
                    "start": 10,
                    "end": 50,
                    "host_cpu_cores": [[10, 0.5], [30, 0.5], [30, 1.0]],
                },
            ],
        }
    )
    p = s.processes[0]
    assert p.host_cpu_seconds(5) == 0.0  # before it started
    assert p.host_cpu_seconds(30) == pytest.approx(10.0)
    assert p.host_cpu_seconds(40) == pytest.approx(20.0)
    assert p.host_cpu_seconds(100) == pytest.approx(30.0)  # nothing after it ended


@pytest.mark.parametrize(
    ("event", "field_path"),
    [
        ({"at": 1, "gpu": 0, "xid": 43, "until_process_exits": 7}, "events[0].until_process_exits"),
        (
            {"at": 1, "gpu": 0, "xid": 43, "repeat_seconds": 2, "until_process_exits": 99},
            "events[0].until_process_exits",
        ),
        ({"at": 1, "gpu": 0, "xid": 43, "repeat_seconds": 0}, "events[0].repeat_seconds"),
    ],
)
def test_repeating_xids_are_checked(event: dict[str, Any], field_path: str) -> None:
    doc = {"gpus": [{"model": "H100"}], "processes": [{"pid": 7, "gpu": 0}], "events": [event]}
    with pytest.raises(ScenarioError) as err:
        parse_scenario(doc)
    assert err.value.field_path == field_path
