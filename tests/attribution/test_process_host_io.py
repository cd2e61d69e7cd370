"""I/O bytes and scheduler state of GPU processes (/proc/<pid>/io, stat), driven by a scenario's curves."""

from __future__ import annotations

from pathlib import Path

import pytest

from exporter.collectors.base import GpuRef, NodeState
from exporter.errors import ScenarioError
from exporter.host.procfs import PROCESS_STATES, STATE_NAMES, Procfs
from exporter.sim.scenario import parse_scenario
from tests.attribution.helpers import (
    CLOCK_TICKS,
    ProcfsTree,
    advance_host_cpu,
    cgroup_v2_systemd,
    samples,
)
from tests.attribution.test_processes import CIDS, UIDS, make_collector, proc
from tests.fakes.kubelet import FakeKubelet, pod

READ = "gpu_process_io_read_bytes_total"
WRITE = "gpu_process_io_write_bytes_total"
STATE = "gpu_process_state"

# rank 0 writes a checkpoint from t=10 (2 GiB/s, sleeping between writes); rank 1 reads its shard
# until t=10, then sits on a hung NFS read (state D, no bytes); rank 2 wedges in a CPU loop
RANKS = parse_scenario(
    {
        "gpus": [{"model": "H100"}] * 3,
        "processes": [
            {"pid": 7000, "gpu": 0, "io_write_bytes_per_second": [[0, 0], [10, 0], [10, "2GiB"]]},
            {
                "pid": 7001,
                "gpu": 1,
                "io_read_bytes_per_second": [[0, "100MiB"], [10, "100MiB"], [10, 0]],
                "host_state": [[0, "running"], [10, "disk_sleep"]],
            },
            {"pid": 7002, "gpu": 2, "host_cpu_cores": 1.0, "host_state": "running"},
        ],
    }
)


def _by_pid(families: object, name: str) -> dict[str, float]:
    return {s.labels["pid"]: s.value for s in samples(families, name)}  # type: ignore[arg-type]


def _states(families: object) -> dict[str, dict[str, float]]:
    out: dict[str, dict[str, float]] = {}
    for s in samples(families, STATE):  # type: ignore[arg-type]
        out.setdefault(s.labels["pid"], {})[s.labels["state"]] = s.value
    return out


async def test_io_bytes_and_state_follow_the_scenario(
    kubelet: FakeKubelet, procfs: ProcfsTree, tmp_path: Path, gpus: list[GpuRef]
) -> None:
    kubelet.pods = (pod("train", "llama-0", {"trainer": {"nvidia.com/gpu": [u.uuid for u in gpus[:3]]}}),)
    for i, p in enumerate(RANKS.processes):
        procfs.add(p.pid, cgroup_v2_systemd(UIDS[0], CIDS[0]))
        assert i == p.gpu
    state = NodeState(gpus=gpus, processes=[proc(p.gpu, p.pid) for p in RANKS.processes])
    collector = make_collector(kubelet, procfs, tmp_path)
    try:
        advance_host_cpu(procfs.root, RANKS.processes, 5.0, CLOCK_TICKS)
        first = await collector.collect(state)
        advance_host_cpu(procfs.root, RANKS.processes, 20.0, CLOCK_TICKS)
        second = await collector.collect(state)
    finally:
        await collector.close()
    mib, gib = 1 << 20, 1 << 30
    assert _by_pid(first, READ) == {"7000": 0, "7001": 500 * mib, "7002": 0}
    assert _by_pid(second, READ) == {"7000": 0, "7001": 1000 * mib, "7002": 0}  # stuck since t=10
    assert _by_pid(second, WRITE) == {"7000": 20 * gib, "7001": 0, "7002": 0}
    assert _by_pid(second, "gpu_process_host_cpu_seconds_total")["7002"] == pytest.approx(20.0)
    first_states, second_states = _states(first), _states(second)
    # every state of the bounded set, exactly one of them 1
    assert all(set(row) == set(STATE_NAMES) and sum(row.values()) == 1 for row in second_states.values())
    assert first_states["7001"]["running"] == 1 and second_states["7001"]["disk_sleep"] == 1
    assert second_states["7000"]["sleeping"] == 1 and second_states["7002"]["running"] == 1
    labels = next(s.labels for s in samples(second, WRITE) if s.labels["pid"] == "7000")
    assert (labels["namespace"], labels["pod"], labels["uuid"]) == ("train", "llama-0", gpus[0].uuid)


