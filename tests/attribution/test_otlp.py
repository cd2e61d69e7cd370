"""OTLP push: gauges, counters, info and histograms arrive at a real OTLP/HTTP receiver."""

from __future__ import annotations

import argparse
import uuid
from collections.abc import AsyncIterator

import pytest
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    InfoMetricFamily,
    Metric,
    SummaryMetricFamily,
)

from exporter.errors import OtlpConfigError
from exporter.otlp import push as otlp_push
from exporter.otlp.push import OtlpPusher, OtlpSettings, parse_headers
from tests.fakes.otlp import FakeOtlpReceiver


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def monotonic(self) -> float:
        return self.now


@pytest.fixture
async def receiver() -> AsyncIterator[FakeOtlpReceiver]:
    fake = FakeOtlpReceiver()
    await fake.start()
    yield fake
    await fake.stop()


def snapshot() -> list[Metric]:
    util = GaugeMetricFamily("gpu_utilization_ratio", "kernel running share", labels=["uuid", "gpu"])
    util.add_metric(["GPU-a", "0"], 0.15)
    util.add_metric(["GPU-b", "1"], 0.9)
    cpu = CounterMetricFamily("gpu_process_host_cpu_seconds_total", "host cpu", labels=["pid", "pod"])
    cpu.add_metric(["4001", "llama-0"], 123.5, created=1_700_000_000.0)
    info = InfoMetricFamily("gpu_allocation", "allocation", labels=["uuid", "pod"])
    info.add_metric(["GPU-a", "llama-0"], {})
    hist = HistogramMetricFamily("inference_batch_latency_seconds", "batch latency", labels=["model"])
    hist.add_metric(["llama"], buckets=[("0.1", 3.0), ("0.5", 8.0), ("+Inf", 10.0)], sum_value=2.5)
    summary = SummaryMetricFamily(
        "some_summary_seconds", "no OTLP point type here", count_value=1, sum_value=1.0
    )
    return [util, cpu, info, hist, summary]


async def test_every_family_type_arrives_with_names_attributes_and_values(receiver: FakeOtlpReceiver) -> None:
    pusher = OtlpPusher(
        OtlpSettings(endpoint=receiver.url, interval_seconds=0, headers=(("x-tenant", "gpu"),))
    )
    try:
        await pusher.push(snapshot())
        await receiver.wait_for_requests(1)
    finally:
        await pusher.close()

    metrics = receiver.metrics()
    assert set(metrics) == {
        "gpu_utilization_ratio",
        "gpu_process_host_cpu_seconds",
        "gpu_allocation_info",
        "inference_batch_latency_seconds",
    }
    assert receiver.headers[0]["x-tenant"] == "gpu"
    resource = receiver.requests[0].resource_metrics[0].resource
    assert {a.key: a.value.string_value for a in resource.attributes}["service.name"] == "gpupulse-exporter"

    util = metrics["gpu_utilization_ratio"]
    assert util.WhichOneof("data") == "gauge"
    assert util.unit == "1"  # from the catalog spec, in UCUM
    assert metrics["gpu_process_host_cpu_seconds"].unit == "s"
    points = {
        tuple(sorted((a.key, a.value.string_value) for a in p.attributes)): p.as_double
        for p in util.gauge.data_points
    }
    assert points == {(("gpu", "0"), ("uuid", "GPU-a")): 0.15, (("gpu", "1"), ("uuid", "GPU-b")): 0.9}

    cpu = metrics["gpu_process_host_cpu_seconds"]
    assert cpu.WhichOneof("data") == "sum"
    assert cpu.sum.is_monotonic
    assert cpu.sum.aggregation_temporality == 2  # CUMULATIVE
    (point,) = cpu.sum.data_points
    assert point.as_double == 123.5
    assert point.start_time_unix_nano == 1_700_000_000 * 10**9  # from the _created sample
    assert {a.key: a.value.string_value for a in point.attributes} == {"pid": "4001", "pod": "llama-0"}

    info = metrics["gpu_allocation_info"]
    assert [p.as_double for p in info.gauge.data_points] == [1.0]

    hist = metrics["inference_batch_latency_seconds"]
    assert hist.WhichOneof("data") == "histogram"
    (hp,) = hist.histogram.data_points
    assert list(hp.explicit_bounds) == [0.1, 0.5]
    assert list(hp.bucket_counts) == [3, 5, 2]  # per bucket, not cumulative
    assert hp.count == 10 and hp.sum == 2.5
    assert not hp.HasField("min") and not hp.HasField("max")


