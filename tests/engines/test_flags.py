"""The plug-in contract used by the exporter CLI: add_arguments and from_args."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from exporter.collectors.plugin import PluginContext
from exporter.engines import collector
from exporter.engines.collector import EnginesCollector
from exporter.kube import flags as kube_flags
from exporter.kube.context import KubeContext


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    kube_flags.add_arguments(parser)
    collector.add_arguments(parser)
    return parser.parse_args(list(argv))


def from_args(args: argparse.Namespace) -> EnginesCollector | None:
    return collector.from_args(args, PluginContext(KubeContext(kube_flags.api_settings(args))))


def test_no_source_configured_gives_no_collector() -> None:
    assert from_args(parse()) is None


async def test_flags_become_settings_and_shared_procfs_is_used(tmp_path: Path) -> None:
    config = tmp_path / "engines.yaml"
    config.write_text("[]\n")
    args = parse(
        "--engines.config", str(config), "--engines.interval", "7.5", "--engines.scrape-timeout", "1.5",
        "--engines.max-response-bytes", "1000", "--engines.max-series", "50", "--path.procfs", "/host/proc",
    )  # fmt: skip
    made = from_args(args)
    assert made is not None
    try:
        assert made.interval_seconds == 7.5
        s = made.settings
        assert (s.scrape_timeout_seconds, s.max_response_bytes, s.max_series) == (1.5, 1000, 50)
        assert s.procfs_path == Path("/host/proc")
    finally:
        await made.close()


async def test_engines_procfs_overrides_path_procfs(tmp_path: Path) -> None:
    config = tmp_path / "engines.yaml"
    config.write_text("[]\n")
    made = from_args(parse("--engines.config", str(config), "--path.procfs", "/a", "--engines.procfs", "/b"))
    assert made is not None
    assert made.settings.procfs_path == Path("/b")
    await made.close()


def test_pod_discovery_needs_a_node_name(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NODE_NAME", raising=False)
    with pytest.raises(SystemExit):
        from_args(parse("--engines.discover-pods", "--engines.node-name", ""))
    with pytest.raises(SystemExit):
        from_args(parse("--engines.discover-pods"))


async def test_discovered_pods_are_a_view_of_the_shared_store(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NODE_NAME", "gpu-7")
    args = parse("--engines.discover-pods")
    ctx = PluginContext(KubeContext(kube_flags.api_settings(args)))
    made = collector.from_args(args, ctx)
    assert made is not None
    store = ctx.kube.pods()
    assert store is not None and store.views == ("engines",) and store.settings.node_name == "gpu-7"
    await made.close()
    await ctx.close()
