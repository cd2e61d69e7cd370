"""Builders for attribution tests: a procfs fixture tree, kubelet pod dirs, family lookups."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from prometheus_client.core import Metric
from prometheus_client.samples import Sample

from exporter.sim.scenario_types import ProcessSpec
from tests.fakes.kubelet import pod_uid

CLOCK_TICKS = 100


def cgroup_v2_systemd(uid: str, cid: str, runtime: str = "cri-containerd", qos: str = "burstable") -> str:
    """cgroup v2, systemd driver: kubepods-<qos>-pod<uid_>.slice/<runtime>-<id>.scope."""
    u = uid.replace("-", "_")
    return f"0::/kubepods.slice/kubepods-{qos}.slice/kubepods-{qos}-pod{u}.slice/{runtime}-{cid}.scope\n"


def cgroup_v2_guaranteed(uid: str, container_id: str) -> str:
    """cgroup v2, systemd driver, Guaranteed QoS (no QoS slice), cri-o."""
    u = uid.replace("-", "_")
    return f"0::/kubepods.slice/kubepods-pod{u}.slice/crio-{container_id}.scope\n"


def cgroup_v1_cgroupfs(uid: str, container_id: str, qos: str = "besteffort") -> str:
    """cgroup v1, cgroupfs driver (docker/containerd): one line per controller hierarchy."""
    lines = [
        f"12:pids:/kubepods/{qos}/pod{uid}/{container_id}",
        f"11:memory:/kubepods/{qos}/pod{uid}/{container_id}",
        f"4:cpu,cpuacct:/kubepods/{qos}/pod{uid}/{container_id}",
        "1:name=systemd:/system.slice/containerd.service",
    ]
    return "\n".join(lines) + "\n"


def cgroup_v1_systemd_docker(uid: str, container_id: str) -> str:
    """cgroup v1, systemd driver, docker runtime."""
    u = uid.replace("-", "_")
    path = (
        f"/kubepods.slice/kubepods-burstable.slice/"
        f"kubepods-burstable-pod{u}.slice/docker-{container_id}.scope"
    )
    return f"9:devices:{path}\n3:memory:{path}\n0::/\n"


def cgroup_host() -> str:
    """A process outside Kubernetes (a systemd service)."""
    return "0::/system.slice/inference.service\n"


class ProcfsTree:
    """A fake /proc with cgroup, stat and maps files per PID."""

    def __init__(self, root: Path) -> None:
        self.root = root
        root.mkdir(parents=True, exist_ok=True)

    def add(
        self,
        pid: int,
        cgroup: str,
        utime_ticks: int = 0,
        stime_ticks: int = 0,
        comm: str = "python3",
        maps: Sequence[str] = (),
        start_ticks: int = 1000,
    ) -> None:
        """Create (or overwrite) /proc/<pid>; start_ticks is its start time (a reused PID starts later)."""
        d = self.root / str(pid)
        d.mkdir(exist_ok=True)
        (d / "cgroup").write_text(cgroup)
        # After comm: state ppid pgrp session tty_nr tpgid flags minflt cminflt majflt cmajflt utime stime
        # cutime cstime priority nice num_threads itrealvalue starttime vsize rss
        ticks = f"{utime_ticks} {stime_ticks}"
        tail = f"0 0 20 0 1 0 {start_ticks} 1000000 100"
        (d / "stat").write_text(f"{pid} ({comm}) S 1 {pid} {pid} 0 -1 4194304 10 0 0 0 {ticks} {tail}\n")
        lines = [
            f"7f00000{i:05x}000-7f00000{i + 1:05x}000 r--s 00000000 fd:01 {1000 + i} {p}"
            for i, p in enumerate(maps)
        ]
        (d / "maps").write_text("\n".join(lines) + ("\n" if lines else ""))

    def set_environ(self, pid: int, env: Mapping[str, str] | bytes) -> None:
        """/proc/<pid>/environ: NUL-separated KEY=VALUE entries, each NUL-terminated, as the kernel
        shows the process's initial environment (or raw bytes, for hostile cases)."""
        blob = (
            env if isinstance(env, bytes) else b"".join(f"{k}={v}".encode() + b"\0" for k, v in env.items())
        )
        (self.root / str(pid) / "environ").write_bytes(blob)

    def remove(self, pid: int) -> None:
        """The process exited."""
        d = self.root / str(pid)
        for child in d.iterdir():
            child.unlink()
        d.rmdir()