def test_unreadable_or_malformed_io_and_odd_states(tmp_path: Path) -> None:
    tree = ProcfsTree(tmp_path / "proc")
    tree.add(1, cgroup_v2_systemd(UIDS[0], CIDS[0]))  # no io file: no ptrace access to it
    tree.add(2, cgroup_v2_systemd(UIDS[0], CIDS[0]), comm="a) D (b")  # parentheses in comm
    (tree.root / "2" / "io").write_text("rchar: -5\nwchar: 99999999999999999999999\nread_bytes: x\n")
    tree.add(3, cgroup_v2_systemd(UIDS[0], CIDS[0]))
    (tree.root / "3" / "io").write_bytes(b"\xff\xfe rchar 12\nwchar: 34\n")
    stat = tree.root / "3" / "stat"
    stat.write_text(stat.read_text().replace(") S ", ") W "))  # paging (2.6 kernels): not in our set
    fs = Procfs(str(tree.root), clock_ticks_per_second=CLOCK_TICKS)
    one, two, three = fs.process(1), fs.process(2), fs.process(3)
    assert (one.io_read_bytes, one.io_write_bytes, one.state) == (None, None, "sleeping")
    assert (two.io_read_bytes, two.io_write_bytes, two.state) == (None, None, "sleeping")
    assert (three.io_read_bytes, three.io_write_bytes, three.state) == (None, 34, "other")
    # every letter the reader knows names a state of the catalog's bounded set, and nothing else does
    assert set(PROCESS_STATES.values()) | {"other"} == set(STATE_NAMES)
    gone = fs.process(4)
    assert (gone.io_read_bytes, gone.state, gone.cpu_seconds) == (None, None, None)


@pytest.mark.parametrize(
    ("host_state", "where"),
    [
        ("asleep", "processes[0].host_state"),
        ([[5, "running"], [1, "sleeping"]], "processes[0].host_state[1][0]"),
        ([[5]], "processes[0].host_state[0]"),
        (7, "processes[0].host_state"),
    ],
)
def test_scenario_refuses_bad_host_states(host_state: object, where: str) -> None:
    with pytest.raises(ScenarioError, match=where.replace("[", r"\[").replace("]", r"\]")):
        parse_scenario(
            {"gpus": [{"model": "H100"}], "processes": [{"pid": 1, "gpu": 0, "host_state": host_state}]}
        )


def _io_by_every_line(text: str) -> tuple[int | None, int | None]:
    """The reading of /proc/<pid>/io line by line, key by key (the last of a key wins)."""
    values: dict[str, int] = {}
    for line in text.splitlines():
        key, _, value = line.partition(":")
        value = value.strip()
        if key in ("rchar", "wchar") and value.isdigit() and len(value) <= 20:
            values[key] = int(value)
    return values.get("rchar"), values.get("wchar")


KERNEL_IO = (
    "rchar: 1580\nwchar: 99\nsyscr: 5\nsyscw: 1\nread_bytes: 0\nwrite_bytes: 0\ncancelled_write_bytes: 0\n"
)


@pytest.mark.parametrize(
    "text",
    [
        KERNEL_IO,
        "rchar: 0\nwchar: 0\n\n",
        "rchar: 007\nwchar: 12345678901234567890\nx\n",  # leading zeros; 20 digits
        "rchar: 1\nwchar: 123456789012345678901\nx\n",  # 21 digits: not a count
        "rchar: 1\nwchar: 2\nrchar: 3\n",  # a key twice: the last wins
        "rchar: 1\nwchar: 2\nsyscr: 5\nwchar: 9\n",
        "wchar: 2\nrchar: 1\nsyscr: 5\n",  # another order
        "rchar: 1\r\nwchar: 2\r\nsyscr: 5\r\n",  # CRLF
        "rchar:  1\nwchar:\t2\nsyscr: 5\n",  # other blanks
        "rchar: ²\nwchar: 2\nx\n",  # a digit Python's isdigit knows and int() does not
        "rchar: 1\x0bwchar: 2\nwchar: 3\nx\n",  # a vertical tab splits a line for splitlines only
        "rchar: -1\nwchar: 2\nx\n",
        "rchar: 1\nwchar: 2",  # cut short
        "",
        "\xff\xfe rchar 12\nwchar: 34\nx\n",
    ],
)
def test_io_counters_read_as_line_by_line_reading_would(tmp_path: Path, text: str) -> None:
    tree = ProcfsTree(tmp_path / "proc")
    tree.add(1, cgroup_v2_systemd(UIDS[0], CIDS[0]))
    (tree.root / "1" / "io").write_text(text)
    fs = Procfs(str(tree.root), clock_ticks_per_second=CLOCK_TICKS)
    try:
        expected: object = _io_by_every_line(text)
    except ValueError as exc:  # int() of a digit it cannot read: the read of this PID fails
        expected = type(exc)
    try:
        got: object = fs.io_bytes(1)
    except ValueError as exc:
        got = type(exc)
    assert got == expected
