"""A real Prometheus scrapes the exporter running a shipped scenario; PromQL returns the scenario's values."""

from __future__ import annotations

import asyncio

import pytest

from exporter import cli
from tests.fakes.prometheus_process import free_port, running_prometheus

pytestmark = pytest.mark.integration

CONFIG = """
global:
  scrape_interval: 1s
  scrape_timeout: 900ms
scrape_configs:
  - job_name: gpupulse
    static_configs:
      - targets: ["127.0.0.1:{port}"]
        labels: {{node: sim-node-0}}
"""


async def test_prometheus_scrapes_the_basic_scenario() -> None:
    port = free_port()
    parser = cli.build_parser({}, None)
    args = parser.parse_args(["--simulate", "basic", "--web.listen-address", f"127.0.0.1:{port}"])
    stop = asyncio.Event()
    exporter = asyncio.create_task(cli.serve(cli.settings_from_args(args), args, {}, None, stop))
    try:
        async with running_prometheus(CONFIG.format(port=port)) as prom:
            await prom.wait_for('gpu_sm_active_ratio{gpu="0"}')
            # basic.yaml: GPU 0 runs at sm_active 0.62 and utilization 0.97; GPU 1 at 0.30 / 0.55
            assert await prom.query_value('gpu_sm_active_ratio{gpu="0"}') == pytest.approx(0.62, abs=1e-6)
            assert await prom.query_value('gpu_sm_active_ratio{gpu="1"}') == pytest.approx(0.30, abs=1e-6)
            assert await prom.query_value('gpu_utilization_ratio{gpu="0"}') == pytest.approx(0.97)
            assert await prom.query_value("count(gpu_up == 1)") == 2.0
            assert await prom.query_value('gpu_process_memory_used_bytes{pid="4101"}') == 62 * 2**30
            assert await prom.query_value('sum(gpu_nvlink_peer_info{via="nvswitch"})') == 2.0
            # the node label comes from the scrape config, joins on uuid work
            up = await prom.query('gpu_up * on(uuid) group_left(name) gpu_info{node="sim-node-0"}')
            assert {r["metric"]["name"] for r in up} == {"NVIDIA H100 80GB HBM3"}
            assert await prom.query_value("min(gpupulse_collector_success)") == 1.0
            duration = await prom.query_value('scrape_duration_seconds{job="gpupulse"}')
            assert duration is not None and duration < 0.1
    finally:
        stop.set()
        assert await asyncio.wait_for(exporter, 10) == 0
