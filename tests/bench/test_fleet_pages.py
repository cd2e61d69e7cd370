"""The fleet bench's page rewriting: one captured exporter page becomes many nodes' pages whose series
and join keys never collide, and which Prometheus' own text parser still reads."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from bench.fleet_pages import PageError, SimNode, fleet, for_node, load_pages, sample_lines

PAGE = """\
# HELP gpu_info Static facts.
# TYPE gpu_info gauge
gpu_info{gpu="0",name="NVIDIA H100 80GB HBM3",uuid="GPU-aaaa"} 1.0
gpu_nvlink_peer_info{gpu="0",link="0",peer_uuid="GPU-bbbb",uuid="GPU-aaaa"} 1.0
gpu_allocation_info{container="pytorch",namespace="research",pod="llama-0",uuid="GPU-aaaa"} 1.0
gpu_training_rank_info{pod="llama-0",rank="0",training_job="llama",uuid="GPU-aaaa"} 1.0
gpupulse_build_info{version="1.2.3"} 1.0
gpupulse_last_sample_timestamp_seconds 1.7e+09
"""


def _series(page: str) -> set[tuple[str, tuple[tuple[str, str], ...]]]:
    return {
        (s.name, tuple(sorted(s.labels.items())))
        for family in text_string_to_metric_families(page)
        for s in family.samples
    }


def _labels(page: str, name: str) -> list[dict[str, str]]:
    return [dict(s.labels) for f in text_string_to_metric_families(page) for s in f.samples if s.name == name]


def test_two_nodes_share_no_series_and_no_gpu_or_pod_key() -> None:
    a = for_node(PAGE, SimNode("gpu-00001", "training-a", "job-00000"))
    b = for_node(PAGE, SimNode("gpu-00002", "training-a", "job-00001"))
    per_node = [s for s in _series(a) if dict(s[1]).get("uuid")]
    assert per_node and not set(per_node) & _series(b)
    (info,) = _labels(a, "gpu_info")
    assert info["uuid"] == "GPU-aaaa-gpu-00001" and info["name"] == "NVIDIA H100 80GB HBM3"
    (peer,) = _labels(a, "gpu_nvlink_peer_info")
    assert peer["peer_uuid"] == "GPU-bbbb-gpu-00001"  # the peer is on the same node: same suffix
    (alloc,) = _labels(b, "gpu_allocation_info")
    assert alloc["pod"] == "llama-0-gpu-00002" and alloc["namespace"] == "research"


def test_the_two_nodes_of_a_pair_share_their_job_and_other_pairs_do_not() -> None:
    nodes = fleet(8, serving_share=0.25)
    jobs = [n.job for n in nodes if n.kind != "serving"]
    assert Counter(jobs) == {"job-00000": 2, "job-00001": 2, "job-00002": 2}
    ranks = [_labels(for_node(PAGE, n), "gpu_training_rank_info")[0] for n in nodes if n.job == "job-00001"]
    assert {r["training_job"] for r in ranks} == {"job-00001"}
    assert len({r["uuid"] for r in ranks}) == 2


def test_values_help_and_unlabelled_lines_are_kept() -> None:
    out = for_node(PAGE, SimNode("n", "serving"))
    assert out.count("\n") == PAGE.count("\n")
    assert "# HELP gpu_info Static facts." in out
    assert "gpupulse_last_sample_timestamp_seconds 1.7e+09" in out
    assert 'gpupulse_build_info{version="1.2.3"} 1.0' in out
    assert sample_lines(out) == sample_lines(PAGE) == 6


def test_escaped_quotes_uuid_lists_and_empty_values_keep_their_shape() -> None:
    page = (
        'gpu_allocation_info{pod="a\\"b",uuid="GPU-1,GPU-2"} 1\n'
        'inference_engine_up{pod="",uuid="",model="m, \\"x\\""} 1\n'
    )
    out = for_node(page, SimNode("n7", "serving"))
    first, second = (dict(s.labels) for f in text_string_to_metric_families(out) for s in f.samples)
    assert first == {"pod": 'a"b-n7', "uuid": "GPU-1-n7,GPU-2-n7"}
    assert second == {"pod": "", "uuid": "", "model": 'm, "x"'}


@pytest.mark.parametrize(
    ("page", "why"),
    [("", "empty page"), ("  \n", "empty page"), ('gpu_up}uuid="x"{ 1\n', "line 1: unclosed label set")],
)
def test_a_malformed_page_is_a_clear_error(page: str, why: str) -> None:
    with pytest.raises(PageError, match=why):
        for_node(page, SimNode("n", "serving"))


def test_a_fleet_needs_a_node() -> None:
    with pytest.raises(PageError, match="at least 1"):
        fleet(0)


def test_the_committed_pages_make_a_fleet_without_duplicate_series() -> None:
    pages = load_pages()
    assert "gpu_training_rank_info{" in pages["training-a"] and "inference_" in pages["serving"]
    nodes = fleet(12)
    seen: set[tuple[str, tuple[tuple[str, str], ...]]] = set()
    total = 0
    for node in nodes:
        series = _series(for_node(pages[node.kind], node))
        # a series repeats across nodes only if it has no per-node label (build info, collector health):
        # Prometheus adds the target's node label to those
        shared = {s for s in series & seen if not {"uuid", "pod"} & {k for k, v in s[1] if v}}
        assert series & seen == shared
        seen |= series
        total += len(series)
    assert total == sum(sample_lines(pages[n.kind]) for n in nodes)


def test_a_missing_capture_names_the_command_that_makes_it(tmp_path: Path) -> None:
    with pytest.raises(PageError, match=r"python -m bench\.fleet_pages"):
        load_pages(tmp_path)
