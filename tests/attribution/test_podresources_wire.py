"""The hand-declared pod-resources messages use the real k8s.io/kubelet v1 field numbers."""

from __future__ import annotations

import pytest

from exporter.attribution.podresources_proto import (
    LIST_METHOD,
    ContainerDevices,
    ContainerResources,
    PodResources,
    decode_list_response,
    encode_list_response,
)
from exporter.errors import PodResourcesDecodeError


def _ld(field: int, payload: bytes) -> bytes:
    """One length-delimited protobuf field (tag = field << 3 | 2)."""
    return bytes([field << 3 | 2, len(payload)]) + payload


def test_decodes_bytes_laid_out_like_the_kubelet_sends_them() -> None:
    # Built by hand from api.proto: PodResources{name=1,namespace=2,containers=3},
    # ContainerResources{name=1,devices=2,cpu_ids=3 (ignored)},
    # ContainerDevices{resource_name=1,device_ids=2}.
    device = _ld(1, b"nvidia.com/gpu") + _ld(2, b"GPU-a") + _ld(2, b"GPU-b")
    cpu_ids = bytes([3 << 3 | 2, 2, 4, 5])  # packed repeated int64 the real kubelet may send
    container = _ld(1, b"vllm") + _ld(2, device) + cpu_ids
    pod = _ld(1, b"llama-0") + _ld(2, b"serving") + _ld(3, container)
    response = _ld(1, pod)

    assert decode_list_response(response) == (
        PodResources(
            "llama-0",
            "serving",
            (ContainerResources("vllm", (ContainerDevices("nvidia.com/gpu", ("GPU-a", "GPU-b")),)),),
        ),
    )
    assert LIST_METHOD == "/v1.PodResourcesLister/List"


def test_round_trip_keeps_every_field() -> None:
    pods = (
        PodResources(
            "a", "ns1", (ContainerResources("c", (ContainerDevices("nvidia.com/mig-1g.10gb", ("MIG-x",)),)),)
        ),
        PodResources("b", "ns2", (ContainerResources("sidecar", ()),)),
    )
    assert decode_list_response(encode_list_response(pods)) == pods


def test_garbage_is_a_decode_error() -> None:
    with pytest.raises(PodResourcesDecodeError):
        decode_list_response(b"\x0a\xff\xff")
