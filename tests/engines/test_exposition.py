"""The streaming page parser: a bad line costs only its family, caps bound the work, any chunking reads
the same, and families nothing maps cost (almost) no memory."""

from __future__ import annotations

import math
import random
import tracemalloc

import pytest

from exporter.engines.detect import NORMALIZERS, PREFIXES, WANTED, detect_kind
from exporter.errors import ExpositionError
from exporter.exposition.parse import LABEL_CACHE_MAX, ExpositionParser, parse_exposition

from .conftest import load_fixture

VLLM = load_fixture("vllm-0.33.0")
LLAMA = "meta-llama/Llama-3.1-8B-Instruct"


def parse(text: str, max_samples: int | None = None) -> ExpositionParser:
    parser = ExpositionParser(WANTED, max_samples, PREFIXES)
    parser.feed(text)
    return parser


def test_a_sidecars_malformed_line_costs_only_its_family() -> None:
    # A sidecar exporting on the same port (a common pod layout) writes one line prometheus_client's
    # parser refuses, which used to take every vLLM family down with it.
    sidecar = (
        "# HELP vllm:num_requests_waiting Number of requests waiting to be processed.\n"
        "# TYPE vllm:num_requests_waiting gauge\n"
        'vllm:num_requests_waiting{model_name="sidecar"} 7 extra junk\n'
    )
    real = "# HELP vllm:num_requests_waiting Number"
    text = VLLM.replace(real, sidecar + real.replace("waiting", "waitin"))
    expo = parse(text).finish()
    assert expo.malformed_families == ["vllm:num_requests_waiting"]
    assert "vllm:num_requests_waiting" not in expo.gauges
    (r,) = NORMALIZERS["vllm"](expo)
    assert r.waiting is None  # its family went ...
    assert (r.running, r.kv_hits) == (24.0, 1_212_416.0)  # ... the others stayed
    assert r.ttft is not None and r.ttft.count == 1812.0


@pytest.mark.parametrize(
    "bad",
    [
        'vllm:kv_cache_usage_perc{engine="0",model_name="x" 0.5',  # unclosed label set
        'vllm:kv_cache_usage_perc{engine="0",model_name="x"} zero',  # not a number
        'vllm:kv_cache_usage_perc{engine="0",engine="1",model_name="x"} 0.5',  # a label twice
        'vllm:kv_cache_usage_perc{engine="0",model_name="x"} 1_000',  # Python float syntax only
        'vllm:kv_cache_usage_perc{engine="0",model_name="x"}0.5',  # no space before the value
    ],
)
def test_each_malformed_sample_line_drops_its_family(bad: str) -> None:
    marker = 'vllm:kv_cache_usage_perc{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 0.6734'
    assert marker in VLLM
    expo = parse(VLLM.replace(marker, marker + "\n" + bad)).finish()
    assert expo.malformed_families == ["vllm:kv_cache_usage_perc"]
    assert "vllm:kv_cache_usage_perc" not in expo.gauges
    assert "vllm:num_requests_running" in expo.gauges


def test_lines_that_name_no_family_are_skipped_without_cost() -> None:
    text = "<html><body>502 Bad Gateway</body></html>\n" + VLLM + "\x00\x01\x02\n"
    expo = parse(text).finish()
    assert expo.skipped_lines == 2
    assert expo.malformed_families == []
    assert detect_kind(expo) == "vllm"


def test_a_series_given_twice_drops_its_family_as_prometheus_would_refuse_it() -> None:
    line = 'vllm:num_requests_running{engine="0",model_name="meta-llama/Llama-3.1-8B-Instruct"} 24.0'
    expo = parse(VLLM.replace(line, line + "\n" + line)).finish()
    assert "vllm:num_requests_running" not in expo.gauges
    assert expo.malformed_families == ["vllm:num_requests_running"]


def test_a_histogram_whose_cumulative_counts_fall_is_dropped() -> None:
    good = 'vllm:e2e_request_latency_seconds_bucket{engine="0",le="5.0",model_name="' + LLAMA + '"}'
    assert good in VLLM
    line = next(x for x in VLLM.splitlines() if x.startswith(good))
    expo = parse(VLLM.replace(line, good + " 1.0")).finish()
    assert "vllm:e2e_request_latency_seconds" not in expo.histograms
    assert "vllm:time_to_first_token_seconds" in expo.histograms


def test_one_name_with_two_types_is_trusted_neither_way() -> None:
    text = "# TYPE tgi_queue_size gauge\ntgi_queue_size 3\n# TYPE tgi_queue_size counter\ntgi_queue_size 4\n"
    expo = parse("# TYPE tgi_batch_current_size gauge\ntgi_batch_current_size 2\n" + text).finish()
    assert "tgi_queue_size" not in expo.gauges and "tgi_queue_size" not in expo.counters
    assert expo.gauges["tgi_batch_current_size"][0].value == 2.0


