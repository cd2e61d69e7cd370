"""Fake C functions: NVLink state and remote ends, P2P status and PCIe topology between GPUs."""

from __future__ import annotations

from typing import Any

import pynvml as N

from exporter.sim.registry import (
    INVALID_ARGUMENT,
    NOT_SUPPORTED,
    SUCCESS,
    as_int,
    device_symbol,
    out,
    pointer_value,
)
from exporter.sim.runtime import SimGpu, SimState
from exporter.sim.sym_device import fill_pci_info

# Where the simulated NVSwitches sit on the PCI bus
_SWITCH_BUS_IDS = tuple(f"00000000:{0xC0 + i:02X}:00.0" for i in range(4))
_SWITCH_DEVICE_ID = 0x22A310DE


def _link(dev: SimGpu, link: Any) -> int | None:
    nv = dev.spec.nvlink
    i = as_int(link)
    if nv is None or not 0 <= i < nv.links:
        return None
    return i


@device_symbol()
def nvmlDeviceGetNvLinkState(state: SimState, dev: SimGpu, t: float, link: Any, ref: Any) -> int:
    i = _link(dev, link)
    if i is None:
        return NOT_SUPPORTED if dev.spec.nvlink is None else INVALID_ARGUMENT
    assert dev.spec.nvlink is not None
    out(ref).value = N.NVML_FEATURE_DISABLED if i in dev.spec.nvlink.down_links else N.NVML_FEATURE_ENABLED
    return SUCCESS


@device_symbol()
def nvmlDeviceGetNvLinkVersion(state: SimState, dev: SimGpu, t: float, link: Any, ref: Any) -> int:
    if _link(dev, link) is None:
        return NOT_SUPPORTED
    out(ref).value = {5: 2, 7: 3, 9: 4, 10: 5}.get(dev.model.architecture, 4)
    return SUCCESS


def _peer(dev: SimGpu, i: int) -> int | None:
    assert dev.spec.nvlink is not None
    for p in dev.spec.nvlink.peers:
        if p.link == i:
            return p.peer_gpu_index
    return None


@device_symbol()
def nvmlDeviceGetNvLinkRemoteDeviceType(state: SimState, dev: SimGpu, t: float, link: Any, ref: Any) -> int:
    i = _link(dev, link)
    if i is None:
        return NOT_SUPPORTED
    assert dev.spec.nvlink is not None
    if dev.spec.nvlink.switch:
        out(ref).value = N.NVML_NVLINK_DEVICE_TYPE_SWITCH
    elif _peer(dev, i) is not None:
        out(ref).value = N.NVML_NVLINK_DEVICE_TYPE_GPU
    else:
        out(ref).value = N.NVML_NVLINK_DEVICE_TYPE_UNKNOWN
    return SUCCESS


@device_symbol()
def nvmlDeviceGetNvLinkRemotePciInfo_v2(state: SimState, dev: SimGpu, t: float, link: Any, ref: Any) -> int:
    i = _link(dev, link)
    if i is None:
        return NOT_SUPPORTED
    assert dev.spec.nvlink is not None
    if dev.spec.nvlink.switch:
        # On NVSwitch systems the remote end is the switch, never the peer GPU
        fill_pci_info(out(ref), _SWITCH_BUS_IDS[i % len(_SWITCH_BUS_IDS)], _SWITCH_DEVICE_ID)
        return SUCCESS
    peer = _peer(dev, i)
    if peer is None:
        return NOT_SUPPORTED
    other = state.gpus[peer]
    fill_pci_info(out(ref), other.spec.pci_bus_id, other.model.pci_device_id)
    return SUCCESS


def _other(state: SimState, handle: Any) -> SimGpu | None:
    dev = state.by_handle.get(pointer_value(handle) or 0)
    return dev if isinstance(dev, SimGpu) else None


def nvlink_connected(a: SimGpu, b: SimGpu) -> bool:
    """Whether two GPUs reach each other over NVLink (direct link or both on NVSwitch)."""
    na, nb = a.spec.nvlink, b.spec.nvlink
    if na is None or nb is None:
        return False
    if na.switch and nb.switch:
        return True
    return any(p.peer_gpu_index == b.index for p in na.peers) or any(
        p.peer_gpu_index == a.index for p in nb.peers
    )


@device_symbol()
def nvmlDeviceGetP2PStatus(state: SimState, dev: SimGpu, t: float, other: Any, index: Any, ref: Any) -> int:
    peer = _other(state, other)
    if peer is None:
        return INVALID_ARGUMENT
    caps = as_int(index)
    if caps == N.NVML_P2P_CAPS_INDEX_NVLINK:
        ok = nvlink_connected(dev, peer)
    else:
        ok = caps in (
            0,
            N.NVML_P2P_CAPS_INDEX_WRITE,
            N.NVML_P2P_CAPS_INDEX_ATOMICS,
            N.NVML_P2P_CAPS_INDEX_PCI,
        )
    out(ref).value = N.NVML_P2P_STATUS_OK if ok else N.NVML_P2P_STATUS_NOT_SUPPORTED
    return SUCCESS


@device_symbol()
def nvmlDeviceGetTopologyCommonAncestor(state: SimState, dev: SimGpu, t: float, other: Any, ref: Any) -> int:
    peer = _other(state, other)
    if peer is None:
        return INVALID_ARGUMENT
    half = max(len(state.gpus) // 2, 1)
    # GPU pairs share a PCIe switch, halves share a NUMA node (HGX-like layout)
    if peer.index == dev.index:
        level = N.NVML_TOPOLOGY_INTERNAL
    elif peer.index // 2 == dev.index // 2:
        level = N.NVML_TOPOLOGY_SINGLE
    elif peer.index // half == dev.index // half:
        level = N.NVML_TOPOLOGY_NODE
    else:
        level = N.NVML_TOPOLOGY_SYSTEM
    out(ref).value = level
    return SUCCESS


@device_symbol()
def nvmlDeviceGetNvLinkErrorCounter(
    state: SimState, dev: SimGpu, t: float, link: Any, counter: Any, ref: Any
) -> int:
    if _link(dev, link) is None:
        return NOT_SUPPORTED
    if not 0 <= as_int(counter) <= N.NVML_NVLINK_ERROR_DL_ECC_DATA:
        return INVALID_ARGUMENT
    # Links in the simulation never see errors
    out(ref).value = 0
    return SUCCESS
