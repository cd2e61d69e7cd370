"""Where each rule runs under sharded scrapes: on the shard that scrapes its node, or in the global layer.

A Prometheus shard (hashmod over the node label) holds every series of the nodes it scrapes and none
of the others. A rule is right there only if each of its results reads the series of one node: every
aggregation keeps a label that names one node's series (node, uuid, pod, instance), every join
matches on one, and every recorded series it reads is itself recorded on the shards. Anything else
(`sum by (namespace)`, a gang's ranks counted `by (training_job)`, a workload's limit learned over
its pods on many nodes, `absent()`) sees only part of the fleet on a shard and belongs to the global
layer. Groups declare their scope (alerts/rules/model.py); this module derives each rule's and fails
the build where a declaration and the PromQL disagree.

The analysis reads the text, not a parse tree: it takes a pinning label in a `by` list to be on the
series aggregated (our rules group by labels their series carry), and counts every raw series as one
node's, which holds where the shards split targets by node (docs/scale.md).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass

from alerts.config import ConfigError
from alerts.rules.model import Alert, Group, Record, RuleFile, Scope
from alerts.rules.promql import _AGGREGATORS, metric_names

# Labels whose value pins a series to one node: a result grouped by one of them reads one node.
NODE_LOCAL_LABELS = frozenset({"node", "uuid", "pod", "instance"})
# Functions that answer a question about every series the evaluating Prometheus holds.
_WHOLE_SET_FUNCTIONS = frozenset({"absent", "absent_over_time", "scalar"})

_IDENT = re.compile(r"[A-Za-z_:][A-Za-z0-9_:]*")
_NUMBER = re.compile(r"[0-9.][0-9A-Za-z_.]*")


class PlacementError(ConfigError):
    """A group's declared scope disagrees with what its rules' PromQL needs."""


@dataclass(frozen=True)
class _Token:
    kind: str  # "ident", "(" or ")"
    text: str


def _skip(expr: str, i: int, close: str) -> int:
    """Index past the bracket (or quote) opened at i."""
    opener = expr[i]
    if opener in "\"'`":
        j = i + 1
        while j < len(expr) and expr[j] != opener:
            j += 2 if expr[j] == "\\" and opener != "`" else 1
        return j + 1
    depth, j = 0, i
    while j < len(expr):
        ch = expr[j]
        if ch in "\"'`":
            j = _skip(expr, j, ch)
            continue
        if ch == opener:
            depth += 1
        elif ch == close:
            depth -= 1
            if depth == 0:
                return j + 1
        j += 1
    raise PlacementError(f"unbalanced {opener!r} in {expr!r}")


def _tokens(expr: str) -> Iterator[_Token]:
    """Identifiers and parentheses of a PromQL expression; matchers, ranges, strings and comments skipped."""
    i = 0
    while i < len(expr):
        ch = expr[i]
        if ch in "\"'`":
            i = _skip(expr, i, ch)
        elif ch == "{":
            i = _skip(expr, i, "}")
        elif ch == "[":
            i = _skip(expr, i, "]")
        elif ch == "#":
            end = expr.find("\n", i)
            i = len(expr) if end < 0 else end
        elif ch in "()":
            yield _Token(ch, ch)
            i += 1
        elif ch.isdigit() or ch == ".":
            m = _NUMBER.match(expr, i)
            i = m.end() if m else i + 1
        elif m := _IDENT.match(expr, i):
            yield _Token("ident", m.group(0))
            i = m.end()
        else:
            i += 1


def _label_list(tokens: list[_Token], k: int) -> tuple[frozenset[str], int] | None:
    """The `(a, b)` label list starting at tokens[k], and the index past it."""
    if k >= len(tokens) or tokens[k].kind != "(":
        return None
    names, j = [], k + 1
    while j < len(tokens) and tokens[j].kind != ")":
        names.append(tokens[j].text)
        j += 1
    return frozenset(names), j + 1


def _matching_close(tokens: list[_Token], k: int) -> int:
    depth = 0
    for j in range(k, len(tokens)):
        if tokens[j].kind == "(":
            depth += 1
        elif tokens[j].kind == ")":
            depth -= 1
            if depth == 0:
                return j
    raise PlacementError("unbalanced parentheses")


def _keeps_one_node(modifier: str, labels: frozenset[str]) -> bool:
    if modifier in ("by", "on"):
        return bool(labels & NODE_LOCAL_LABELS)
    return "node" not in labels  # without / ignoring: the rest, node among it, is kept


def fleet_reasons(expr: str, recorded: Mapping[str, Scope]) -> list[str]:
    """Why `expr` needs series of many nodes (empty: it is right on the shard that scrapes the node).

    `recorded` maps each recording rule's name to where it is recorded.
    """
    reasons: list[str] = []
    tokens = list(_tokens(expr))
    depth = 0
    for tok in tokens:
        depth += {"(": 1, ")": -1}.get(tok.kind, 0)
        if depth < 0:
            break
    if depth:
        raise PlacementError(f"unbalanced parentheses in {expr!r}")
    for k, tok in enumerate(tokens):
        if tok.kind != "ident":
            continue
        word = tok.text
        nxt = tokens[k + 1] if k + 1 < len(tokens) else None
        if word in _AGGREGATORS and nxt is not None and (nxt.kind == "(" or nxt.text in ("by", "without")):
            if nxt.kind == "(":
                close = _matching_close(tokens, k + 1)
                after = tokens[close + 1] if close + 1 < len(tokens) else None
                modifier = after.text if after is not None and after.text in ("by", "without") else ""
                grouping = _label_list(tokens, close + 2) if modifier else None
            else:
                modifier = nxt.text
                grouping = _label_list(tokens, k + 2)
            labels = grouping[0] if grouping else frozenset()
            if not modifier or not _keeps_one_node(modifier, labels):
                shown = f"{word} {modifier} ({', '.join(sorted(labels))})" if modifier else word
                reasons.append(f"`{shown}` aggregates over several nodes")
        elif word in ("on", "ignoring") and nxt is not None and nxt.kind == "(":
            listed = _label_list(tokens, k + 1)
            labels = listed[0] if listed else frozenset()
            if not _keeps_one_node(word, labels):
                reasons.append(f"`{word}({', '.join(sorted(labels))})` matches series of several nodes")
        elif word in _WHOLE_SET_FUNCTIONS and nxt is not None and nxt.kind == "(":
            reasons.append(f"`{word}()` asks about every series the evaluating Prometheus holds")
    for name in sorted(metric_names(expr)):
        if recorded.get(name) == "fleet":
            reasons.append(f"reads {name}, recorded in the global layer")
    return reasons


def _rule_name(rule: Record | Alert) -> str:
    return rule.record if isinstance(rule, Record) else rule.alert


def placements(files: Iterable[RuleFile]) -> dict[str, tuple[Scope, ...]]:
    """Group name -> where each of its rules runs, in order; raises PlacementError on a wrong declaration.

    A node group's rules must all be node rules; a fleet group must need the fleet for at least one
    rule (else it is a node group and says so). Records are resolved to a fixed point, since a rule may
    read a record of a group that comes after it.
    """
    groups = [g for f in files for g in f.groups]
    recorded: dict[str, Scope] = {}
    for _ in range(len(groups) * 8 + 1):
        out = {g.name: tuple(_rule_scope(g, r, recorded) for r in g.rules) for g in groups}
        now = {
            r.record: scope
            for g in groups
            for r, scope in zip(g.rules, out[g.name], strict=True)
            if isinstance(r, Record)
        }
        if now == recorded:
            break
        recorded = now
    for g in groups:
        _check(g, out[g.name], recorded)
    return out


def _rule_scope(group: Group, rule: Record | Alert, recorded: Mapping[str, Scope]) -> Scope:
    if _rule_name(rule) in group.per_prometheus:
        return "node"
    return "fleet" if fleet_reasons(rule.expr, recorded) else "node"


def _check(group: Group, scopes: tuple[Scope, ...], recorded: Mapping[str, Scope]) -> None:
    names = {_rule_name(r) for r in group.rules}
    unknown = set(group.per_prometheus) - names
    if unknown:
        raise PlacementError(f"{group.name}: per_prometheus names rules it does not hold: {sorted(unknown)}")
    for name in group.per_prometheus:
        rule = next(r for r in group.rules if _rule_name(r) == name)
        if not fleet_reasons(rule.expr, recorded):
            raise PlacementError(f"{group.name}: {name} keeps one node's series; drop it from per_prometheus")
    if group.scope == "node":
        wrong = [
            f"{_rule_name(r)}: {'; '.join(fleet_reasons(r.expr, recorded))}"
            for r, s in zip(group.rules, scopes, strict=True)
            if s == "fleet"
        ]
        if wrong:
            raise PlacementError(
                f"{group.name} is declared scope='node' (evaluated on each shard) but needs the fleet: "
                + " | ".join(wrong)
            )
    elif "fleet" not in scopes:
        raise PlacementError(
            f"{group.name} is declared scope='fleet' but every rule keeps one node's series: declare 'node'"
        )
