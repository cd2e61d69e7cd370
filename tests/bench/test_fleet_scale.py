"""The fleet bench's parts that decide its numbers: the shard configs a real promtool accepts, the page
server (gzip when asked, plain otherwise, 404 for an unknown node), and rates from two readings."""

from __future__ import annotations

import gzip
import subprocess
from pathlib import Path

import aiohttp
import pytest
import yaml

from bench.fleet_pages import SimNode
from bench.fleet_scale import Pages, Samples, figures, fit, prometheus_config, serve_pages
from demo.neighbours import MissingNeighbourError, neighbour_binary

PAGE = 'gpu_up{uuid="GPU-a"} 1\n'


def _nodes(n: int) -> list[SimNode]:
    return [SimNode(f"gpu-{i:05d}", "serving") for i in range(n)]


def test_a_shard_config_keeps_its_hashmod_of_the_node_label_and_promtool_accepts_it(tmp_path: Path) -> None:
    try:
        promtool = neighbour_binary("prometheus", "promtool")
    except MissingNeighbourError as e:
        pytest.skip(str(e))
    config = prometheus_config(9100, _nodes(3), 30, [], (1, 4), "http://127.0.0.1:8428/api/v1/write")
    relabel = config["scrape_configs"][0]["relabel_configs"]
    assert {
        "source_labels": ["node"],
        "modulus": 4,
        "target_label": "__tmp_hash",
        "action": "hashmod",
    } in relabel
    assert {"source_labels": ["__tmp_hash"], "regex": "1", "action": "keep"} in relabel
    assert config["global"]["external_labels"] == {"shard": "1"}
    path = tmp_path / "prometheus.yml"
    path.write_text(yaml.safe_dump(config))
    done = subprocess.run([str(promtool), "check", "config", str(path)], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr


def test_the_single_server_config_keeps_every_node_and_writes_nowhere() -> None:
    config = prometheus_config(9100, _nodes(2), 15, [], None, None)
    assert "remote_write" not in config
    assert all(r.get("action") != "keep" for r in config["scrape_configs"][0]["relabel_configs"])
    assert config["global"]["scrape_timeout"] == "13s"


async def test_pages_come_gzipped_when_asked_plain_otherwise_and_an_unknown_node_is_404() -> None:
    pages = Pages.build(_nodes(2), {"serving": PAGE})
    assert pages.series == 2
    async with serve_pages(pages) as port, aiohttp.ClientSession(auto_decompress=False) as s:
        url = f"http://127.0.0.1:{port}/node/gpu-00001/metrics"
        async with s.get(url, headers={"Accept-Encoding": "gzip"}) as r:
            assert r.headers["Content-Encoding"] == "gzip"
            assert r.headers["Content-Type"].startswith("text/plain; version=0.0.4")
            assert gzip.decompress(await r.read()).decode() == 'gpu_up{uuid="GPU-a-gpu-00001"} 1\n'
        async with s.get(url, headers={"Accept-Encoding": "identity"}) as r:
            assert "Content-Encoding" not in r.headers
            assert (await r.text()) == 'gpu_up{uuid="GPU-a-gpu-00001"} 1\n'
        async with s.get(f"http://127.0.0.1:{port}/node/gpu-99999/metrics") as r:
            assert r.status == 404


def test_rates_and_memory_come_from_two_readings_of_a_prometheus() -> None:
    def reading(appended: float, cpu: float, duration: float, missed: float = 0.0) -> Samples:
        return {
            "prometheus_rule_group_iterations_missed_total": [({"rule_group": "a;b"}, missed)],
            "prometheus_tsdb_head_series": [({}, 1000.0)],
            "prometheus_tsdb_head_samples_appended_total": [({"type": "float"}, appended)],
            "process_cpu_seconds_total": [({}, cpu)],
            "process_resident_memory_bytes": [({}, 5e8)],
            "prometheus_rule_group_last_duration_seconds": [
                ({"rule_group": "/r/node.yaml;gpupulse.hardware"}, duration)
            ],
        }

    f = figures(
        "shard-0", "prometheus", reading(1_000, 10.0, 0.1), reading(7_000, 13.0, 0.4, missed=3.0), 60.0
    )
    assert f.samples_per_second == 100.0 and f.cpu_cores == 0.05
    assert f.series == 1000.0 and f.rss_bytes == 5e8
    assert f.rule_seconds == {"gpupulse.hardware": 0.4}
    assert f.rule_rounds_missed == 3.0  # rounds skipped within the window, not since the start


def test_the_fit_is_the_per_node_slope() -> None:
    slope, intercept = fit([500.0, 1000.0, 2000.0], [1.2e9, 2.3e9, 4.5e9])
    assert slope == pytest.approx(2.2e6) and intercept == pytest.approx(1.0e8)
