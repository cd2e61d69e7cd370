"""Builds tests/fixtures/kubelet-grpc-go (grpc-go and k8s.io/kubelet's podresources v1 service at
Kubernetes v1.37.2's versions) with the go command into the neighbours' cache, one folder per digest
of its source. scripts/setup runs `python -m tests.attribution.grpc_go_server`; the tests call
`build()`, which finds it built (or builds it, under a lock, when the source changed since)."""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

from demo.neighbours import cache_dir

SOURCE = Path(__file__).resolve().parents[1] / "fixtures" / "kubelet-grpc-go"
BUILD_TIMEOUT_SECONDS = 600


def build() -> Path:
    """The server binary, built once per source digest (xdist workers and setup share the lock)."""
    digest = hashlib.sha256(
        b"".join((SOURCE / name).read_bytes() for name in ("go.mod", "go.sum", "main.go"))
    ).hexdigest()[:16]
    folder = cache_dir() / f"kubelet-grpc-go-{digest}"
    binary = folder / "bin" / "kubelet-grpc-go"
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not os.access(binary, os.X_OK):
            go = shutil.which("go")
            if go is None:
                raise RuntimeError("the go command is missing: Go 1.26 builds tests/fixtures/kubelet-grpc-go")
            env = {**os.environ, "CGO_ENABLED": "0", "GOTOOLCHAIN": os.environ.get("GOTOOLCHAIN", "auto")}
            env["GOFLAGS"] = "-buildvcs=false -trimpath"
            built = subprocess.run(
                [go, "build", "-mod=readonly", "-o", f"{binary}.tmp", "."],
                cwd=SOURCE,
                env=env,
                capture_output=True,
                text=True,
                timeout=BUILD_TIMEOUT_SECONDS,
                check=False,
            )
            if built.returncode != 0:
                raise RuntimeError(f"go build of {SOURCE} failed:\n{built.stderr}")
            os.replace(f"{binary}.tmp", binary)
    return binary


if __name__ == "__main__":
    print(f"kubelet-grpc-go {build()}", file=sys.stderr)
