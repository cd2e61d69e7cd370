"""Pod UID -> (namespace, name) from the kubelet's pod directories (/var/lib/kubelet/pods/<uid>/).

pod-resources names pods but has no UIDs, while cgroups give UIDs but no names. The kubelet's
per-pod directory bridges them without an API-server call: `etc-hosts` ends with the pod's
hostname (its name unless spec.hostname is set) and the service-account projected volume holds a
`namespace` file. Answers are hints; the resolver accepts them only if pod-resources lists the pod.
"""

from __future__ import annotations

import glob
import os

DEFAULT_PODS_DIR = "/var/lib/kubelet/pods"


class PodDirectory:
    """Reads hints from <pods_dir>/<uid>/ (blocking; call in a thread)."""

    def __init__(self, pods_dir: str = DEFAULT_PODS_DIR) -> None:
        self.pods_dir = pods_dir

    def lookup(self, uid: str) -> tuple[str, str] | None:
        """(namespace or "", hostname) for a pod UID, or None when the directory has no hints."""
        base = os.path.join(self.pods_dir, uid)
        name, namespace = _hostname(os.path.join(base, "etc-hosts"))
        if not name:
            return None
        if not namespace:
            for path in glob.glob(
                os.path.join(glob.escape(base), "volumes", "kubernetes.io~projected", "*", "namespace")
            ):
                namespace = _read_first_line(path)
                if namespace:
                    break
        return namespace, name


def _read_first_line(path: str) -> str:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.readline().strip()
    except OSError:
        return ""


def _hostname(path: str) -> tuple[str, str]:
    """Last host entry of a kubelet-managed etc-hosts: (hostname, namespace from an FQDN or "")."""
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            lines = [line.split() for line in f if line.strip() and not line.lstrip().startswith("#")]
    except OSError:
        return "", ""
    if not lines or len(lines[-1]) < 2:
        return "", ""
    names = lines[-1][1:]
    namespace = ""
    for name in names:
        # hostname.subdomain.<namespace>.svc.<cluster-domain> when the pod has a subdomain
        labels = name.split(".")
        if len(labels) >= 4 and labels[3] == "svc":
            namespace = labels[2]
    return names[-1].split(".")[0], namespace
