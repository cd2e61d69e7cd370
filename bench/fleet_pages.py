"""Exporter pages for the fleet bench: captured from real simulated nodes, rewritten per simulated node.

Capture (once; the pages are committed under bench/fleet_pages/):

    .venv/bin/python -m bench.fleet_pages --out bench/fleet_pages

  training-a.txt, training-b.txt  the two nodes of the training rig's healthy 2 x 8 PyTorchJob
                                  (tests/alerts/training_rig.py: real attribution through a fake
                                  kubelet, /proc and API server, so rank and allocation series are real)
  serving.txt                     `--simulate incident-serving` with its simulated vLLM engine read by
                                  the engine collector (`--engines.config`)

Rewrite: `for_node(page, node)` makes one page the page of another node: every GPU UUID, pod and
training job name gets the node's suffix, so no two simulated nodes share a series or a join key
(`on(uuid)`, `by (training_job)`). Two training pages of the same pair index share their job name,
so a job keeps its 16 ranks on two nodes, as in the rig.
"""

from __future__ import annotations

import argparse
import asyncio
import re
import sys
import tempfile
import time
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

PAGES = Path(__file__).resolve().parent / "fleet_pages"

# label values that name something on one node; each gets the node's suffix
_PER_NODE_LABELS = ("uuid", "peer_uuid", "pod", "gpu_uuid", "pod_uid")
_PER_JOB_LABELS = ("training_job",)
_LABEL = re.compile(r'(?P<name>[a-zA-Z_][a-zA-Z0-9_]*)="(?P<value>(?:[^"\\]|\\.)*)"')


class PageError(ValueError):
    """A page that cannot be rewritten (not exposition text, or a sample line out of shape)."""


@dataclass(frozen=True)
class SimNode:
    """One simulated node: its name, which captured page it serves and the job pair it belongs to."""

    name: str
    kind: str  # a page name: training-a, training-b, serving
    job: str = ""  # the training job's name on this node (shared by the pair)


def _suffix_value(value: str, suffix: str) -> str:
    # uuid lists (comma separated, e.g. a pod holding several GPUs) keep their shape
    return ",".join(f"{v}-{suffix}" if v else v for v in value.split(","))


def for_node(page: str, node: SimNode) -> str:
    """The page as `node` would serve it: per-node label values suffixed, the job renamed."""
    if not page.strip():
        raise PageError("empty page")

    def label(m: re.Match[str]) -> str:
        name, value = m.group("name"), m.group("value")
        if name in _PER_NODE_LABELS and value:
            return f'{name}="{_suffix_value(value, node.name)}"'
        if name in _PER_JOB_LABELS and value and node.job:
            return f'{name}="{node.job}"'
        return m.group(0)

    out: list[str] = []
    for number, line in enumerate(page.splitlines(), 1):
        if not line or line.startswith("#"):
            out.append(line)
            continue
        brace = line.find("{")
        if brace < 0:
            out.append(line)
            continue
        close = line.rfind("}")
        if close < brace:
            raise PageError(f"line {number}: unclosed label set: {line[:80]!r}")
        out.append(line[:brace] + _LABEL.sub(label, line[brace : close + 1]) + line[close + 1 :])
    return "\n".join(out) + "\n"


def fleet(nodes: int, serving_share: float = 0.25) -> list[SimNode]:
    """`nodes` simulated nodes: a quarter serving, the rest training in 2-node jobs (16 ranks each)."""
    if nodes < 1:
        raise PageError(f"nodes must be at least 1, not {nodes}")
    out: list[SimNode] = []
    serving = round(nodes * serving_share)
    for i in range(nodes):
        name = f"gpu-{i:05d}"
        if i < serving:
            out.append(SimNode(name, "serving"))
        else:
            pair = (i - serving) // 2
            out.append(SimNode(name, "training-b" if (i - serving) % 2 else "training-a", f"job-{pair:05d}"))
    return out


