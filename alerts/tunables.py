"""Install-time tunables: the rule settings a Helm user may change without regenerating the rules.

The chart carries the rules rendered once with a placeholder token where each tunable goes
(`render_rule_templates`); its PrometheusRule template replaces every token with the value from
`prometheusRule.*` in values.yaml, whose defaults are alerts/config.yaml's. A token is plain text
(`__gpupulse_<section>__<name>__`), safe in PromQL, in YAML plain scalars and in alert templates.

A tunable may only be used as it is (a number in an expression or a description, a window in a range
selector): arithmetic on a placeholder raises, so a rule that derives a number from a tunable is
caught when the chart's templates are rendered, never shipped with a silently stale value.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from typing import Any, NoReturn

from alerts.config import Cost, RulesConfig, Thresholds, Windows

TOKEN = re.compile(r"__gpupulse_([a-z_]+?)__([A-Za-z0-9_]+?)__")

# Thresholds that shape the memory-limit recording rules (the seed's P95 / P99.9, 20% apart) and
# appear in descriptions as derived percentages: changed in alerts/config.yaml, not at install time.
FIXED_THRESHOLDS = frozenset(
    {"memory_soft_limit_quantile", "memory_hard_limit_quantile", "memory_limit_gap_ratio"}
)


def token(section: str, name: str) -> str:
    """The placeholder text of one tunable."""
    return f"__gpupulse_{section}__{name}__"


class Placeholder(float):
    """A number that renders as its token; any arithmetic on it is a bug in the rule that does it."""

    token: str

    def __new__(cls, value: float, token_text: str) -> Placeholder:
        obj = super().__new__(cls, value)
        obj.token = token_text
        return obj

    def _refuse(self) -> NoReturn:
        raise TypeError(
            f"{self.token} is tunable at install time and must be used as it is; "
            "derive numbers in PromQL or the alert template instead, or list it in FIXED_THRESHOLDS"
        )

    def __add__(self, other: object) -> NoReturn:
        self._refuse()

    def __radd__(self, other: object) -> NoReturn:
        self._refuse()

    def __sub__(self, other: object) -> NoReturn:
        self._refuse()

    def __rsub__(self, other: object) -> NoReturn:
        self._refuse()

    def __mul__(self, other: object) -> NoReturn:
        self._refuse()

    def __rmul__(self, other: object) -> NoReturn:
        self._refuse()

    def __truediv__(self, other: object) -> NoReturn:
        self._refuse()

    def __rtruediv__(self, other: object) -> NoReturn:
        self._refuse()

    def __floordiv__(self, other: object) -> NoReturn:
        self._refuse()

    def __neg__(self) -> NoReturn:
        self._refuse()


def tunable_thresholds() -> list[str]:
    """Threshold names a Helm user may set, in alerts/config.yaml's order."""
    return [f.name for f in dataclasses.fields(Thresholds) if f.name not in FIXED_THRESHOLDS]


def template_config(c: RulesConfig) -> RulesConfig:
    """The config with a placeholder in place of every install-time tunable."""
    # int thresholds (gang_size_gpus) get a float placeholder too: they are only ever rendered
    thresholds: dict[str, Any] = {
        name: Placeholder(getattr(c.thresholds, name), token("thresholds", name))
        for name in tunable_thresholds()
    }
    windows = {f.name: token("windows", f.name) for f in dataclasses.fields(Windows)}
    return dataclasses.replace(
        c,
        exporter_selector=token("selectors", "exporter"),
        windows=Windows(**windows),
        thresholds=dataclasses.replace(c.thresholds, **thresholds),
        cost=Cost(
            price_per_gpu_hour=Placeholder(c.cost.price_per_gpu_hour, token("cost", "price_per_gpu_hour")),
            currency=token("cost", "currency"),
        ),
        for_durations={name: token("for", name) for name in c.for_durations},
        runbook_url_base=token("runbook", "url_base"),
    )


def substitute(text: str, values: Mapping[str, Mapping[str, object]]) -> str:
    """Replace every token by its value, as the chart's template does; a token without a value raises."""

    def one(match: re.Match[str]) -> str:
        section, name = match.group(1), match.group(2)
        try:
            value = values[section][name]
        except KeyError:
            raise KeyError(f"no value for {match.group(0)}") from None
        if isinstance(value, int | float) and not isinstance(value, bool):
            return f"{value:g}" if float(value) != int(value) else str(int(value))
        return str(value)

    return TOKEN.sub(one, text)
