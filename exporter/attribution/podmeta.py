"""This node's pods' labels and controller ownerReference, the attribution plug-in's view of the
node's pod store (the kubelet's pod-resources API has neither): what training.py needs to name a GPU
process's job (PodMeta and pod_meta live with the job rules, exporter/collectors/training.py).

Only the two small parts are kept per pod in the view (the store holds the objects once for every
plug-in). Off without API access: then a process's job comes from its environment alone
(exporter/collectors/training.py).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

from exporter.collectors.training import PodMeta, pod_meta
from exporter.kube.pods import Pods

log = logging.getLogger(__name__)


PodMetas = Mapping[tuple[str, str], PodMeta]  # (namespace, name) -> its metadata


def pod_metas(pods: Pods) -> PodMetas:
    """Every pod's metadata: a map made whole on each change, never changed in place (the rank rows
    are kept while it is the same object)."""
    # rebuilt per change: pods of one node are few, and a rebuild never leaves a deleted pod behind
    return {key: pod_meta(pod) for key, pod in pods.items()}
