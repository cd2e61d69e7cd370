"""The hand-declared pod-resources messages use the real k8s.io/kubelet v1 field numbers."""

from __future__ import annotations

import pytest

from exporter.attribution.podresources_proto import (
    LIST_METHOD,
    ClaimResource,
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


def _ldv(field: int, payload: bytes) -> bytes:
    """A length-delimited field with a varint length (payloads of 128 bytes and more)."""
    n, length = len(payload), b""
    while True:
        byte, n = n & 0x7F, n >> 7
        length += bytes([byte | (0x80 if n else 0)])
        if not n:
            return bytes([field << 3 | 2]) + length + payload


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


def test_dynamic_resources_decoded_with_the_kubelets_field_numbers() -> None:
    # api.proto: ContainerResources.dynamic_resources=5; DynamicResource{claim_name=2,
    # claim_namespace=3, claim_resources=4} (1 was class_name, removed in 1.31); ClaimResource{
    # cdi_devices=1, driver_name=2, pool_name=3, device_name=4, optional share_id=5}; CDIDevice{name=1}.
    claim_gpu = (
        _ldv(1, _ldv(1, b"k8s.gpu.nvidia.com/device=gpu-0"))
        + _ldv(2, b"gpu.nvidia.com")
        + _ldv(3, b"node-1")
        + _ldv(4, b"gpu-0")
    )
    claim_share = _ldv(2, b"gpu.nvidia.com") + _ldv(3, b"node-1") + _ldv(4, b"gpu-1") + _ldv(5, b"")
    dynamic = _ldv(2, b"llama-gpus") + _ldv(3, b"serving") + _ldv(4, claim_gpu) + _ldv(4, claim_share)
    container = _ldv(1, b"vllm") + _ldv(5, dynamic)
    response = _ldv(1, _ldv(1, b"llama-0") + _ldv(2, b"serving") + _ldv(3, container))

    ((pod,),) = (decode_list_response(response),)
    (dra,) = pod.containers[0].dynamic_resources
    assert (dra.claim_name, dra.claim_namespace) == ("llama-gpus", "serving")
    first, second = dra.claim_resources
    cdi = ("k8s.gpu.nvidia.com/device=gpu-0",)
    assert first == ClaimResource("gpu.nvidia.com", "node-1", "gpu-0", cdi, None)
    assert second.device_name == "gpu-1" and second.share_id == ""  # present though empty: optional keeps it
    assert encode_list_response((pod,)) == response


def test_a_kubelet_without_dynamic_resources_gives_none() -> None:
    container = _ldv(1, b"c") + _ldv(2, _ldv(1, b"nvidia.com/gpu") + _ldv(2, b"GPU-a"))
    (pod,) = decode_list_response(_ldv(1, _ldv(1, b"p") + _ldv(2, b"ns") + _ldv(3, container)))
    assert pod.containers[0].dynamic_resources == ()