def test_sample_cap_stops_parsing_and_drops_the_family_it_cut() -> None:
    parser = parse(VLLM, max_samples=40)
    assert parser.stopped
    expo = parser.finish()
    assert expo.truncated == "too_many_samples"
    assert "vllm:num_requests_running" in expo.gauges  # complete before the cut
    assert "vllm:time_to_first_token_seconds" not in expo.histograms  # never reached
    kept = sum(len(v) for v in expo.gauges.values()) + sum(len(v) for v in expo.counters.values())
    kept += sum(len(c.buckets) + 2 for v in expo.histograms.values() for c in v)
    assert kept <= 40  # the family the cut went through is not served in part


def test_byte_cut_keeps_complete_families_only() -> None:
    cut = VLLM.index("vllm:time_to_first_token_seconds_bucket") + 30  # inside the TTFT histogram
    parser = ExpositionParser(WANTED, None, PREFIXES)
    parser.feed(VLLM[:cut])
    expo = parser.finish(truncated="too_large")
    assert expo.truncated == "too_large"
    assert "vllm:time_to_first_token_seconds" not in expo.histograms  # half a histogram is never served
    assert "vllm:iteration_tokens_total" in expo.histograms  # complete, before it
    assert "vllm:prefix_cache_hits" in expo.counters


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_any_chunking_of_the_bytes_reads_the_same(seed: int) -> None:
    # a model name with multi-byte characters, so chunks split UTF-8 sequences too
    text = VLLM.replace(LLAMA, "modèle-日本語")
    data = text.encode()
    rng = random.Random(seed)
    parser = ExpositionParser(WANTED, None, PREFIXES)
    pos = 0
    while pos < len(data):
        step = rng.randint(1, 300)
        parser.feed_bytes(data[pos : pos + step])
        pos += step
    chunked = parser.finish()
    whole = parse_exposition(text, wanted=WANTED, note_prefixes=PREFIXES)
    assert chunked.gauges == whole.gauges
    assert chunked.counters == whole.counters
    assert chunked.histograms == whole.histograms
    assert {s.labels["model_name"] for s in chunked.gauge("vllm:num_requests_running")} == {"modèle-日本語"}


def test_an_over_long_line_is_skipped_without_being_held() -> None:
    parser = ExpositionParser(WANTED, None, PREFIXES)
    parser.feed("# TYPE vllm:num_requests_running gauge\n")
    parser.feed('vllm:num_requests_running{model_name="' + "x" * 200_000)  # no newline yet
    assert len(parser._carry) == 0  # not accumulated
    parser.feed('"} 1\n' + VLLM)
    expo = parser.finish()
    assert expo.malformed_count >= 1
    assert "vllm:prefix_cache_hits" in expo.counters


def test_families_nothing_maps_are_scanned_but_not_kept() -> None:
    # 80,000 series of a family no normalizer reads, as a hostile or chatty endpoint might serve
    noise = "".join(f'app_requests_total{{path="/p{i}",code="200"}} {i}\n' for i in range(80_000))
    text = VLLM + "# TYPE app_requests_total counter\n" + noise
    parser = ExpositionParser(WANTED, None, PREFIXES)
    tracemalloc.start()
    try:
        for i in range(0, len(text), 65536):
            parser.feed(text[i : i + 65536])
        expo = parser.finish()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert "app_requests_total" not in expo.counters
    assert expo.counter("vllm:prefix_cache_hits_total")[0].value == 1_212_416.0
    assert peak < 4 << 20  # a few chunks and the vLLM families, not 80k samples (about 30 MiB)


def test_asking_for_a_family_no_normalizer_declared_is_a_programming_error() -> None:
    expo = parse(VLLM).finish()
    with pytest.raises(LookupError):
        expo.gauge("vllm:engine_sleep_state")


def test_writers_number_formats_all_parse() -> None:
    text = (
        "# TYPE a gauge\na 1.843208e+06\n"  # prometheus_client, large values
        "# TYPE b gauge\nb 0.00015000000000000001\n"  # metrics-exporter-prometheus (Rust Display)
        "# TYPE c counter\nc 13187664021\n"  # prometheus-cpp %.16g
        "# TYPE d gauge\nd +Inf\n# TYPE e gauge\ne NaN\n# TYPE f gauge\nf -1.5e-3 1700000000000\n"
        "# EOF\n"
    )
    expo = parse_exposition(text)
    values = {name: expo.gauges[name][0].value for name in ("a", "b", "d", "f")}
    assert values == {"a": 1_843_208.0, "b": 0.00015000000000000001, "d": math.inf, "f": -0.0015}
    assert math.isnan(expo.gauges["e"][0].value)
    assert expo.counter("c")[0].value == 13187664021.0


def test_escaped_label_values_are_unescaped() -> None:
    expo = parse_exposition('# TYPE g gauge\ng{model="a\\"b\\\\c\\nd",x="}"} 1\n')
    assert dict(expo.gauges["g"][0].labels) == {"model": 'a"b\\c\nd', "x": "}"}


