"""The demo's DRA node: its ResourceSlice endpoint under the real reflector, and the node end to end
(pod-resources server + slice endpoint + `exporter.cli --simulate` with the real attribution code)."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
import yaml
from aiohttp import web

from demo.dranode import DRA_SCENARIO, start_dra_node
from demo.kubelet import DRA_DRIVER
from demo.procs import Supervisor
from demo.slices import make_slices_app, scenario_slice
from exporter.attribution.slices import ResourceSliceSource, SliceSettings
from tests.attribution.test_end_to_end import series

TOKEN = "demo-dra-token"
ROOT = Path(__file__).resolve().parents[2]
DOC = yaml.safe_load(DRA_SCENARIO.read_text())


@pytest.fixture
async def api() -> AsyncIterator[str]:
    other = {**scenario_slice(DOC), "metadata": {"name": "other", "resourceVersion": "1"}}
    other["spec"] = {**other["spec"], "nodeName": "other-node"}
    runner = web.AppRunner(make_slices_app([scenario_slice(DOC), other], TOKEN))
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    try:
        yield f"http://127.0.0.1:{runner.addresses[0][1]}"
    finally:
        await runner.cleanup()


async def _get(url: str, token: str = TOKEN, **params: str) -> tuple[int, str]:
    headers = {"Authorization": f"Bearer {token}"}
    async with aiohttp.ClientSession() as session, session.get(url, params=params, headers=headers) as r:
        return r.status, await r.text()


async def test_slice_endpoint_lists_this_node_checks_the_token_and_serves_v1_only(api: str) -> None:
    base = f"{api}/apis/resource.k8s.io"
    status, text = await _get(f"{base}/v1/resourceslices", fieldSelector="spec.nodeName=demo-node-dra")
    assert status == 200
    body = yaml.safe_load(text)
    assert [s["spec"]["nodeName"] for s in body["items"]] == ["demo-node-dra"]
    assert body["metadata"]["resourceVersion"]
    assert (await _get(f"{base}/v1/resourceslices", token="wrong"))[0] == 401
    assert (await _get(f"{base}/v1beta1/resourceslices"))[0] == 404
    assert (await _get(f"{base}/v1/resourceslices", fieldSelector="metadata.name=x"))[0] == 400
    assert (await _get(f"{base}/v1/resourceslices", watch="true", timeoutSeconds="x"))[0] == 400
    # a watch with nothing to report ends cleanly at its timeout
    status, text = await asyncio.wait_for(
        _get(f"{base}/v1/resourceslices", watch="true", timeoutSeconds="1"), timeout=10
    )
    assert (status, text) == (200, "")


async def test_the_real_reflector_names_every_claim_device(api: str, tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text(TOKEN)
    source = ResourceSliceSource(SliceSettings(str(DOC["node"]), api, token_path=token, ca_path=None))
    source.start()
    try:
        await source.wait_until(lambda: bool(source.index()), timeout_seconds=10)
    finally:
        await source.close()
    index = source.index()
    assert source.version == "v1"
    node = str(DOC["node"])
    gpu3 = DOC["gpus"][3]
    assert index[(DRA_DRIVER, node, "gpu-0")].uuid == DOC["gpus"][0]["uuid"]
    mig = index[(DRA_DRIVER, node, "gpu-3-mig-0")]
    assert (mig.uuid, mig.parent_uuid) == (gpu3["mig"]["instances"][0]["uuid"], gpu3["uuid"])
    # the other node's slice is not read
    assert len(index) == len(DOC["gpus"]) + len(gpu3["mig"]["instances"])


@pytest.mark.timeout(60)
async def test_dra_node_attributes_every_claim_and_reports_every_gpu(tmp_path: Path) -> None:
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT)
    supervisor = Supervisor(tmp_path)
    node = await start_dra_node(supervisor, tmp_path, env)
    try:
        await node.wait_ready(supervisor, 30)
        text = ""
        async with aiohttp.ClientSession() as session:
            for _ in range(100):  # the first attribution rounds run while the slice watch lists
                async with session.get(node.metrics_url) as r:
                    text = await r.text()
                rows = series(text, "gpu_allocation_info")
                if len(rows) == 5 and all(s["uuid"] and s["gpu"] for s in rows):
                    break
                await asyncio.sleep(0.2)
    finally:
        await supervisor.stop_all()
        await node.close()
    rows = series(text, "gpu_allocation_info")
    by_pod = {(s["namespace"], s["pod"]): (s["gpu"], s["mig_uuid"], s["resource"]) for s in rows}
    mig0 = DOC["gpus"][3]["mig"]["instances"][0]["uuid"]
    assert by_pod == {
        ("chat", "llama-0"): ("0", "", DRA_DRIVER),
        ("search", "embed-0"): ("1", "", DRA_DRIVER),
        ("search", "rerank-0"): ("1", "", DRA_DRIVER),
        ("lab", "nb-0"): ("3", mig0, DRA_DRIVER),
        ("train", "train-0"): ("4", "", "nvidia.com/gpu"),
    }
    assert node.claim_devices == 4
    assert {s["uuid"] for s in series(text, "gpu_info")} == {g["uuid"] for g in DOC["gpus"]}
    assert 'gpupulse_collector_success{collector="attribution"} 1.0' in text
    assert not await asyncio.to_thread(os.path.exists, node.kubelet.socket_path)
