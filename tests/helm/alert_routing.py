"""What the kube-prometheus-stack end-to-end tests (our reproduction, tests/helm, and the real
prometheus-operator, tests/kube) check alike: node, GPU and pod alerts reach the controller's webhook,
each through the AlertmanagerConfig of its namespace, and none through two."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from remediation.model import AlertEvent
from tests.fakes.intake import Harness


def _matches(event: AlertEvent, name: str, node: str) -> bool:
    return event.labels.get("alertname") == name and event.labels.get("node") == node


async def routed_to_the_controller(
    harness: Harness,
    prom: Any,
    am: Any,
    want: Mapping[str, tuple[str, str]],
    amc_name: str,
    within_seconds: float,
) -> dict[str, list[AlertEvent]]:
    """Wait until every alert of `want` ({alertname: (node, namespace)}) reached the webhook; check
    each came through `<namespace>/<amc_name>/gpupulse-remediation` and that no alert came through
    two receivers. Returns the events of each alert name."""
    received = harness.engine.handled

    def arrived() -> bool:
        return all(any(_matches(e, name, node) for e in received) for name, (node, _) in want.items())

    try:
        await harness.engine.wait_for(arrived, within_seconds)
    except TimeoutError:
        firing = await prom.query("ALERTS")
        raise AssertionError(
            f"received {sorted({e.labels['alertname'] for e in received})}; Prometheus has "
            f"{sorted({(a['metric']['alertname'], a['metric']['alertstate']) for a in firing})}; "
            f"Alertmanager has {[a['labels']['alertname'] for a in await am.alerts()]}"
        ) from None
    out: dict[str, list[AlertEvent]] = {}
    for name, (node, namespace) in want.items():
        events = [e for e in received if _matches(e, name, node)]
        assert {e.receiver for e in events} == {f"{namespace}/{amc_name}/gpupulse-remediation"}, name
        assert events[0].labels["namespace"] == namespace
        out[name] = events
    for event in received:
        same = {e.receiver for e in received if e.fingerprint == event.fingerprint}
        assert len(same) == 1, (event.labels["alertname"], same)
    return out
