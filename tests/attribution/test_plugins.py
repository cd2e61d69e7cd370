"""The plug-in contract exporter-core's CLI uses: add_arguments(parser) and from_args(args, ctx)."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from exporter.attribution import collector as attribution
from exporter.attribution.collector import AttributionCollector
from exporter.collectors.base import GpuProcess, NodeState
from exporter.collectors.plugin import PluginContext
from exporter.host.procfs import Procfs
from exporter.kube import flags as kube_flags
from exporter.kube.context import KubeContext
from exporter.pagecache import collector as pagecache
from gpupulse.metrics.attribution import ATTRIBUTION_METRICS
from gpupulse.metrics.pagecache import PAGECACHE_METRICS
from tests.attribution.helpers import samples


def parser_with_both() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser()
    kube_flags.add_arguments(parser)  # exporter-core's, shared by the plug-ins
    attribution.add_arguments(parser)
    pagecache.add_arguments(parser)  # both add --path.procfs; the second must not conflict
    return parser


def context(args: argparse.Namespace) -> PluginContext:
    return PluginContext(KubeContext(kube_flags.api_settings(args, environ={})))


def build(args: argparse.Namespace) -> AttributionCollector | None:
    return attribution.from_args(args, context(args))


def test_flags_reach_the_settings() -> None:
    args = parser_with_both().parse_args(
        [
            "--path.procfs=/host/proc",
            "--attribution.kubelet-socket=/run/k.sock",
            "--attribution.resource-names=example.com/gpu,amd.com/*",
            "--attribution.max-processes=10",
            "--attribution.interval=2",
            "--pagecache.paths=llama=/models/llama/*.safetensors",
            "--pagecache.paths",
            "/models/qwen",
            "--pagecache.interval=60",
            "--pagecache.no-mapped",
        ]
    )
    attr = build(args)
    page = pagecache.from_args(args, context(args))
    assert attr is not None and page is not None
    assert attr.name == "attribution" and attr.interval_seconds == 2.0
    assert attr.settings.procfs_path == "/host/proc"
    assert attr.settings.kubelet_socket_path == "/run/k.sock"
    assert attr.settings.extra_resource_names == ("example.com/gpu", "amd.com/*")
    assert attr.settings.max_processes == 10
    assert page.name == "pagecache" and page.interval_seconds == 60.0
    assert page.settings.paths == ("llama=/models/llama/*.safetensors", "/models/qwen")
    assert page.settings.procfs_path == "/host/proc"
    assert page.settings.scan_mapped is False


@pytest.mark.parametrize(
    "argv",
    [
        ["--kube.node-name=gpu-node-7", "--kube.api-url=http://127.0.0.1:8001", "--kube.token-file=/etc/t"],
        # the flags of before --kube.*, kept one release
        [
            "--attribution.dra-node-name=gpu-node-7",
            "--attribution.kube-api-url=http://127.0.0.1:8001",
            "--attribution.kube-token-file=/etc/t",
        ],
    ],
)
def test_dra_flags_reach_the_slice_watch(argv: list[str]) -> None:
    sock = "--attribution.kubelet-socket=/run/k.sock"
    attr = build(parser_with_both().parse_args([sock, *argv]))
    assert attr is not None and attr.slices is not None
    api = attr.slices._settings
    assert (api.node_name, api.api_url, str(api.token_path)) == (
        "gpu-node-7",
        "http://127.0.0.1:8001",
        "/etc/t",
    )
    assert attr.slices._drivers == ("gpu.nvidia.com",)
    default = build(parser_with_both().parse_args([sock, "--kube.node-name=n"]))
    assert default is not None and default.slices is not None
    assert str(default.slices._settings.token_path) == "/var/run/secrets/kubernetes.io/serviceaccount/token"


def test_defaults_follow_the_kubelet_and_node_exporter_conventions() -> None:
    args = parser_with_both().parse_args([])
    assert args.attribution_kubelet_socket == "auto"
    attr = build(args)
    assert attr is not None
    assert attr.settings.procfs_path == "/proc"
    assert attr.settings.kubelet_refresh_interval_seconds == 10.0
    page = pagecache.from_args(args, context(args))
    assert page is not None and page.interval_seconds == 30.0


def test_the_pod_watch_follows_its_flag_the_node_name_and_the_kubelet_part() -> None:
    def node(*argv: str) -> str:
        attr = build(parser_with_both().parse_args(list(argv)))
        assert attr is not None
        return attr.pods.store.settings.node_name if attr.pods is not None else ""

    sock = "--attribution.kubelet-socket=/run/k.sock"
    assert node(sock, "--kube.node-name=gpu-7") == "gpu-7"
    assert node(sock, "--attribution.node-name=gpu-7") == "gpu-7"  # deprecated, still read
    assert node(sock, "--kube.node-name=gpu-7", "--no-attribution.pod-watch") == ""
    assert node(sock, "--kube.node-name=") == ""
    # "" on the old flag turned this pod watch off, and still does, whatever node --kube.* names
    assert node(sock, "--kube.node-name=gpu-7", "--attribution.node-name=") == ""
    assert node("--attribution.kubelet-socket=", "--kube.node-name=gpu-7") == ""


def test_the_slice_watch_follows_its_flag_the_node_name_and_the_kubelet_part() -> None:
    def watched(*argv: str) -> bool:
        attr = build(parser_with_both().parse_args(list(argv)))
        assert attr is not None
        return attr.slices is not None

    sock = "--attribution.kubelet-socket=/run/k.sock"
    assert watched(sock, "--kube.node-name=gpu-7")
    assert not watched(sock, "--kube.node-name=gpu-7", "--no-attribution.slice-watch")
    assert not watched(sock, "--kube.node-name=gpu-7", "--attribution.dra-node-name=")  # the chart's old way
    assert not watched(sock)
    assert not watched("--attribution.kubelet-socket=", "--kube.node-name=gpu-7")
    args = parser_with_both().parse_args([sock, "--attribution.max-ranks=8"])
    attr = build(args)
    assert attr is not None and attr.settings.max_ranks == 8


def test_disabled_collectors_are_not_built() -> None:
    args = parser_with_both().parse_args([])
    args.collector_attribution = False  # what exporter-core's --no-collector.attribution sets
    args.collector_pagecache = False
    assert build(args) is None
    assert pagecache.from_args(args, context(args)) is None


def test_specs_name_every_family_the_collectors_export() -> None:
    assert {s.name for s in ATTRIBUTION_METRICS} == {
        "gpu_allocation_info",
        "gpu_process_host_cpu_seconds_total",
        "gpu_process_io_read_bytes_total",
        "gpu_process_io_write_bytes_total",
        "gpu_process_state",
        "gpu_training_rank_info",
        "gpupulse_series_dropped_total",
    }
    assert {s.collector for s in ATTRIBUTION_METRICS} == {"attribution"}
    assert {s.name for s in PAGECACHE_METRICS} == {
        "model_weights_page_cache_resident_ratio",
        "model_weights_resident_bytes",
        "model_weights_size_bytes",
    }
    assert all(s.labels == ("model", "namespace", "pod") for s in PAGECACHE_METRICS)


def test_auto_socket_is_required_in_a_pod_and_off_on_plain_hosts() -> None:
    default = "/var/lib/kubelet/pod-resources/kubelet.sock"
    in_pod = {"KUBERNETES_SERVICE_HOST": "10.96.0.1"}
    assert attribution.resolve_socket("auto", in_pod, lambda p: False) == default  # missing mount: reported
    assert attribution.resolve_socket("auto", {}, lambda p: p == default) == default  # host service on a node
    assert attribution.resolve_socket("auto", {}, lambda p: False) == ""  # not Kubernetes: off, success 1
    assert attribution.resolve_socket("/run/k.sock", {}, lambda p: False) == "/run/k.sock"


async def test_without_kubelet_processes_are_still_measured(tmp_path: Path) -> None:
    proc = tmp_path / "proc" / "77"
    proc.mkdir(parents=True)
    (proc / "cgroup").write_text("0::/system.slice/llama.service\n")
    (proc / "stat").write_text("77 (llama) S 1 77 77 0 -1 0 0 0 0 0 250 50 0 0\n")
    settings = attribution.AttributionSettings(kubelet_socket_path="", procfs_path=str(tmp_path / "proc"))
    collector = attribution.AttributionCollector(settings, procfs=Procfs(str(tmp_path / "proc"), 100))
    state = NodeState(processes=[GpuProcess(uuid="GPU-x", index="0", pid=77)])
    families = await collector.collect(state)  # no CollectorError: nothing to attribute to
    await collector.close()
    assert [s.value for s in samples(families, "gpu_process_host_cpu_seconds_total")] == [3.0]
    assert samples(families, "gpu_allocation_info") == []