def test_a_page_of_garbage_is_given_up_early_not_read_to_the_byte_cap() -> None:
    parser = ExpositionParser(WANTED, None, PREFIXES)
    chunks = 0
    while parser.feed("<div>not metrics</div>\n" * 100):
        chunks += 1
        assert chunks < 100
    assert parser.stopped and chunks < 20  # stopped after about a thousand lines
    with pytest.raises(ExpositionError):
        parser.finish()
    # garbage after a real family is only skipped: the page is an exposition
    ok = ExpositionParser(WANTED, None, PREFIXES)
    ok.feed(VLLM + "<div>oops</div>\n" * 2000)
    assert not ok.stopped and "vllm:prefix_cache_hits" in ok.finish().counters


def _scrape(text: str, cache: dict[str, object]) -> ExpositionParser:
    parser = ExpositionParser(WANTED, None, PREFIXES, cache)  # type: ignore[arg-type]
    parser.feed(text)
    return parser


def test_scrapes_sharing_a_cache_read_what_each_page_says() -> None:
    # The per-endpoint cache keeps label blocks, sample heads and TYPE lines between scrapes; each
    # scrape must still read its own values, timestamps, separators and malformed lines.
    cache: dict[str, object] = {}
    first = parse_exposition(VLLM, WANTED, None, PREFIXES)
    assert _scrape(VLLM, cache).finish().gauges == first.gauges
    assert len(cache) > 0
    line = f'vllm:num_requests_waiting{{engine="0",model_name="{LLAMA}"}}'
    waiting = next(row for row in VLLM.splitlines() if row.startswith(line + " "))
    for written, value in (
        (f"{line} 42.0", 42.0),  # a new value
        (f"{line} 43.0 1700000000000", 43.0),  # now with a timestamp
        (f"{line}\t44.0", 44.0),  # a tab
        (f"{line}  45.0", 45.0),  # two spaces
    ):
        expo = _scrape(VLLM.replace(waiting, written), cache).finish()
        assert [s.value for s in expo.gauge("vllm:num_requests_waiting")] == [value], written
    expo = _scrape(VLLM.replace(waiting, f"{line} forty-six"), cache).finish()
    assert expo.malformed_families == ["vllm:num_requests_waiting"]
    # a histogram's bucket whose bound turns into garbage drops that family, as on a first scrape
    bucket = next(row for row in VLLM.splitlines() if "time_to_first_token_seconds_bucket" in row)
    expo = _scrape(VLLM.replace(bucket, bucket.replace('le="', 'le="x', 1)), cache).finish()
    assert "vllm:time_to_first_token_seconds" in expo.malformed_families
    # the same family under another type on a later page is read as that type
    typed = "# TYPE vllm:num_requests_waiting gauge"
    assert typed in VLLM
    expo = _scrape(VLLM.replace(typed, "# TYPE vllm:num_requests_waiting counter"), cache).finish()
    assert "vllm:num_requests_waiting" not in expo.gauges


def test_a_full_cache_changes_nothing_a_scrape_reads() -> None:
    full: dict[str, object] = {f'{{junk="{i}"}}': None for i in range(LABEL_CACHE_MAX)}
    assert _scrape(VLLM, full).finish().gauges == parse_exposition(VLLM, WANTED, None, PREFIXES).gauges
    assert len(full) == LABEL_CACHE_MAX


def test_scrapes_sharing_a_cache_keep_help_caps_and_prometheus_number_rules() -> None:
    # The per-endpoint cache also answers HELP lines and, on a sample line seen before, only the value
    # is read in the parser's inlined hot path: the sample cap, Prometheus's number syntax and HELP
    # text must come out as on a first scrape.
    cache: dict[str, object] = {}
    first = parse_exposition(VLLM, WANTED, None, PREFIXES)
    for _ in range(3):
        again = _scrape(VLLM, cache).finish()
        assert again.help == first.help and again.gauges == first.gauges and again.counters == first.counters
        assert again.histograms == first.histograms
    assert first.help  # the fixture has HELP text the parser keeps
    # a HELP line whose text runs on past a cached HELP line is not taken for a sample head
    help_line = next(row for row in VLLM.splitlines() if row.startswith("# HELP vllm:num_requests_waiting "))
    expo = _scrape(VLLM.replace(help_line, help_line + " 1"), cache).finish()
    assert expo.help["vllm:num_requests_waiting"].endswith(" 1")
    line = f'vllm:num_requests_waiting{{engine="0",model_name="{LLAMA}"}}'
    waiting = next(row for row in VLLM.splitlines() if row.startswith(line + " "))
    expo = _scrape(VLLM.replace(waiting, f"{line} 1_000"), cache).finish()
    assert expo.malformed_families == ["vllm:num_requests_waiting"]  # float() reads it, Prometheus not
    capped = ExpositionParser(WANTED, 10, PREFIXES, cache)  # type: ignore[arg-type]
    assert capped.feed(VLLM) is False
    assert capped.finish().truncated == "too_many_samples"
    assert capped.expo.samples == 11
