"""Golden digests of what the engines collector makes of each fixture page, and of hostile variants
of it: the parse (every field of the Exposition), the detected kind, the normalized readings and
their rendered families. A faster parser or normalizer must give the same bytes for the same input.

Each case is a run of scrapes sharing one per-endpoint cache (as the collector does between rounds),
so the warm-cache paths are judged as well as the first scrape. Digests, not the documents (a few MB):
a failure prints the document now produced; regenerate after an intended change with
GPUPULSE_UPDATE_GOLDEN=1 pytest tests/engines -k golden
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from exporter.collectors.series import SeriesFamily
from exporter.engines.detect import NORMALIZERS, PREFIXES, WANTED, detect_kind
from exporter.engines.render import Budget, EndpointView, Families
from exporter.errors import ExpositionError
from exporter.exposition.parse import Exposition, ExpositionParser
from exporter.snapshot import render

from .conftest import FIXTURES

GOLDEN = Path(__file__).parent / "golden" / "parse-digests.json"
UPDATE = os.environ.get("GPUPULSE_UPDATE_GOLDEN") == "1"
PAGES = sorted(p.stem for p in FIXTURES.glob("*.prom"))
_NUMBER = re.compile(r"(?<= )(-?[0-9][0-9.e+-]*)$")
# Lines a sidecar or a broken writer puts on a page: each must cost what it cost before.
HOSTILE_LINES = (
    'vllm:num_requests_running{model_name="x" 1',
    "}{ 1",
    'vllm:num_requests_running{model_name="x"} 1_0',
    "# TYPE",
    "# TYPE vllm:num_requests_running bogus",
    'sglang:num_running_reqs{a="1",a="2"} 1',
    "\x00\x01\x02",
    "# HELP vllm:num_requests_running new \\n text",
    'vllm:num_requests_running{model_name="x"}1',
    "tgi_queue_size 1 2 3",
    "x" * 70_000,
    'vllm:kv_cache_usage_perc{model_name="late"} NaN',
)


def _f(x: float) -> str:
    return repr(float(x))


def _labels(labels: Any) -> list[list[str]]:
    return [[k, v] for k, v in labels.items()]


def _expo(e: Exposition) -> dict[str, Any]:
    return {
        "gauges": [[n, [[_labels(s.labels), _f(s.value)] for s in ss]] for n, ss in e.gauges.items()],
        "counters": [[n, [[_labels(s.labels), _f(s.value)] for s in ss]] for n, ss in e.counters.items()],
        "histograms": [
            [n, [[_labels(h.labels), [[_f(b), _f(c)] for b, c in h.buckets], _f(h.sum), _f(h.count)]]]
            for n, hs in e.histograms.items()
            for h in hs
        ],
        "help": list(e.help.items()),
        "ray_prefixed": e.ray_prefixed,
        "prefixes_seen": sorted(e.prefixes_seen),
        "malformed_families": list(e.malformed_families),
        "malformed_count": e.malformed_count,
        "skipped_lines": e.skipped_lines,
        "samples": e.samples,
        "truncated": e.truncated,
    }


def _plain(value: Any) -> Any:
    """Readings as JSON: floats by repr (NaN, exact digits), dataclasses by their fields."""
    if isinstance(value, float):
        return _f(value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, dict):
        return [[_plain(k), _plain(v)] for k, v in value.items()]
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def _rendered(kind: str, readings: list[Any]) -> str:
    fams = Families(Budget(total=100_000, per_endpoint=10_000))
    view = EndpointView(
        endpoint="http://e:1/metrics",
        kind=kind,
        namespace="ns",
        pod="p",
        models=",".join(sorted({r.model for r in readings})),
        gpus=[("0", "GPU-0")],
        up=True,
        duration_seconds=0.5,
        failures={},
        readings=readings,
        cold_start_seconds=None,
    )
    fams.add(view)
    out = fams.collect(0.0)
    assert all(isinstance(f, SeriesFamily) or f.type == "histogram" for f in out)
    return render(out).decode()


def _scrape(
    cache: dict[str, Any],
    data: bytes,
    chunk: int,
    max_samples: int | None,
    cut_at: int | None,
) -> dict[str, Any]:
    """One scrape as the collector makes it (fetch_page's feeding, then detect and normalize)."""
    parser = ExpositionParser(WANTED, max_samples, PREFIXES, cache)
    body = data if cut_at is None else data[:cut_at]
    out: dict[str, Any] = {}
    try:
        for i in range(0, len(body), chunk):
            if not parser.feed_bytes(body[i : i + chunk]):
                break
        expo = parser.finish(truncated=None if cut_at is None else "too_large")
    except ExpositionError as exc:
        return {"error": str(exc)}
    out["expo"] = _expo(expo)
    kind = detect_kind(expo)
    out["kind"] = kind
    if kind is not None:
        readings = NORMALIZERS[kind](expo)
        out["readings"] = _plain(readings)
        out["rendered"] = _rendered(kind, readings) if readings else ""
    return out


def _bump(text: str, factor: float) -> str:
    """Every sample value moved by an increasing map (so cumulative buckets stay cumulative)."""

    def one(line: str) -> str:
        if line.startswith("#"):
            return line
        m = _NUMBER.search(line)
        if m is None:
            return line
        v = float(m.group(1))
        return line[: m.start()] + repr(v * factor + 1.0 if v >= 0 else v)

    return "\n".join(one(line) for line in text.split("\n"))


def _every(text: str, n: int, change: Callable[[str], str]) -> str:
    lines = text.split("\n")
    return "\n".join(change(line) if i % n == n - 1 else line for i, line in enumerate(lines))


def _insert_hostile(text: str) -> str:
    out, k = [], 0
    for i, line in enumerate(text.split("\n")):
        out.append(line)
        if i % 11 == 5:
            out.append(HOSTILE_LINES[k % len(HOSTILE_LINES)])
            k += 1
        if i % 23 == 7 and line and not line.startswith("#"):
            out.append(line)  # a series given twice
    return "\n".join(out)


def _reverse_families(text: str) -> str:
    """Sample lines of each family in reverse order (buckets after _sum and _count, any order)."""
    out: list[str] = []
    run: list[str] = []
    for line in text.split("\n"):
        if line.startswith("#"):
            out += reversed(run)
            run = []
            out.append(line)
        else:
            run.append(line)
    out += reversed(run)
    return "\n".join(out)


def _falling(text: str) -> str:
    """The second bucket line of each histogram set above every later one: counts that fall."""
    seen: dict[str, int] = {}

    def one(line: str) -> str:
        if "_bucket" not in line or line.startswith("#"):
            return line
        name = line.split("_bucket", 1)[0]
        seen[name] = seen.get(name, 0) + 1
        m = _NUMBER.search(line)
        return line[: m.start()] + "1e300" if seen[name] == 2 and m is not None else line

    return "\n".join(one(line) for line in text.split("\n"))


def _relabel(text: str) -> str:
    return text.replace('model_name="', 'model_name="other-').replace('model="', 'model="other-')


def _retype(text: str) -> str:
    return re.sub(r"^(# TYPE \S+) gauge$", r"\1 counter", text, flags=re.MULTILINE)


Scrape = tuple[str, int, int | None, int | None]  # text, chunk bytes, sample cap, byte cut


def cases(text: str) -> Iterator[tuple[str, list[Scrape]]]:
    """Named runs of scrapes sharing one cache."""
    size = len(text.encode())

    def whole(*pages: str) -> list[Scrape]:
        return [(page, 1 << 20, None, None) for page in pages]

    stamped = _every(text, 3, lambda ln: ln if ln.startswith("#") or not ln else ln + " 1700000000000")
    tabbed = _every(text, 4, lambda ln: ln.replace("} ", "}\t"))
    yield "plain", whole(text, text, _bump(text, 1.5))
    yield "crlf", whole(text.replace("\n", "\r\n"), text.replace("\n", "\r\n"))
    yield "chunks", [(text, 7, None, None), (_bump(text, 2.0), 61, None, None), (text, 4096, None, None)]
    yield "timestamps", whole(text, stamped, text)
    yield "tabs", whole(text, tabbed)
    yield "hostile", [*whole(text, _insert_hostile(text)), (text, 5, None, None)]
    yield "reordered", whole(text, _reverse_families(text))
    yield "falling", whole(text, _falling(text), text)
    yield "relabelled", whole(text, _relabel(text), text)
    yield "retyped", whole(text, _retype(text), text)
    yield "sample_caps", [(text, 99, 1, None), (text, 99, 7, None), (text, 13, 40, None), *whole(text)]
    cuts = (size // 3, 2 * size // 3, size - 1)
    yield "byte_cuts", [(text, 99, None, cuts[0]), (text, 17, None, cuts[1]), (text, 99, None, cuts[2])]


def _document(page: str) -> dict[str, Any]:
    text = (FIXTURES / f"{page}.prom").read_text()
    doc: dict[str, Any] = {}
    for name, scrapes in cases(text):
        cache: dict[str, Any] = {}
        doc[name] = [_scrape(cache, t.encode(), chunk, cap, cut) for t, chunk, cap, cut in scrapes]
    return doc


def _digest(obj: Any) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=False, ensure_ascii=True).encode()).hexdigest()


def _golden() -> dict[str, dict[str, str]]:
    return json.loads(GOLDEN.read_text()) if GOLDEN.exists() else {}


@pytest.mark.parametrize("page", PAGES)
def test_parse_detect_normalize_and_render_match_the_golden_digests(page: str) -> None:
    doc = _document(page)
    plain = doc["plain"][0]
    # not vacuous: the page parses, is recognised and gives readings that render
    assert plain.get("kind") in NORMALIZERS and plain.get("readings") and plain.get("rendered")
    got = {name: _digest(scrapes) for name, scrapes in doc.items()}
    golden = _golden()
    if UPDATE:
        golden[page] = got
        GOLDEN.parent.mkdir(exist_ok=True)
        GOLDEN.write_text(json.dumps(dict(sorted(golden.items())), indent=1) + "\n")
        return
    assert page in golden, f"{page} has no golden digests: run with GPUPULSE_UPDATE_GOLDEN=1"
    for name, digest in got.items():
        assert digest == golden[page][name], (
            f"{page}/{name} differs from the golden digest; now:\n" + json.dumps(doc[name], indent=1)[:20_000]
        )


def test_every_fixture_page_has_golden_digests() -> None:
    assert sorted(_golden()) == PAGES
