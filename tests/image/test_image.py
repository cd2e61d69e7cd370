"""The OCI image, built here (scripts/build-image: mmdebstrap + buildah, no registry pull), runs both
programs as nobody: the simulated exporter serves metrics to a scrape, the controller takes a webhook.

The first run builds the image (about two minutes: the Debian root filesystem and the wheels are
downloaded once and cached under .work/image); later runs reuse it while its inputs are unchanged.
Programs run from the image with `buildah run` (chroot isolation: no daemon, the host's network).
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import signal
import subprocess
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests.fakes.intake import notification
from tests.fakes.prometheus_process import free_port

ROOT = Path(__file__).resolve().parents[2]
IMAGE_DIR = Path(os.environ.get("GPUPULSE_IMAGE_DIR", ROOT / ".work" / "image"))
BUILDAH = ["buildah", "--root", str(IMAGE_DIR / "storage"), "--runroot", str(IMAGE_DIR / "run"),
           "--storage-driver", "vfs"]  # fmt: skip
NOBODY = "65534:65534"

pytestmark = [
    pytest.mark.image,
    pytest.mark.timeout(900),
    pytest.mark.skipif(
        shutil.which("buildah") is None or shutil.which("mmdebstrap") is None,
        reason="buildah and mmdebstrap are not installed (scripts/setup installs them)",
    ),
]


@pytest.fixture(scope="module")
def image() -> str:
    """The image of the current tree (built or reused by scripts/build-image)."""
    built = subprocess.run(
        [str(ROOT / "scripts" / "build-image")], capture_output=True, text=True, timeout=850, check=False
    )
    assert built.returncode == 0, built.stderr[-4000:]
    return built.stdout.strip().splitlines()[-1]


@pytest.fixture(scope="module")
def container(image: str) -> Iterator[str]:
    """A working container of the image, removed afterwards."""
    name = subprocess.run(
        [*BUILDAH, "from", "--pull=never", "--quiet", image],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    ).stdout.strip()
    try:
        yield name
    finally:
        subprocess.run([*BUILDAH, "rm", name], capture_output=True, check=False, timeout=120)


def _inspect(image: str) -> dict[str, Any]:
    out = subprocess.run(
        [*BUILDAH, "inspect", "--type", "image", image], capture_output=True, text=True, check=True
    )
    doc: dict[str, Any] = json.loads(out.stdout)
    return doc


def test_the_image_runs_as_nobody_with_both_programs(image: str, container: str) -> None:
    config = _inspect(image)["OCIv1"]["config"]
    assert config["User"] == NOBODY
    assert config["Cmd"] == ["gpupulse-exporter"] and not config.get("Entrypoint")
    assert {"9842/tcp", "9836/tcp"} <= set(config["ExposedPorts"])
    probe = subprocess.run(
        [*BUILDAH, "run", "--isolation", "chroot", container, "--", "sh", "-c",
         "id -u; command -v gpupulse-exporter; command -v gpupulse-remediation; "
         "python3 -c 'import pip' 2>&1 | tail -n 1"],
        capture_output=True, text=True, check=True, timeout=120,
    )  # fmt: skip
    uid, exporter, controller, pip = probe.stdout.strip().splitlines()
    assert uid == "65534"
    assert (
        exporter == "/opt/gpupulse/bin/gpupulse-exporter"
        and controller == "/opt/gpupulse/bin/gpupulse-remediation"
    )
    assert "No module named 'pip'" in pip  # nothing in the image installs anything


@asynccontextmanager
async def _run(container: str, *command: str, port: int) -> AsyncIterator[str]:
    """Run a command of the image as nobody until the block ends; its URL once /readyz answers 200."""
    proc = await asyncio.create_subprocess_exec(
        *BUILDAH, "run", "--isolation", "chroot", "--user", NOBODY, container, "--", *command,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        async with aiohttp.ClientSession() as session, asyncio.timeout(60):
            while True:
                assert proc.returncode is None, (
                    (await proc.stdout.read()).decode()[-3000:] if proc.stdout else ""
                )
                try:
                    async with session.get(f"{url}/readyz") as resp:
                        if resp.status == 200:
                            break
                except aiohttp.ClientConnectionError:
                    pass
                await asyncio.sleep(0.2)
        yield url
    finally:
        if proc.returncode is None:
            os.killpg(proc.pid, signal.SIGTERM)  # buildah and the program it runs: our own process group
            try:
                await asyncio.wait_for(proc.wait(), 20)
            except TimeoutError:
                os.killpg(proc.pid, signal.SIGKILL)
                await proc.wait()


async def test_the_simulated_exporter_serves_metrics_from_the_image(container: str) -> None:
    port = free_port()
    command = ("gpupulse-exporter", "--simulate", "demo", "--web.listen-address", f"127.0.0.1:{port}")
    async with _run(container, *command, port=port) as url, aiohttp.ClientSession() as session:
        async with session.get(f"{url}/metrics") as resp:
            assert resp.status == 200
            text = await resp.text()
    lines = text.splitlines()
    assert sum(1 for line in lines if line.startswith("gpu_up{")) == 8  # the demo node's GPUs
    (build,) = [line for line in lines if line.startswith("gpupulse_build_info{")]
    assert 'version="0.1.0"' in build


def _write_token(container: str, token: str) -> None:
    """The webhook token as the chart mounts it: a file the controller (nobody) can read."""
    script = f"mkdir -p /tmp/smoke && printf %s {token} > /tmp/smoke/token && chown -R 65534:65534 /tmp/smoke"
    done = subprocess.run(
        [*BUILDAH, "run", "--isolation", "chroot", container, "--", "sh", "-c", script],
        capture_output=True, text=True, check=False, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr


async def test_the_controller_takes_a_webhook_from_the_image(container: str, tmp_path: Path) -> None:
    token = "image-smoke-token-0123456789abcdef"
    await asyncio.to_thread(_write_token, container, token)
    port = free_port()
    command = (
        "gpupulse-remediation", "serve", f"--web.listen-address=127.0.0.1:{port}",
        "--auth.token-file=/tmp/smoke/token", "--storage.path=/tmp/smoke/state", "--backend=local",
        "--dry-run", "--pager=none",
    )  # fmt: skip
    auth = {"Authorization": f"Bearer {token}"}
    async with _run(container, *command, port=port) as url, aiohttp.ClientSession() as session:
        async with session.post(f"{url}/api/v1/alerts", json=notification()) as resp:
            assert resp.status == 401  # no token
        async with session.post(f"{url}/api/v1/alerts", json=notification(), headers=auth) as resp:
            assert resp.status in (200, 202), await resp.text()
        async with session.get(f"{url}/metrics") as resp:
            metrics = await resp.text()
        async with session.get(f"{url}/api/v1/incidents", headers=auth) as resp:
            assert resp.status == 200
    accepted = [
        line for line in metrics.splitlines() if line.startswith("gpupulse_remediation_alerts_received_total")
    ]
    assert accepted and float(accepted[0].rsplit(" ", 1)[1]) >= 1
