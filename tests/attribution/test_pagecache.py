"""Model-weight residency in the page cache: real mincore on real files, evicted with fadvise."""

from __future__ import annotations

import asyncio
import ctypes
import errno
import os
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.core import Metric

import exporter.pagecache.collector as collection_module
from exporter.collectors.base import GpuProcess, NodeState, PodRef
from exporter.host.procfs import Procfs
from exporter.pagecache import mincore
from exporter.pagecache.collector import PageCacheCollector, PageCacheSettings
from exporter.pagecache.discovery import PathSpec, model_name
from exporter.sim.pagecache import PageCacheScenario, parse_section
from tests.attribution.conftest import GPU_UUIDS
from tests.attribution.helpers import ProcfsTree, cgroup_v2_systemd, samples

RATIO = "model_weights_page_cache_resident_ratio"
RESIDENT = "model_weights_resident_bytes"
SIZE = "model_weights_size_bytes"
MIB = 1 << 20
REPO_WORK = Path(__file__).resolve().parents[2] / ".work"


def _fs_type(path: Path) -> str:
    best, fs = "", ""
    with open("/proc/mounts", encoding="utf-8") as f:
        for line in f:
            _dev, mount, kind = line.split()[:3]
            if str(path).startswith(mount) and len(mount) > len(best):
                best, fs = mount, kind
    return fs


@pytest.fixture
def weights_dir(tmp_path: Path) -> Path:
    """A directory on a disk-backed filesystem: tmpfs pages cannot be evicted by fadvise."""
    if _fs_type(tmp_path) not in {"tmpfs", "ramfs"}:
        return tmp_path / "models"
    REPO_WORK.mkdir(exist_ok=True)
    return REPO_WORK / "test-pagecache" / tmp_path.name / "models"


