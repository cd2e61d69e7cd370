"""Pages read through an endpoint's page plan read exactly as the full parser reads them: a page with
the plan's structure and new values, and any page that leaves it anywhere (a new or gone series, a
changed label, comment or type, a value Prometheus refuses, a timestamp, a cut, a cap), in any
chunking; a page whose structure changes every scrape is not planned every scrape."""

from __future__ import annotations

import random
import re

import pytest

from exporter.engines.detect import PREFIXES, WANTED
from exporter.errors import ExpositionError
from exporter.exposition import parse as exposition
from exporter.exposition.pageplan import same
from exporter.exposition.parse import PLAN_KEY, Exposition, ExpositionParser

from .conftest import FIXTURES, load_fixture

PAGES = sorted(p.stem for p in FIXTURES.glob("*.prom"))
_VALUE = re.compile(r"^([^#].*? )(-?[0-9][0-9.e+-]*)$", re.MULTILINE)  # a sample line's value


def _scrape(
    cache: dict[str, object] | None,
    text: str,
    chunks: list[int] | None = None,
    max_samples: int | None = None,
    cut: int | None = None,
) -> Exposition | str:
    """The page fed in these chunks, as fetch_page feeds it; an ExpositionError as its text."""
    try:
        return _feed(cache, text, chunks, max_samples, cut)
    except ExpositionError as exc:
        return str(exc)


def _feed(
    cache: dict[str, object] | None,
    text: str,
    chunks: list[int] | None,
    max_samples: int | None,
    cut: int | None,
) -> Exposition:
    parser = ExpositionParser(WANTED, max_samples, PREFIXES, cache, plans=cache is not None)  # type: ignore[arg-type]
    data = text.encode()
    if cut is not None:
        data = data[:cut]
    pos = 0
    for size in chunks or [len(data) or 1]:
        if pos >= len(data) or not parser.feed_bytes(data[pos : pos + size]):
            break
        pos += size
    if pos < len(data) and not parser.stopped:
        parser.feed_bytes(data[pos:])
    return parser.finish(truncated="too_large" if cut is not None else None)


def _full(
    text: str, chunks: list[int] | None = None, max_samples: int | None = None, cut: int | None = None
) -> Exposition | str:
    """The page as a parser without a cache or plan reads it, in the same chunks."""
    return _scrape(None, text, chunks, max_samples, cut)


def _same(a: Exposition | str, b: Exposition | str) -> bool:
    if isinstance(a, str) or isinstance(b, str):
        return a == b
    return same(a, b)


def _planned(text: str) -> dict[str, object]:
    """A cache holding the plan of this page (two scrapes: the first fills the cache, the second plans)."""
    cache: dict[str, object] = {}
    _scrape(cache, text)
    _scrape(cache, text)
    slot = cache[PLAN_KEY]
    assert getattr(slot, "plan", None) is not None, "the page got no plan"
    return cache


def _bumped(text: str, seed: int) -> str:
    rng = random.Random(seed)
    return _VALUE.sub(lambda m: m.group(1) + repr(float(m.group(2)) * (1 + rng.random()) + 1), text)


@pytest.mark.parametrize("page", PAGES)
def test_new_values_in_the_same_structure_read_as_the_full_parser_reads_them(page: str) -> None:
    text = load_fixture(page)
    cache = _planned(text)
    for seed in range(3):
        page_now = _bumped(text, seed)
        chunks = [random.Random(seed).randint(1, 400) for _ in range(400)]
        assert _same(_scrape(cache, page_now, chunks), _full(page_now, chunks))
    assert getattr(cache[PLAN_KEY], "reads", 0) == 3  # read through the plan, not parsed


VLLM = load_fixture("vllm-0.33.0")
LINE = next(line for line in VLLM.splitlines() if line.startswith("vllm:num_requests_waiting{"))
HEAD, VALUE = LINE.rsplit(" ", 1)
HELP = next(line for line in VLLM.splitlines() if line.startswith("# HELP vllm:num_requests_waiting "))
TYPE = "# TYPE vllm:num_requests_waiting gauge"
BUCKET = next(line for line in VLLM.splitlines() if "time_to_first_token_seconds_bucket" in line)


