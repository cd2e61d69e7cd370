"""Which weight files to watch and which model they belong to (blocking; run in a thread)."""

from __future__ import annotations

import glob
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from exporter.collectors.base import PodRef
from exporter.host.procfs import Procfs

WEIGHT_SUFFIXES: tuple[str, ...] = (
    ".safetensors",
    ".bin",
    ".gguf",
    ".pt",
    ".pth",
    ".onnx",
    ".engine",
    ".plan",
)
# A directory given as a path is walked for weight files; a model repo has tens to a few thousand.
_MAX_FILES_PER_DIRECTORY = 10_000


@dataclass(frozen=True)
class ModelKey:
    model: str
    namespace: str
    pod: str


@dataclass(frozen=True)
class PathSpec:
    """A --pagecache.paths entry: `glob`, `model=glob` or `model@namespace/pod=glob`.

    A matching directory means the weight files under it. The pod form labels files that a known
    pod reads without mapping them where we can see (a hostPath model cache, the demo).
    """

    pattern: str
    name: str = ""
    namespace: str = ""
    pod: str = ""

    @classmethod
    def parse(cls, text: str) -> PathSpec:
        """Split the optional `model[@namespace/pod]=` prefix (a bare glob names models by directory).

        Model names may hold a slash (Hugging Face ids such as `meta-llama/Llama-3.1-8B`, vLLM's
        default served name), so a prefix is recognised only in front of an absolute pattern.
        """
        head, sep, pattern = text.partition("=")
        if not sep or not head or head.startswith("/") or not pattern.startswith("/"):
            return cls(pattern=text)
        name, at, owner = head.rpartition("@")
        if not at:
            name, owner = head, ""
        namespace, _, pod = owner.partition("/")
        if not name or (owner and not (namespace and pod and "/" not in pod)):
            return cls(pattern=text)
        return cls(pattern=pattern, name=name, namespace=namespace, pod=pod)


def is_weight_file(path: str) -> bool:
    """Whether a path looks like model weights by its suffix."""
    return path.endswith(WEIGHT_SUFFIXES)


def model_name(path: str) -> str:
    """A model's name from a weight file path: the HF cache repo, else the directory name."""
    parts = [p for p in path.split("/") if p]
    for part in parts:
        # Hugging Face cache: .../models--<org>--<name>/snapshots/<revision>/<file>
        if part.startswith("models--"):
            return part.removeprefix("models--").replace("--", "/")
    return parts[-2] if len(parts) >= 2 else parts[-1]


def configured_files(specs: Iterable[PathSpec]) -> dict[str, set[ModelKey]]:
    """Weight files matched by configured globs (directories expand to the weight files inside)."""
    out: dict[str, set[ModelKey]] = {}
    for spec in specs:
        for match in sorted(glob.glob(spec.pattern, recursive=True)):
            if os.path.isdir(match):
                files = _walk(match)
                name = spec.name or os.path.basename(match.rstrip("/"))
            elif os.path.isfile(match):
                files, name = [match], spec.name or model_name(os.path.abspath(match))
            else:
                continue
            for path in files:
                out.setdefault(os.path.realpath(path), set()).add(ModelKey(name, spec.namespace, spec.pod))
    return out


def _walk(directory: str) -> list[str]:
    found: list[str] = []
    for root, _dirs, names in os.walk(directory):
        found.extend(os.path.join(root, n) for n in sorted(names) if is_weight_file(n))
        if len(found) >= _MAX_FILES_PER_DIRECTORY:
            return found[:_MAX_FILES_PER_DIRECTORY]
    return found


def mapped_files(
    procfs: Procfs, pids: Iterable[int], pid_pods: Mapping[int, PodRef]
) -> dict[str, set[ModelKey]]:
    """Weight files the given processes have mapped, keyed by a path openable from here."""
    out: dict[str, set[ModelKey]] = {}
    for pid in sorted(pids):
        pod = pid_pods.get(pid, PodRef("", "", ""))
        for seen_path in sorted(procfs.mapped_files(pid)):
            if is_weight_file(seen_path):
                key = ModelKey(model_name(seen_path), pod.namespace, pod.pod)
                out.setdefault(procfs.host_path(pid, seen_path), set()).add(key)
    return out
