"""The hand-declared pod-resources messages use the real k8s.io/kubelet v1 field numbers."""

from __future__ import annotations

import random

import pytest

from exporter.attribution.podresources_proto import (
    LIST_METHOD,
    ClaimResource,
    ContainerDevices,
    ContainerResources,
    DynamicResource,
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


def _reference(data: bytes) -> tuple[PodResources, ...] | None:
    """protobuf's own decoding of the same bytes (None where it refuses them)."""
    from google.protobuf import json_format
    from google.protobuf.message import DecodeError

    from exporter.attribution.podresources_proto import _message_class

    message = _message_class("v1.ListPodResourcesResponse")()
    try:
        message.ParseFromString(data)
    except DecodeError:
        return None
    # the typed records protobuf's view gives, via the encoder's own field names
    as_dict = json_format.MessageToDict(message, preserving_proto_field_name=True)
    return tuple(
        PodResources(
            p.get("name", ""),
            p.get("namespace", ""),
            tuple(
                ContainerResources(
                    c.get("name", ""),
                    tuple(
                        ContainerDevices(d.get("resource_name", ""), tuple(d.get("device_ids", ())))
                        for d in c.get("devices", ())
                    ),
                    tuple(
                        DynamicResource(
                            r.get("claim_name", ""),
                            r.get("claim_namespace", ""),
                            tuple(
                                ClaimResource(
                                    cr.get("driver_name", ""),
                                    cr.get("pool_name", ""),
                                    cr.get("device_name", ""),
                                    tuple(x.get("name", "") for x in cr.get("cdi_devices", ())),
                                    cr.get("share_id"),
                                )
                                for cr in r.get("claim_resources", ())
                            ),
                        )
                        for r in c.get("dynamic_resources", ())
                    ),
                )
                for c in p.get("containers", ())
            ),
        )
        for p in as_dict.get("pod_resources", ())
    )


def _ours(data: bytes) -> tuple[PodResources, ...] | None:
    try:
        return decode_list_response(data)
    except PodResourcesDecodeError:
        return None


def test_our_reader_decodes_truncated_and_mangled_answers_as_protobuf_does() -> None:
    # The exporter decodes with its own wire reader; protobuf (which the fake kubelets encode with)
    # is the reference for every cut and every flipped byte of a real answer, ünïcode included.
    claim = ClaimResource("gpu.nvidia.com", "node-a", "gpu-0", ("cdi/gpu=0",), share_id="")
    pods = (
        PodResources(
            "llama-ü",
            "serving",
            (
                ContainerResources(
                    "vllm",
                    (ContainerDevices("nvidia.com/gpu", ("GPU-a", "GPU-b")),),
                    (DynamicResource("claim-0", "serving", (claim,)),),
                ),
                ContainerResources("sidecar", ()),
            ),
        ),
        PodResources("b" * 200, "ns2", ()),  # a length of two varint bytes
    )
    data = encode_list_response(pods)
    assert decode_list_response(data) == pods == _reference(data)
    rng = random.Random(26)
    cases = [data[:cut] for cut in range(len(data))]
    for _ in range(2000):
        mangled = bytearray(data)
        for _ in range(rng.randint(1, 3)):
            mangled[rng.randrange(len(mangled))] = rng.randrange(256)
        cases.append(bytes(mangled))
    disagree = [c for c in cases if _ours(c) != _reference(c)]
    assert disagree == []