async def test_push_respects_the_interval(receiver: FakeOtlpReceiver) -> None:
    clock = FakeClock()
    pusher = OtlpPusher(OtlpSettings(endpoint=receiver.url + "/v1/metrics", interval_seconds=30), clock=clock)
    try:
        await pusher.push(snapshot())
        clock.now += 10
        await pusher.push(snapshot())  # too soon: dropped
        clock.now += 25
        await pusher.push(snapshot())
        await receiver.wait_for_requests(2)
    finally:
        await pusher.close()
    assert len(receiver.requests) == 2
    assert pusher.stats.pushes == 2 and pusher.stats.failures == 0


async def test_receiver_errors_are_counted_not_raised(receiver: FakeOtlpReceiver) -> None:
    receiver.fail_status = 400  # permanent: the SDK does not retry it
    pusher = OtlpPusher(OtlpSettings(endpoint=receiver.url, interval_seconds=0, timeout_seconds=2))
    try:
        await pusher.push(snapshot())
    finally:
        await pusher.close()
    assert pusher.stats.failures == 1


def test_flags_build_a_pusher_only_with_an_endpoint() -> None:
    parser = argparse.ArgumentParser()
    otlp_push.add_arguments(parser)
    assert otlp_push.from_args(parser.parse_args([])) is None
    args = parser.parse_args(["--otlp.endpoint", "http://collector:4318", "--otlp.headers", "a=1, b = 2"])
    pusher = otlp_push.from_args(args)
    assert pusher is not None
    assert pusher.settings.metrics_url == "http://collector:4318/v1/metrics"
    assert pusher.settings.headers == (("a", "1"), ("b", "2"))
    with pytest.raises(OtlpConfigError):
        parse_headers("novalue")


def _resource(receiver: FakeOtlpReceiver, index: int = -1) -> dict[str, str]:
    resource = receiver.requests[index].resource_metrics[0].resource
    return {a.key: a.value.string_value for a in resource.attributes}


async def test_resource_names_the_node_and_an_instance_that_survives_restarts(
    receiver: FakeOtlpReceiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OTEL_RESOURCE_ATTRIBUTES", "k8s.cluster.name=east,host.name=ignored")
    seen = []
    for node, pod in (
        ("gpu-node-1", "pulse-exporter-abcde"),
        ("gpu-node-1", "pulse-exporter-fghij"),
        ("gpu-node-2", "x"),
    ):
        settings = OtlpSettings(
            endpoint=receiver.url, interval_seconds=0, node_name=node, pod_name=pod, pod_namespace="gpupulse"
        )
        pusher = OtlpPusher(settings)
        try:
            await pusher.push(snapshot())
        finally:
            await pusher.close()
        seen.append(_resource(receiver))
    first, restarted, other = seen
    assert first["k8s.node.name"] == first["host.name"] == "gpu-node-1"  # ours win over the environment
    assert first["k8s.pod.name"] == "pulse-exporter-abcde" and first["k8s.namespace.name"] == "gpupulse"
    assert first["k8s.cluster.name"] == "east"  # OTEL_RESOURCE_ATTRIBUTES adds to ours
    assert first["service.name"] == "gpupulse-exporter" and first["service.version"]
    # a new pod on the same node is the same instance; another node is another
    assert first["service.instance.id"] == restarted["service.instance.id"] != other["service.instance.id"]
    assert uuid.UUID(first["service.instance.id"]).version == 5


def test_off_kubernetes_the_host_name_names_the_instance() -> None:
    settings = OtlpSettings(endpoint="http://c:4318")
    attributes = otlp_push.resource_attributes(settings, hostname="bare-metal-7")
    assert attributes["host.name"] == "bare-metal-7" and "k8s.node.name" not in attributes


def test_node_name_flag_defaults_to_the_downward_api_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("NODE_NAME", "gpu-node-3")
    monkeypatch.setenv("POD_NAME", "pulse-exporter-q")
    parser = argparse.ArgumentParser()
    otlp_push.add_arguments(parser)
    pusher = otlp_push.from_args(parser.parse_args(["--otlp.endpoint", "http://collector:4318"]))
    assert pusher is not None
    assert (pusher.settings.node_name, pusher.settings.pod_name) == ("gpu-node-3", "pulse-exporter-q")
