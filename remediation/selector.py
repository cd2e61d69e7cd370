"""Kubernetes label selectors (`nodepool=inference,!cordon-exempt,zone in (a,b)`) parsed and matched
with the API server's semantics, for scoping node and GPU targets by their Node's labels."""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping
from dataclasses import dataclass

from remediation.errors import SelectorError

# a qualified name (optional DNS prefix and '/'), as label keys are; values are the same minus '/'
_KEY = r"(?:[A-Za-z0-9][-A-Za-z0-9_.]*/)?[A-Za-z0-9](?:[-A-Za-z0-9_.]*[A-Za-z0-9])?"
_VALUE = r"(?:[A-Za-z0-9](?:[-A-Za-z0-9_.]*[A-Za-z0-9])?)?"
_EXISTS = re.compile(rf"^(?P<neg>!?)\s*(?P<key>{_KEY})$")
_EQUALITY = re.compile(rf"^(?P<key>{_KEY})\s*(?P<op>==|=|!=)\s*(?P<value>{_VALUE})$")
_SET = re.compile(rf"^(?P<key>{_KEY})\s+(?P<op>in|notin)\s*\((?P<values>[^()]*)\)$")


@dataclass(frozen=True)
class Requirement:
    """One comma-separated term: key, operator and values."""

    key: str
    op: str  # exists, !exists, =, !=, in, notin
    values: frozenset[str] = frozenset()

    def matches(self, labels: Mapping[str, str]) -> bool:
        """Kubernetes semantics: != and notin also match nodes that lack the label."""
        present = self.key in labels
        if self.op == "exists":
            return present
        if self.op == "!exists":
            return not present
        if self.op in ("=", "in"):
            return present and labels[self.key] in self.values
        return not present or labels[self.key] not in self.values


@dataclass(frozen=True)
class Selector:
    """All requirements must hold; the empty selector matches everything."""

    text: str
    requirements: tuple[Requirement, ...]

    def matches(self, labels: Mapping[str, str]) -> bool:
        """True when the labels meet every requirement."""
        return all(r.matches(labels) for r in self.requirements)


def _terms(text: str) -> list[str]:
    terms, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
            if depth < 0:
                raise SelectorError(f"unbalanced ')' at {i} in {text!r}")
        elif ch == "," and depth == 0:
            terms.append(text[start:i])
            start = i + 1
    if depth:
        raise SelectorError(f"unbalanced '(' in {text!r}")
    terms.append(text[start:])
    return [t.strip() for t in terms]


@functools.lru_cache(maxsize=32)
def parse_selector(text: str) -> Selector:
    """Parse equality-based and set-based requirements; raise SelectorError naming the bad term."""
    if not text.strip():
        return Selector(text, ())
    out: list[Requirement] = []
    for term in _terms(text):
        if m := _SET.match(term):
            values = [v.strip() for v in m.group("values").split(",")]
            if not values or any(not re.fullmatch(_VALUE, v) for v in values) or values == [""]:
                raise SelectorError(f"bad value list in {term!r}")
            out.append(Requirement(m.group("key"), m.group("op"), frozenset(values)))
        elif m := _EQUALITY.match(term):
            op = "=" if m.group("op") in ("=", "==") else "!="
            out.append(Requirement(m.group("key"), op, frozenset({m.group("value")})))
        elif m := _EXISTS.match(term):
            out.append(Requirement(m.group("key"), "!exists" if m.group("neg") else "exists"))
        else:
            raise SelectorError(f"not a label selector requirement: {term!r}")
    return Selector(text, tuple(out))