def write_weights(path: Path, size: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as f:
        for _ in range(size // MIB):
            f.write(os.urandom(MIB))
        f.flush()
        os.fsync(f.fileno())  # clean pages: DONTNEED only drops pages that are not dirty


def evict(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def read_all(path: Path) -> None:
    with open(path, "rb") as f:
        while f.read(8 * MIB):
            pass


def values(families: Sequence[Metric], name: str) -> dict[tuple[str, str, str], float]:
    return {
        (s.labels["model"], s.labels["namespace"], s.labels["pod"]): s.value for s in samples(families, name)
    }


async def test_ratio_drops_when_weights_are_evicted_and_returns_when_read(weights_dir: Path) -> None:
    shard = weights_dir / "llama-3-8b" / "model-00001-of-00001.safetensors"
    write_weights(shard, 64 * MIB)
    collector = PageCacheCollector(
        PageCacheSettings(paths=(str(weights_dir / "llama-3-8b"),), scan_mapped=False)
    )
    key = ("llama-3-8b", "", "")

    read_all(shard)
    warm = await collector.collect(NodeState())
    evict(shard)
    cold = await collector.collect(NodeState())
    still_cold = await collector.collect(NodeState())  # our own scan must not fault pages in
    read_all(shard)
    rewarmed = await collector.collect(NodeState())

    assert values(warm, SIZE) == {key: 64 * MIB}
    assert values(warm, RATIO)[key] > 0.9
    assert values(cold, RATIO)[key] < 0.1
    assert values(cold, RESIDENT)[key] < 0.1 * 64 * MIB
    assert values(still_cold, RATIO)[key] < 0.1
    assert values(rewarmed, RATIO)[key] > 0.9


async def test_shards_add_up_to_one_series_per_model(weights_dir: Path) -> None:
    for i in range(3):
        write_weights(weights_dir / "mixtral" / f"model-0000{i}-of-00003.safetensors", 4 * MIB)
    (weights_dir / "mixtral" / "config.json").write_text("{}")
    evict(weights_dir / "mixtral" / "model-00001-of-00003.safetensors")
    collector = PageCacheCollector(PageCacheSettings(paths=(f"moe={weights_dir}/mixtral/*.safetensors",)))
    families = await collector.collect(NodeState())
    assert values(families, SIZE) == {("moe", "", ""): 12 * MIB}
    assert values(families, RATIO)[("moe", "", "")] == pytest.approx(2 / 3, abs=0.05)


async def test_files_mapped_by_gpu_processes_are_found_and_labelled_with_their_pod(
    weights_dir: Path, procfs: ProcfsTree
) -> None:
    shard = (
        weights_dir
        / "hub"
        / "models--meta-llama--Llama-3.1-8B"
        / "snapshots"
        / "abc123"
        / "model.safetensors"
    )
    write_weights(shard, 8 * MIB)
    procfs.add(
        4242,
        cgroup_v2_systemd("aaaaaaa0-bbbb-cccc-dddd-eeeeeeeeeee0", "a" * 64),
        maps=[str(shard), "/usr/lib/x86_64-linux-gnu/libcuda.so.1"],
    )
    collector = PageCacheCollector(
        PageCacheSettings(procfs_path=str(procfs.root)), procfs=Procfs(str(procfs.root))
    )
    state = NodeState(
        processes=[GpuProcess(uuid=GPU_UUIDS[0], index="0", pid=4242)],
        pid_pods={4242: PodRef("serving", "llama-0", "vllm")},
    )
    families = await collector.collect(state)
    assert values(families, SIZE) == {("meta-llama/Llama-3.1-8B", "serving", "llama-0"): 8 * MIB}

    # The process exits: its files are no longer watched and the series goes.
    procfs.remove(4242)
    gone = await collector.collect(NodeState())
    assert samples(gone, SIZE) == []
    assert collector.tracked_files == 0


class StepClock:
    """Advances a fixed step on every reading, so a time budget is spent deterministically."""

    def __init__(self, step: float) -> None:
        self.now, self.step = 0.0, step

    def monotonic(self) -> float:
        self.now += self.step
        return self.now


async def test_large_file_is_scanned_over_several_rounds_within_the_byte_budget(weights_dir: Path) -> None:
    write_weights(weights_dir / "big" / "w.gguf", 64 * MIB)
    settings = PageCacheSettings(
        paths=(str(weights_dir / "big"),),
        window_bytes=4 * MIB,
        max_bytes_per_round=16 * MIB,
        scan_mapped=False,
    )
    collector = PageCacheCollector(settings)
    rounds = [await collector.collect(NodeState()) for _ in range(4)]
    assert collector.last_stats.bytes_scanned == 16 * MIB
    assert [samples(r, SIZE) == [] for r in rounds] == [True, True, True, False]
    assert values(rounds[-1], SIZE) == {("big", "", ""): 64 * MIB}


async def test_time_budget_stops_a_round_early(weights_dir: Path) -> None:
    write_weights(weights_dir / "slow" / "w.pt", 8 * MIB)
    settings = PageCacheSettings(
        paths=(str(weights_dir / "slow"),), window_bytes=1 * MIB, max_seconds_per_round=2.5, scan_mapped=False
    )
    collector = PageCacheCollector(settings, clock=StepClock(1.0))
    await collector.collect(NodeState())
    assert 0 < collector.last_stats.bytes_scanned < 8 * MIB


def test_model_names() -> None:
    assert model_name("/models/qwen2-7b/model.safetensors") == "qwen2-7b"
    assert model_name(
        "/root/.cache/huggingface/hub/models--Qwen--Qwen2-7B/snapshots/9f1/model.safetensors"
    ) == ("Qwen/Qwen2-7B")
    assert PathSpec.parse("llama=/m/*.gguf") == PathSpec(pattern="/m/*.gguf", name="llama")
    assert PathSpec.parse("/m/a=b/*.gguf") == PathSpec(pattern="/m/a=b/*.gguf")
    assert PathSpec.parse("llama@serving/llama-0=/m/*.gguf") == PathSpec(
        "/m/*.gguf", "llama", "serving", "llama-0"
    )
    assert PathSpec.parse("org/name=/m/x") == PathSpec(pattern="/m/x", name="org/name")
    assert PathSpec.parse("meta-llama/Llama-3.1-8B@serving/llama-0=/m/*") == PathSpec(
        "/m/*", "meta-llama/Llama-3.1-8B", "serving", "llama-0"
    )
    # A relative glob that happens to hold "=" is a pattern, not a prefix.
    assert PathSpec.parse("models/a=b*") == PathSpec(pattern="models/a=b*")


async def test_scenario_eviction_drops_the_ratio_of_the_pods_model(
    weights_dir: Path, shared_gpus_doc: dict[str, Any]
) -> None:
    driver = PageCacheScenario(parse_section(shared_gpus_doc["page_cache"]), weights_dir)
    await asyncio.to_thread(driver.prepare)
    collector = PageCacheCollector(PageCacheSettings(paths=tuple(driver.flags()), scan_mapped=False))
    key = ("llama-70b", "serving", "llama-70b-0")
    ratios = []
    for t in (0, 299, 300, 449, 450):
        await asyncio.to_thread(driver.apply, t)
        ratios.append(values(await collector.collect(NodeState()), RATIO)[key])
    assert ratios[0] > 0.9 and ratios[1] > 0.9
    assert ratios[2] < 0.1 and ratios[3] < 0.1
    assert ratios[4] > 0.9


async def test_a_file_whose_stat_hangs_costs_only_its_model(
    weights_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Two models; one sits on a network mount that stopped answering. The other is still reported,
    # the hung one is not (no stale ratio), and its stat is not started again while it is out.
    write_weights(weights_dir / "good" / "w.safetensors", 2 * MIB)
    # the hung mount's file sorts first: the good one is read after it, in the same round
    write_weights(weights_dir / "a-nfs" / "w.safetensors", 2 * MIB)
    hung_path = str(weights_dir / "a-nfs" / "w.safetensors")
    release = threading.Event()
    stats: list[str] = []
    real_stat = os.stat

    def stat(path: str | os.PathLike[str], *args: Any, **kwargs: Any) -> os.stat_result:
        if str(path) == hung_path and not release.is_set():
            stats.append(str(path))
            release.wait()
        return real_stat(path, *args, **kwargs)

    settings = PageCacheSettings(
        paths=(f"good={weights_dir / 'good'}", f"nfs={weights_dir / 'a-nfs'}"),
        scan_mapped=False,
        item_timeout_seconds=0.1,
    )
    collector = PageCacheCollector(settings)
    try:
        before = values(await collector.collect(NodeState()), SIZE)
        assert set(before) == {("good", "", ""), ("nfs", "", "")}
        monkeypatch.setattr(collection_module.os, "stat", stat)
        during = values(await collector.collect(NodeState()), SIZE)
        assert set(during) == {("good", "", "")}
        again = values(await collector.collect(NodeState()), SIZE)
        assert set(again) == {("good", "", "")} and stats == [hung_path]  # set aside, not retried
        release.set()
        for _ in range(100):
            if not collector._reader.stuck:
                break
            await asyncio.sleep(0.01)
        after = values(await collector.collect(NodeState()), SIZE)
        assert set(after) == {("good", "", ""), ("nfs", "", "")}
    finally:
        release.set()
        await collector.close()


async def test_a_page_cache_section_names_its_file_and_is_evicted_again_and_again(weights_dir: Path) -> None:
    section = [
        {
            "model": "llama-3-8b",
            "namespace": "serving",
            "pod": "llm-0",
            "file": "model-00002-of-00004.safetensors",
            "size_bytes": "8MiB",
            "warm_at": [0, 20],
            "evict_at": [10, 30],
            "keep_warm": True,
        }
    ]
    driver = PageCacheScenario(parse_section(section), weights_dir)
    await asyncio.to_thread(driver.prepare)
    assert driver.entries[0].path(weights_dir).name == "model-00002-of-00004.safetensors"
    assert driver.flags() == [f"llama-3-8b@serving/llm-0={driver.entries[0].path(weights_dir)}"]
    collector = PageCacheCollector(PageCacheSettings(paths=tuple(driver.flags()), scan_mapped=False))
    key = ("llama-3-8b", "serving", "llm-0")
    ratios = []
    try:
        for t in (0, 9, 10, 19, 20, 29, 30):
            await asyncio.to_thread(driver.apply, t)
            ratios.append(values(await collector.collect(NodeState()), RATIO)[key])
    finally:
        await collector.close()
    assert [r > 0.9 for r in ratios] == [True, True, False, False, True, True, False]


@pytest.mark.parametrize(
    ("entry", "words"),
    [
        ({"model": "m", "file": "../escape.safetensors"}, "file name"),
        ({"model": "m", "file": "dir/w.safetensors"}, "file name"),
        ({"model": "m", "keep_warm": "yes"}, "true or false"),
        ({"model": "m", "evict_at": ["soon"]}, "scenario times"),
        ({"model": "m", "evict": [1]}, "unknown fields"),
    ],
)
def test_a_bad_page_cache_entry_is_refused(entry: dict[str, Any], words: str) -> None:
    from exporter.errors import PageCacheScenarioError

    with pytest.raises(PageCacheScenarioError, match=words):
        parse_section([entry])


@pytest.mark.skipif(not mincore._cachestat_works, reason="this kernel has no cachestat(2)")
def test_cachestat_and_mincore_count_the_same_pages(
    weights_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # cachestat (one call per window) replaced mmap + mincore where the kernel has it; both must
    # see the same resident pages, window by window, on a file with holes in the cache.
    shard = weights_dir / "model-00001-of-00001.safetensors"
    write_weights(shard, 8 * MIB)
    evict(shard)
    with open(shard, "rb") as f:
        for n in range(0, 8, 2):
            os.pread(f.fileno(), MIB // 2, n * MIB)  # half of every other MiB back in the cache
    by_cachestat = [mincore.scan(str(shard), off, 3 * MIB, MIB) for off in range(0, 8 * MIB, 3 * MIB)]
    called: list[int] = []
    real = mincore._mincore_window

    def counted(*args: Any) -> int:
        called.append(1)
        return real(*args)

    monkeypatch.setattr(mincore, "_mincore_window", counted)
    monkeypatch.setattr(mincore, "_cachestat_works", False)
    by_mincore = [mincore.scan(str(shard), off, 3 * MIB, MIB) for off in range(0, 8 * MIB, 3 * MIB)]
    assert called  # the second pass really went through mincore
    assert by_cachestat == by_mincore
    assert 0 < sum(r.resident_bytes for r in by_cachestat) < 8 * MIB  # the holes are seen


def test_a_kernel_without_cachestat_falls_back_to_mincore_for_good(
    weights_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    shard = weights_dir / "model-00001-of-00001.safetensors"
    write_weights(shard, 2 * MIB)
    real_syscall = mincore._libc.syscall
    calls: list[int] = []

    def no_cachestat(number: int, *args: Any) -> int:
        if number == mincore._NR_CACHESTAT:
            calls.append(number)
            ctypes.set_errno(errno.ENOSYS)
            return -1
        return int(real_syscall(number, *args))

    monkeypatch.setattr(mincore._libc, "syscall", no_cachestat)
    monkeypatch.setattr(mincore, "_cachestat_works", True)
    for _ in range(3):
        assert mincore.scan(str(shard), 0, 2 * MIB, MIB).resident_bytes == 2 * MIB
    assert calls == [mincore._NR_CACHESTAT]  # asked once, then mincore
