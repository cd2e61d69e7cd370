"""Device-plugin ids of every form resolve to the GPU (and MIG instance) NVML reports."""

from __future__ import annotations

from pathlib import Path

from exporter.attribution.devices import (
    Allocation,
    allocation_map,
    allocations_from_pods,
    normalize_device_id,
    resolve,
    resource_matcher,
)
from exporter.attribution.poddir import PodDirectory
from exporter.collectors.base import GpuRef, PodRef
from tests.attribution.conftest import GPU_UUIDS, MIG_UUIDS
from tests.fakes.kubelet import pod

P = PodRef("ns", "p", "c")


def test_sharing_suffixes_are_removed() -> None:
    assert normalize_device_id(f"{GPU_UUIDS[0]}::3") == GPU_UUIDS[0]
    assert normalize_device_id("nvidia0/vgpu2") == "nvidia0"
    assert normalize_device_id(MIG_UUIDS[0]) == MIG_UUIDS[0]


def test_every_id_form_resolves(gpus: list[GpuRef]) -> None:
    rows = resolve(
        [
            Allocation(GPU_UUIDS[1], "nvidia.com/gpu", P),
            Allocation(MIG_UUIDS[1], "nvidia.com/mig-3g.40gb", P),
            Allocation("nvidia4", "nvidia.com/gpu", P),  # GKE
            Allocation(f"MIG-{GPU_UUIDS[7]}/1/0", "nvidia.com/mig-1g.10gb", P),  # before R470
            Allocation("GPU-not-on-this-node", "nvidia.com/gpu", P),
            Allocation("MIG-unknown", "nvidia.com/mig-1g.10gb", P),
        ],
        gpus,
    )
    assert [(r.key, r.uuid, r.gpu, r.mig_uuid) for r in rows] == [
        (GPU_UUIDS[1], GPU_UUIDS[1], "1", ""),
        (MIG_UUIDS[1], GPU_UUIDS[7], "7", MIG_UUIDS[1]),
        (GPU_UUIDS[4], GPU_UUIDS[4], "4", ""),
        (f"MIG-{GPU_UUIDS[7]}/1/0", GPU_UUIDS[7], "7", ""),
        ("GPU-not-on-this-node", "GPU-not-on-this-node", "", ""),
        ("MIG-unknown", "", "", "MIG-unknown"),
    ]


def test_replicas_of_one_container_merge_and_other_resources_are_ignored() -> None:
    pods = [
        pod("a", "x", {"c": {"nvidia.com/gpu.shared": [f"{GPU_UUIDS[0]}::0", f"{GPU_UUIDS[0]}::1"]}}),
        pod("a", "y", {"c": {"nvidia.com/gpu.shared": [f"{GPU_UUIDS[0]}::2"], "example.com/nic": ["eth1"]}}),
    ]
    allocations = allocations_from_pods(pods, resource_matcher())
    assert [(a.device_id, a.pod.pod) for a in allocations] == [(GPU_UUIDS[0], "x"), (GPU_UUIDS[0], "y")]
    assert allocation_map(resolve(allocations, [])) == {
        GPU_UUIDS[0]: (PodRef("a", "x", "c"), PodRef("a", "y", "c"))
    }


def test_pod_directory_hints(tmp_path: Path) -> None:
    plain = tmp_path / "uid-1"
    plain.mkdir()
    (plain / "etc-hosts").write_text(
        "# Kubernetes-managed hosts file.\n127.0.0.1\tlocalhost\n10.1.2.3\tllama-0\n"
    )
    token = plain / "volumes" / "kubernetes.io~projected" / "kube-api-access-abcde"
    token.mkdir(parents=True)
    (token / "namespace").write_text("serving\n")
    fqdn = tmp_path / "uid-2"
    fqdn.mkdir()
    (fqdn / "etc-hosts").write_text(
        "127.0.0.1\tlocalhost\n10.1.2.4\tweb-0.web.shop.svc.cluster.local\tweb-0\n"
    )
    directory = PodDirectory(str(tmp_path))
    assert directory.lookup("uid-1") == ("serving", "llama-0")
    assert directory.lookup("uid-2") == ("shop", "web-0")
    assert directory.lookup("uid-missing") is None
