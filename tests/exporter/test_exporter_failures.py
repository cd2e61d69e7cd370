"""A lost GPU, a hung call, NotSupported calls, an XID burst and process churn on the simulated NVML."""

from __future__ import annotations

import asyncio
import threading
import time
from dataclasses import replace
from pathlib import Path

import yaml
from aiohttp.test_utils import TestClient, TestServer

from exporter.nvml import Device
from exporter.server import make_app
from tests.exporter.harness import SETTINGS, simulated_exporter

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "exporter"
FAILURES = FIXTURES / "failures.yaml"
GPU0 = 'gpu="0",uuid="GPU-00000000-0000-4000-8000-000000000000"'
GPU1 = 'gpu="1",uuid="GPU-00000000-0000-4000-8000-000000000001"'
GPU2 = 'gpu="2",uuid="GPU-00000000-0000-4000-8000-000000000002"'


def series(text: str, name: str) -> dict[str, float]:
    """{labels: value} of one metric name in exposition text."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            key, _, value = line.rpartition(" ")
            out[key[len(name) :]] = float(value)
    return out


async def test_lost_gpu_reports_down_and_drops_its_series() -> None:
    async with simulated_exporter(FAILURES, start_seconds=18.0) as h:
        await h.tick(0)
        before = h.text()
        assert series(before, "gpu_up")["{" + GPU0 + "}"] == 1.0
        assert "{" + GPU0 + "}" in series(before, "gpu_temperature_celsius")
        await h.tick(3.0)  # t = 21: GPU 0 fell off the bus at 20
        text = h.text()
        assert series(text, "gpu_up")["{" + GPU0 + "}"] == 0.0
        assert series(text, "gpu_up")["{" + GPU2 + "}"] == 1.0
        for name in (
            "gpu_temperature_celsius",
            "gpu_memory_used_bytes",
            "gpu_sm_active_ratio",
            "gpu_process_memory_used_bytes",
            "gpu_ecc_errors_total",
            "gpupulse_gpu_stale",
        ):
            assert not [k for k in series(text, name) if GPU0[:7] in k and "000000000000" in k], name
        # identity and the XID 79 counter stay: that is how "fell off the bus" is alerted on
        assert [k for k in series(text, "gpu_info") if 'gpu="0"' in k and "000000000000" in k]
        assert series(text, "gpu_xid_errors_total")["{" + GPU0 + ',xid="79"}'] == 1.0
        assert h.sampler.snapshot is not None
        states = {ref.index: state for ref, state in h.sampler.snapshot.gpus}
        assert states == {"0": "lost", "1": "stale", "2": "up"}  # GPU 1's power call hangs from t = 10
        async with TestClient(TestServer(make_app(h.sampler))) as client:
            page = await (await client.get("/")).text()
        assert "<td>lost</td>" in page and "<td>stale</td>" in page
        assert 'gpupulse_collector_success{collector="device"} 1.0' in text


async def test_hung_call_marks_only_that_gpu_stale() -> None:
    # No wall-clock bounds: the hang lasts until the test moves scenario time, so a tick that returns
    # while the call is still out was bounded by the per-GPU deadline, not by the hang.
    async with simulated_exporter(FAILURES, start_seconds=9.0) as h:
        await h.tick(0)
        await h.tick(2.0)  # t = 11: GPU 1's power call hangs until t = 40
        hung = h.fleet.slots[1]
        assert hung.worker.stuck  # the call is still out: the tick did not wait for it
        text = h.text()
        assert series(text, "gpu_up")["{" + GPU1 + "}"] == 0.0
        assert series(text, "gpupulse_gpu_stale")["{" + GPU1 + "}"] == 1.0
        assert "{" + GPU1 + "}" not in series(text, "gpu_temperature_celsius")  # no stale values served
        assert series(text, "gpu_up")["{" + GPU2 + "}"] == 1.0
        assert "{" + GPU2 + "}" in series(text, "gpu_temperature_celsius")
        calls_before = h.sim.calls["nvmlDeviceGetPowerUsage"]
        await h.tick(1.0)  # the stuck GPU is not queried again while its call is still out
        assert hung.worker.stuck
        assert h.sim.calls["nvmlDeviceGetPowerUsage"] == calls_before + 1  # GPU 0 only (GPU 2 lacks it)
        assert series(h.text(), "gpupulse_gpu_stale")["{" + GPU1 + "}"] == 1.0
        async with TestClient(TestServer(make_app(h.sampler))) as client:
            assert (await client.get("/readyz")).status == 200  # other GPUs still answer
        h.clock.advance(30.0)  # t = 42: the hang is over
        await h.returned(1)  # the call returned on its thread
        await h.tick(0)
        text = h.text()
        assert series(text, "gpupulse_gpu_stale")["{" + GPU1 + "}"] == 0.0
        assert series(text, "gpu_up")["{" + GPU1 + "}"] == 1.0


async def test_scrapes_are_served_while_a_tick_waits_on_a_hung_gpu() -> None:
    # A GPU deadline longer than the test: the tick cannot end before scenario time passes the hang,
    # so every scrape below is answered while sampling is blocked, from the last snapshot.
    settings = replace(SETTINGS, gpu_call_timeout_seconds=120.0)
    async with simulated_exporter(FAILURES, start_seconds=9.0, settings=settings) as h:
        await h.tick(0)
        before = h.sampler.snapshot
        assert before is not None
        async with TestClient(TestServer(make_app(h.sampler))) as client:
            h.clock.advance(2.0)  # t = 11: GPU 1's power call hangs until t = 40
            tick = asyncio.ensure_future(h.sampler.sample_once())
            for _ in range(20):
                resp = await client.get("/metrics")
                assert resp.status == 200
                assert await resp.read() == before.body
            assert not tick.done()
            h.clock.advance(30.0)  # t = 41: the hung call returns and the tick completes
            snap = await asyncio.wait_for(tick, 60)
            assert snap is not before and h.sampler.snapshot is snap
            assert await (await client.get("/metrics")).read() == snap.body


async def test_readyz_turns_503_when_no_gpu_answers() -> None:
    async with simulated_exporter(FIXTURES / "hang-all.yaml", start_seconds=4.5) as h:
        async with TestClient(TestServer(make_app(h.sampler))) as client:
            await h.tick(0)
            assert (await client.get("/readyz")).status == 200
            await h.tick(1.0)  # t = 5.5: every call hangs
            text = h.text()
            assert set(series(text, "gpupulse_gpu_stale").values()) == {1.0}
            assert set(series(text, "gpu_up").values()) == {0.0}
            await h.tick(1.0)
            assert (await client.get("/readyz")).status == 200  # 2 s since the last good sample
            await h.tick(1.5)
            resp = await client.get("/readyz")
            assert resp.status == 503
            assert (await client.get("/metrics")).status == 200  # still served, with gpu_up 0
            assert (await client.get("/healthz")).status == 200


async def test_not_supported_calls_leave_their_series_absent_and_are_not_retried() -> None:
    async with simulated_exporter(FAILURES, start_seconds=1.0) as h:
        await h.tick(0)
        await h.tick(1.0)
        text = h.text()
        assert "{" + GPU2 + "}" not in series(text, "gpu_power_watts")
        assert "{" + GPU2 + "}" not in series(text, "gpu_sm_active_ratio")  # GPM absent, never faked
        assert series(text, "gpu_sm_active_ratio")["{" + GPU1 + "}"] == 0.5
        assert series(text, "gpu_up")["{" + GPU2 + "}"] == 1.0
        assert "{" + GPU2 + "}" in series(text, "gpu_temperature_celsius")
        calls = h.sim.calls["nvmlDeviceGetPowerUsage"]
        await h.tick(1.0)
        assert h.sim.calls["nvmlDeviceGetPowerUsage"] == calls + 2  # GPUs 0 and 1, never GPU 2 again


async def test_xid_burst_is_counted_per_code() -> None:
    async with simulated_exporter(FAILURES, start_seconds=1.0) as h:
        await h.tick(0)
        await h.tick(6.0)  # t = 7: the burst at 5 and XID 48 at 6 have arrived
        xids = series(h.text(), "gpu_xid_errors_total")
        assert xids["{" + GPU2 + ',xid="13"}'] == 40.0
        assert xids["{" + GPU2 + ',xid="31"}'] == 3.0
        assert xids["{" + GPU1 + ',xid="48"}'] == 1.0
        assert len(xids) == 3


async def test_gone_processes_lose_their_series() -> None:
    async with simulated_exporter(FAILURES, start_seconds=2.0, collectors=["processes"]) as h:
        await h.tick(0)
        assert not [k for k in series(h.text(), "gpu_process_memory_used_bytes") if 'pid="201"' in k]
        await h.tick(2.0)  # t = 4: pid 201 runs from 3 to 8
        mem = series(h.text(), "gpu_process_memory_used_bytes")
        assert (
            mem['{container="",' + GPU1.replace('",uuid', '",namespace="",pid="201",pod="",uuid') + "}"]
            == 512 * 2**20
        )
        assert {p.pid for p in h.sampler.state.processes} == {100, 200, 201, 300}
        await h.tick(5.0)  # t = 9: it exited
        assert not [k for k in series(h.text(), "gpu_process_memory_used_bytes") if 'pid="201"' in k]
        assert not [k for k in series(h.text(), "gpu_process_sm_utilization_ratio") if 'pid="201"' in k]
        assert {p.pid for p in h.sampler.state.processes} == {100, 200, 300}


async def test_process_sm_utilization_comes_from_samples_and_pods_from_node_state() -> None:
    from exporter.collectors.base import PodRef

    async with simulated_exporter(FAILURES, start_seconds=2.0, collectors=["processes"]) as h:
        h.sampler.state.pid_pods = {200: PodRef("ml", "trainer-0", "main")}
        await h.tick(0)
        await h.tick(1.0)
        sm = series(h.text(), "gpu_process_sm_utilization_ratio")
        assert (
            sm[
                '{container="main",gpu="1",namespace="ml",pid="200",pod="trainer-0",'
                'uuid="GPU-00000000-0000-4000-8000-000000000001"}'
            ]
            == 0.6
        )
        assert (
            sm[
                '{container="",gpu="2",namespace="",pid="300",pod="",'
                'uuid="GPU-00000000-0000-4000-8000-000000000002"}'
            ]
            == 0.7
        )


async def test_mig_instances_memory_and_gpm_per_instance() -> None:
    async with simulated_exporter(FIXTURES / "mig.yaml", start_seconds=1.0) as h:
        await h.tick(0)
        await h.tick(1.0)
        text = h.text()
        info = series(text, "gpu_mig_info")
        assert len(info) == 2
        parent = 'gpu="0",'
        assert any('gpu_instance_id="5"' in k and 'profile="1g.10gb"' in k for k in info)
        used = series(text, "gpu_mig_memory_used_bytes")
        mig_b001 = 'mig_uuid="MIG-00000000-0000-4000-8000-00000000b001",'
        key = "{" + parent + mig_b001 + 'uuid="GPU-00000000-0000-4000-8000-00000000b000"}'
        assert used[key] == 20 * 2**30
        assert series(text, "gpu_mig_sm_active_ratio")[key] == 0.8
        # utilization is not supported under MIG: absent, and GPM is per instance only
        assert not [k for k in series(text, "gpu_utilization_ratio") if parent in k]
        assert not [k for k in series(text, "gpu_sm_active_ratio") if parent in k]
        # temperature and power come from the parent
        assert [v for k, v in series(text, "gpu_temperature_celsius").items() if parent in k] == [55.0]
        migs = {g.mig_uuid for g in h.sampler.state.gpus if g.mig_uuid}
        assert migs == {
            "MIG-00000000-0000-4000-8000-00000000b001",
            "MIG-00000000-0000-4000-8000-00000000b005",
        }
        procs = {p.pid: p.mig_uuid for p in h.sampler.state.processes}
        assert procs[500] == "MIG-00000000-0000-4000-8000-00000000b001"
        assert procs[600] == ""


async def test_nvlink_state_per_link_and_peer_topology() -> None:
    async with simulated_exporter(FIXTURES / "nvlink.yaml", start_seconds=1.0, collectors=["nvlink"]) as h:
        await h.tick(0)
        text = h.text()
        up = series(text, "gpu_nvlink_up")
        gpu0 = [(k, v) for k, v in up.items() if 'gpu="0"' in k]
        assert len(gpu0) == 6
        assert up['{gpu="0",link="5",uuid="GPU-00000000-0000-4000-8000-00000000d000"}'] == 0.0
        assert up['{gpu="0",link="0",uuid="GPU-00000000-0000-4000-8000-00000000d000"}'] == 1.0
        peers = series(text, "gpu_nvlink_peer_info")
        pairs = {
            (
                k.split('gpu="')[1][0],
                k.split('peer_gpu="')[1][0],
                k.split('via="')[1].split('"')[0],
                k.split('links="')[1].split('"')[0],
            )
            for k in peers
        }
        assert pairs == {
            ("0", "1", "direct", "4"),
            ("1", "0", "direct", "4"),
            ("2", "3", "nvswitch", "16"),
            ("3", "2", "nvswitch", "16"),
        }


async def test_xid_thread_stops_promptly() -> None:
    async with simulated_exporter(FAILURES, start_seconds=1.0, collectors=["health"]) as h:
        await h.tick(0)
        started = time.monotonic()
        assert h.watcher.stop(timeout_seconds=5.0)
        assert time.monotonic() - started < 1.0  # the wait timeout in tests is 50 ms


async def test_unknown_error_on_every_gpu_becomes_fatal_after_a_run_of_samples() -> None:
    async with simulated_exporter(
        FIXTURES / "unknown-error.yaml", start_seconds=4.5, collectors=["device"]
    ) as h:
        await h.tick(0)
        assert set(series(h.text(), "gpu_up").values()) == {1.0}
        for _ in range(h.fleet.unknown_rounds_fatal - 1):
            await h.tick(1.0)  # from t = 5 every call answers Unknown Error
            assert set(series(h.text(), "gpu_up").values()) == {0.0}
        assert h.sampler.fatal is None  # a passing glitch is not fatal
        await h.tick(1.0)
        assert h.sampler.fatal is not None and "device cgroup" in h.sampler.fatal


async def test_sampling_loop_stops_by_itself_when_fatal() -> None:
    import asyncio

    async with simulated_exporter(
        FIXTURES / "unknown-error.yaml", start_seconds=4.5, collectors=["device"]
    ) as h:
        await h.tick(0)
        h.clock.advance(1.0)
        h.fleet.unknown_rounds_fatal = 2
        stop = asyncio.Event()
        await asyncio.wait_for(h.sampler.run(stop), 10)  # returns without being stopped
        assert not stop.is_set() and h.sampler.fatal is not None


async def test_more_processes_than_the_listing_buffer_holds_are_all_listed(tmp_path: Path) -> None:
    # The process listings keep their C arrays between ticks (32 entries at first); a GPU with more
    # processes makes the driver answer INSUFFICIENT_SIZE, and the array grows. Processes start late
    # too: 20 at first, 100 from t = 5, so a tick with a too-small kept array happens after the first.
    procs = [
        {"pid": 5000 + n, "gpu": 0, "name": "worker", "memory_bytes": f"{n + 1}MiB", "sm_utilization": 0.01}
        | ({"start": 5} if n >= 20 else {})
        for n in range(100)
    ]
    scenario = tmp_path / "crowded.yaml"
    scenario.write_text(
        yaml.safe_dump({"name": "crowded", "gpus": [{"model": "H100-SXM5-80GB"}], "processes": procs})
    )
    async with simulated_exporter(scenario, start_seconds=1.0, collectors=["processes"]) as h:
        await h.tick(0)
        assert len(series(h.text(), "gpu_process_memory_used_bytes")) == 20
        await h.tick(5.0)
        mem = series(h.text(), "gpu_process_memory_used_bytes")
        assert len(mem) == 100
        assert sorted(mem.values()) == [(n + 1) * 2**20 for n in range(100)]
        assert {p.pid for p in h.sampler.state.processes} == {5000 + n for n in range(100)}
        assert len(series(h.text(), "gpu_process_sm_utilization_ratio")) == 100


async def test_reads_queued_in_one_turn_share_a_batch_and_each_gets_its_own_answer() -> None:
    async with simulated_exporter(FAILURES, start_seconds=1.0) as h:
        first, second = h.fleet.slots[0], h.fleet.slots[2]
        threads: list[tuple[int, str]] = []

        def index(dev: Device) -> int:
            threads.append((dev.static.index, threading.current_thread().name))
            return dev.static.index

        # submit queues at once: these four go to the GPUs' threads as one batch per GPU
        a = h.fleet.submit(first, index)
        b = h.fleet.submit(first, lambda dev: "b")
        c = h.fleet.submit(second, index)
        mapped = await h.fleet.map(index, [first, second])
        assert (await a, await b, await c) == (0, "b", 2)
        assert [r for _, r in mapped] == [0, 2]
        # one batch per GPU, run off the event loop: a GPU's reads one after the other on one thread
        assert sorted(gpu for gpu, _ in threads) == [0, 0, 2, 2]
        by_gpu = {gpu: {name for g, name in threads if g == gpu} for gpu in (0, 2)}
        assert all(len(names) == 1 for names in by_gpu.values()), by_gpu
        assert all(name.startswith("nvml-") for _, name in threads)
        assert await h.fleet.run(first, lambda dev: dev.static.uuid) == first.uuid  # and a later one alone


async def test_a_gpu_listing_the_same_processes_keeps_its_rows_and_reports_new_values(tmp_path: Path) -> None:
    from exporter.collectors.base import PodRef

    # one GPU, the same two PIDs every tick (one listed as compute and graphics), memory that grows
    scenario = tmp_path / "steady.yaml"
    scenario.write_text(
        yaml.safe_dump(
            {
                "name": "steady",
                "gpus": [{"model": "H100-SXM5-80GB"}],
                "processes": [
                    {"pid": 700, "gpu": 0, "memory_bytes": [[0, "1GiB"], [100, "101GiB"]]},
                    {"pid": 701, "gpu": 0, "memory_bytes": "2GiB"},
                    {"pid": 701, "gpu": 0, "memory_bytes": "2GiB", "type": "graphics"},
                ],
            }
        )
    )
    async with simulated_exporter(scenario, start_seconds=1.0, collectors=["processes"]) as h:
        await h.tick(0)
        first = series(h.text(), "gpu_process_memory_used_bytes")
        published = h.sampler.state.processes
        await h.tick(10.0)
        second = series(h.text(), "gpu_process_memory_used_bytes")
        assert first.keys() == second.keys() and len(second) == 2  # 701 once, with both contexts
        grown = [k for k in second if 'pid="700"' in k]
        assert second[grown[0]] == first[grown[0]] + 10 * 2**30
        assert h.sampler.state.processes == published
        # attribution replaces the PID -> pod map: the same listing gets the pod's labels next tick
        h.sampler.state.pid_pods = {700: PodRef("serving", "llama-0", "vllm")}
        await h.tick(1.0)
        third = series(h.text(), "gpu_process_memory_used_bytes")
        assert [k for k in third if 'pid="700"' in k and 'pod="llama-0"' in k]
        assert not [k for k in third if 'pid="700"' in k and 'pod=""' in k]