LEAVING = {
    "new series": VLLM.replace(LINE, LINE + "\n" + HEAD.replace('engine="0"', 'engine="9"') + " 3"),
    "gone series": VLLM.replace(LINE + "\n", ""),
    "changed label": VLLM.replace(LINE, HEAD.replace('engine="0"', 'engine="1"') + " 3"),
    "changed help": VLLM.replace(HELP, HELP + " now"),
    "changed type": VLLM.replace(TYPE, "# TYPE vllm:num_requests_waiting counter"),
    "python number": VLLM.replace(LINE, f"{HEAD} 1_000"),
    "not a number": VLLM.replace(LINE, f"{HEAD} many"),
    "timestamp": VLLM.replace(LINE, f"{HEAD} 4 1700000000000"),
    "tab": VLLM.replace(LINE, f"{HEAD}\t4"),
    "two spaces": VLLM.replace(LINE, f"{HEAD}  4"),
    "crlf": VLLM.replace("\n", "\r\n"),
    "no last newline": VLLM.rstrip("\n"),
    "trailing garbage": VLLM + "<html>oops</html>\n",
    "no value": VLLM.replace(LINE, HEAD),
    "nan": VLLM.replace(LINE, f"{HEAD} NaN"),
    "falling bucket": VLLM.replace(BUCKET, BUCKET.rsplit(" ", 1)[0] + " 1e300"),
    "bad bound": VLLM.replace(BUCKET, BUCKET.replace('le="', 'le="x', 1)),
    "over-long line": VLLM.replace(LINE, LINE + "\n" + "x" * 70_000),
    "blank line": VLLM.replace(LINE, LINE + "\n"),
    "empty": "",
    "binary": "\x00\xff" * 500,
}


@pytest.mark.parametrize("name", sorted(LEAVING))
@pytest.mark.parametrize("seed", [1, 2])
def test_a_page_that_leaves_its_plan_anywhere_reads_as_the_full_parser_reads_it(name: str, seed: int) -> None:
    text = LEAVING[name]
    rng = random.Random(seed)
    chunks = [rng.randint(1, 300) for _ in range(2000)]
    cache = _planned(VLLM)
    assert _same(_scrape(cache, text, chunks), _full(text, chunks))
    assert _same(_scrape(_planned(VLLM), text), _full(text))  # and in one piece


@pytest.mark.parametrize("cap", [1, 50, 117, 118])
def test_caps_and_cuts_with_a_plan_read_as_without(cap: int) -> None:
    # the same cache and plan, another sample cap: the plan was made under other settings
    assert _same(_scrape(_planned(VLLM), VLLM, max_samples=cap), _full(VLLM, max_samples=cap))
    size = len(VLLM.encode())
    for cut in (1, size // 2, size - 1, size):
        assert _same(_scrape(_planned(VLLM), VLLM, cut=cut), _full(VLLM, cut=cut)), cut


def test_a_page_changing_every_scrape_is_not_planned_every_scrape(monkeypatch: pytest.MonkeyPatch) -> None:
    attempts = 0
    real = exposition.make_plan

    def counted(*args: object, **kwargs: object) -> object:
        nonlocal attempts
        attempts += 1
        return real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(exposition, "make_plan", counted)
    cache: dict[str, object] = {}
    for n in range(60):  # a label that names the scrape: a new structure every time
        text = VLLM.replace(LINE, HEAD.replace('engine="0"', f'engine="{n}"') + " 1")
        assert _same(_scrape(cache, text), _full(text))
    assert attempts <= 12  # backed off to one attempt in up to 64 scrapes
    steady = VLLM
    for _ in range(80):  # once the page settles, it is planned again and read through the plan
        assert _same(_scrape(cache, steady), _full(steady))
    assert getattr(cache[PLAN_KEY], "reads", 0) > 0


def test_a_page_too_big_or_a_parse_without_cache_makes_no_plan() -> None:
    cache: dict[str, object] = {}
    big = VLLM + "".join(f'other_family{{i="{i}"}} 1\n' for i in range(5000))
    for _ in range(3):
        assert _same(_scrape(cache, big), _full(big))
    assert getattr(cache[PLAN_KEY], "plan", "missing") is None
    parser = ExpositionParser(WANTED, None, PREFIXES, {})  # a first scrape: no plan is made
    parser.feed(VLLM)
    parser.finish()