def procfs_from_scenario(tree: ProcfsTree, pods_dir: Path, doc: Mapping[str, Any]) -> None:
    """A /proc entry per scenario process (pod cgroup if a pod lists its PID) and kubelet pod dirs."""
    owner: dict[int, tuple[str, str]] = {}
    environ: dict[int, Mapping[str, Any]] = {}
    for entry in doc.get("pods") or ():
        namespace, name = str(entry.get("namespace", "default")), str(entry["name"])
        write_pod_dir(pods_dir, pod_uid(namespace, name), namespace, name)
        for container in entry.get("containers") or ():
            for pid in container.get("pids") or ():
                owner[int(pid)] = (namespace, name)
                if container.get("env"):
                    environ[int(pid)] = container["env"]
    for proc in doc.get("processes") or ():
        pid = int(proc["pid"])
        if pid in owner:
            cgroup = cgroup_v2_systemd(pod_uid(*owner[pid]), f"{pid:064x}")
        else:
            cgroup = cgroup_host()
        tree.add(pid, cgroup, utime_ticks=pid % 1000, comm=str(proc.get("name", "python3"))[:15])
        if pid in environ:
            tree.set_environ(pid, {str(k): str(v) for k, v in environ[pid].items()})


# the state letter /proc/<pid>/stat shows for each gpu_process_state{state} name
STATE_LETTERS = {
    "running": "R", "sleeping": "S", "disk_sleep": "D", "stopped": "T", "zombie": "Z", "idle": "I",
    "other": "X",
}  # fmt: skip


def _replace(path: Path, text: str) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(text)
    tmp.replace(path)  # atomically: an exporter may read it meanwhile


def set_cpu_ticks(root: Path, pid: int, ticks: int, state: str | None = None) -> None:
    """Rewrite utime (and the state letter) in a fake /proc/<pid>/stat."""
    stat = root / str(pid) / "stat"
    head, _, rest = stat.read_text().rpartition(") ")
    fields = rest.split()
    fields[11] = str(ticks)  # utime, counted from the state field
    if state is not None:
        fields[0] = STATE_LETTERS[state]
    _replace(stat, f"{head}) {' '.join(fields)}\n")


def set_io(root: Path, pid: int, rchar: int, wchar: int) -> None:
    """A fake /proc/<pid>/io in the kernel's layout (read_bytes/write_bytes: a page-cache-only world)."""
    text = (
        f"rchar: {rchar}\nwchar: {wchar}\nsyscr: {rchar // 4096}\nsyscw: {wchar // 4096}\n"
        "read_bytes: 0\nwrite_bytes: 0\ncancelled_write_bytes: 0\n"
    )
    _replace(root / str(pid) / "io", text)


def advance_host_cpu(root: Path, processes: Iterable[ProcessSpec], t: float, ticks_per_second: int) -> None:
    """Each scenario process's CPU time, state and I/O bytes at scenario time t (its curves, integrated)."""
    for proc in processes:
        if (root / str(proc.pid)).is_dir():
            ticks = int(proc.host_cpu_seconds(t) * ticks_per_second)
            set_cpu_ticks(root, proc.pid, ticks, proc.host_state_at(t))
            set_io(root, proc.pid, proc.io_read_bytes(t), proc.io_write_bytes(t))


def write_pod_dir(pods_dir: Path, uid: str, namespace: str, name: str, ip: str = "10.244.1.7") -> None:
    """A kubelet pod directory with a managed etc-hosts and a service-account namespace file."""
    base = pods_dir / uid
    token_dir = base / "volumes" / "kubernetes.io~projected" / "kube-api-access-x7k2p"
    token_dir.mkdir(parents=True)
    (base / "etc-hosts").write_text(
        f"# Kubernetes-managed hosts file.\n127.0.0.1\tlocalhost\n::1\tlocalhost\n{ip}\t{name}\n"
    )
    (token_dir / "namespace").write_text(namespace)


def samples(families: Iterable[Metric], name: str) -> list[Sample]:
    """All samples named `name` across families."""
    return [s for f in families for s in f.samples if s.name == name]


def label_rows(families: Iterable[Metric], name: str, *labels: str) -> set[tuple[str, ...]]:
    """The chosen label values of every sample named `name`."""
    return {tuple(s.labels[label] for label in labels) for s in samples(families, name)}
