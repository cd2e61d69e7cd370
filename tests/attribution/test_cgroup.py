"""Pod UID and container id from every cgroup layout kubelets produce."""

from __future__ import annotations

import pytest

from exporter.host.cgroup import CgroupIdentity, parse_cgroup
from tests.attribution.helpers import (
    cgroup_host,
    cgroup_v1_cgroupfs,
    cgroup_v1_systemd_docker,
    cgroup_v2_guaranteed,
    cgroup_v2_systemd,
)

UID = "1f0c2d3e-4a5b-6c7d-8e9f-0a1b2c3d4e5f"
CID = "0123456789abcdef" * 4
U_ = UID.replace("-", "_")  # the systemd driver escapes dashes in slice names


@pytest.mark.parametrize(
    "text",
    [
        cgroup_v2_systemd(UID, CID),
        cgroup_v2_systemd(UID, CID, runtime="crio", qos="besteffort"),
        cgroup_v2_guaranteed(UID, CID),
        cgroup_v1_cgroupfs(UID, CID),
        cgroup_v1_systemd_docker(UID, CID),
        f"0::/kubepods/burstable/pod{UID}/{CID}\n",  # v2 cgroupfs driver
        f"0::/../../kubepods-besteffort-pod{U_}.slice/cri-containerd-{CID}.scope\n",  # cgroupns
        f"0::/kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-pod{U_}.slice/"
        f"cri-containerd-{CID}.scope\n",  # kind: a kubelet nested in a container
    ],
    ids=[
        "v2-systemd-containerd",
        "v2-systemd-crio",
        "v2-guaranteed-crio",
        "v1-cgroupfs",
        "v1-systemd-docker",
        "v2-cgroupfs",
        "v2-cgroupns",
        "kind",
    ],
)
def test_pod_uid_and_container_id_are_found(text: str) -> None:
    assert parse_cgroup(text) == CgroupIdentity(pod_uid=UID, container_id=CID)


def test_process_in_the_pod_cgroup_itself_has_no_container() -> None:
    assert parse_cgroup(f"0::/kubepods/besteffort/pod{UID}\n") == CgroupIdentity(UID, "")


def test_crio_conmon_is_not_the_container() -> None:
    assert parse_cgroup(f"0::/kubepods.slice/kubepods-pod{U_}.slice/crio-conmon-{CID}.scope\n") == (
        CgroupIdentity(UID, "")
    )


@pytest.mark.parametrize(
    "text", [cgroup_host(), "0::/\n", "", "garbage without colons\n", "0::/user.slice/podman.scope"]
)
def test_processes_outside_pods_have_no_identity(text: str) -> None:
    assert parse_cgroup(text) is None