def load_pages(directory: Path = PAGES) -> dict[str, str]:
    """The captured pages by kind; a clear error when one is missing."""
    pages = {}
    for kind in ("training-a", "training-b", "serving"):
        path = directory / f"{kind}.txt"
        if not path.is_file():
            raise PageError(f"{path}: missing; capture with python -m bench.fleet_pages --out {directory}")
        pages[kind] = path.read_text()
    return pages


def sample_lines(page: str) -> int:
    """Series on a page (sample lines)."""
    return sum(1 for ln in page.splitlines() if ln and not ln.startswith("#"))


def _get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as r:
        return str(r.read().decode())


async def _capture_training(out: Path) -> None:
    from tests.alerts.training_rig import CASES, fast_profile, running_replay

    with tempfile.TemporaryDirectory(prefix="gp-fleet-") as tmp:
        async with running_replay([CASES["healthy"]], fast_profile(), Path(tmp)) as replay:
            pages: dict[str, str] = {}
            deadline = time.monotonic() + 60
            while len(pages) < 2:  # attribution publishes on its own interval: until both have ranks
                for e in replay.exporters:
                    text = await asyncio.to_thread(_get, f"http://127.0.0.1:{e.port}/metrics")
                    if "gpu_training_rank_info{" in text and "gpu_allocation_info{" in text:
                        pages[e.node] = text
                if time.monotonic() > deadline:
                    raise PageError("training exporters published no rank series within 60 s")
                await asyncio.sleep(1)
    for node, text in pages.items():
        (out / f"training-{node.rsplit('-', 1)[1]}.txt").write_text(text)


async def _capture_serving(out: Path) -> None:
    import yaml

    from bench.proofs.harness import REPO, free_port
    from tests.alerts.children import child_process, wait_http

    scenario = REPO / "exporter" / "scenarios" / "incident-serving.yaml"
    spec = (yaml.safe_load(scenario.read_text()).get("engines") or [{}])[0]
    with tempfile.TemporaryDirectory(prefix="gp-fleet-") as tmp:
        engine_port, exporter_port = free_port(), free_port()
        engine = f"http://127.0.0.1:{engine_port}/metrics"
        entry = {"url": engine, "engine": spec.get("kind", "auto")}
        entry.update({k: spec[k] for k in ("model", "namespace", "pod") if spec.get(k)})
        config = Path(tmp) / "engines.yaml"
        config.write_text(yaml.safe_dump({"engines": [entry]}))
        engine_main = "import sys; from exporter.sim.engines import main; main(sys.argv[1:])"
        exporter_main = "import sys; from exporter.cli import main; sys.exit(main())"
        async with (
            child_process(
                [sys.executable, "-c", engine_main, "--scenario", str(scenario), "--listen", engine[7:-8]],
                Path(tmp) / "engine.log",
            ) as eng,
        ):
            await wait_http(engine, eng)
            async with child_process(
                [
                    sys.executable,
                    "-c",
                    exporter_main,
                    "--simulate",
                    str(scenario),
                    "--engines.config",
                    str(config),
                    f"--web.listen-address=127.0.0.1:{exporter_port}",
                ],
                Path(tmp) / "exporter.log",
            ) as exp:
                url = f"http://127.0.0.1:{exporter_port}/metrics"
                await wait_http(url, exp)
                deadline = time.monotonic() + 60
                while "inference_" not in (text := await asyncio.to_thread(_get, url)):
                    if time.monotonic() > deadline:
                        raise PageError("the serving exporter published no engine series within 60 s")
                    await asyncio.sleep(1)
                await asyncio.sleep(6)  # a few more sampling cycles: every collector has published
                text = await asyncio.to_thread(_get, url)
    (out / "serving.txt").write_text(text)


def summary(pages: Mapping[str, str]) -> Sequence[tuple[str, int]]:
    """(kind, series) per page."""
    return [(k, sample_lines(v)) for k, v in pages.items()]


def main() -> int:
    """Command line: capture the pages."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--out", type=Path, default=PAGES)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    asyncio.run(_capture_training(args.out))
    asyncio.run(_capture_serving(args.out))
    for kind, n in summary(load_pages(args.out)):
        print(f"{kind:<12} {n:>6} series")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
