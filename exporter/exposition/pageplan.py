"""A clean engine page's structure, kept per endpoint, so that the next page with the same structure
is read by comparing its lines and converting its values instead of parsing it.

Engines write the same page every scrape: the same families, label sets and comments, new values.
After a page parsed without any problem, its lines without their values (a comment line whole) and
where each kept sample's value sits are kept (`PagePlan`). The next page is compared with the plan
chunk by chunk as it streams in (`PlanMatcher`): while every line up to its last space is the same,
only the values of kept samples are read, by the parser's own number rules. What the structure
decided (which families, their samples' labels, each histogram child's buckets in order) is kept
with the plan, made by the parser's own code; what depends on values (cumulative buckets, NaN
counts) is judged on every page by it too. The first line that differs, a value those rules do not
read, a cut or a cap sends the whole page so far through the full parser.

A plan is made from a clean page (`make_plan`) by parsing it once more with every value replaced by
its own line number, so that each kept row says which line it came from, and it is kept only if
reading the real page through it gives exactly what the full parse gave.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol, cast

PLAN_MAX_LINES = 4096  # a bigger page is parsed every time (a plan holds its lines' text)
_PLAN_BACKOFF_MAX = 64  # scrapes without trying to make a plan, at most, for a page that keeps changing


class PlanSlot:
    """An endpoint's page plan and how it fares; a page that keeps changing is not planned every time."""

    def __init__(self) -> None:
        self.plan: PagePlan | None = None
        self.reads = 0  # pages read through the plan
        self.skip = 0  # scrapes left before the next attempt at a plan
        self.backoff = 0

    def read(self, plan: PagePlan) -> None:
        """A page was read through the plan."""
        self.reads += 1
        self.backoff = 0

    def left(self) -> bool:
        """A page left the plan; True when a new plan should be made from it."""
        churning = self.reads == 0  # the plan never read a page: the structure changes every scrape
        self.plan, self.reads = None, 0
        if churning:
            self._back_off()
        return not churning

    def made(self, plan: PagePlan | None) -> None:
        """A page was parsed in full and this plan made of it (None: it has none)."""
        self.plan, self.reads = plan, 0
        if plan is None:
            self._back_off()

    def _back_off(self) -> None:
        self.backoff = min(_PLAN_BACKOFF_MAX, max(4, 2 * self.backoff))
        self.skip = self.backoff


# (wire name, storage key, type, member sample names, rows as (suffix, raw labels, labels, value index))
PlanFamily = tuple[str, str, str, dict[str, str], list[tuple[str, str, Any, int]]]
# what one family gives a page: (type, storage key, HELP text or None, samples' (labels, value index)
# or a histogram's children), in the order the parser's _build gives them
PlanOutput = tuple[str, str, str | None, Any]


@dataclass(frozen=True)
class PagePlan:
    """What a clean page was made of, for reading the next page with the same structure."""

    settings: tuple[object, ...]  # (wanted, max_samples, note_prefixes) of the parse it came from
    keys: list[str]  # per line: a comment or blank line whole, a sample line up to and with its last space
    cuts: list[slice]  # per line: what follows its key (a sample's value; nothing on other lines)
    whole: Callable[[list[str]], tuple[str, ...]]  # what follows the key of comment and blank lines
    samples: Callable[[list[str]], tuple[str, ...]]  # ... of every sample line
    values: Callable[[list[str]], tuple[str, ...]]  # ... of the kept samples, in line order
    outputs: list[PlanOutput]
    families_seen: int
    ray_prefixed: bool
    prefixes_seen: frozenset[str]
    samples_kept: int


def _picker(indexes: list[int]) -> Callable[[list[str]], tuple[str, ...]]:
    """The items at these indexes, as a tuple (itemgetter, but for any number of them)."""
    if not indexes:
        return lambda items: ()
    if len(indexes) == 1:
        one = indexes[0]
        return lambda items: (items[one],)
    return cast("Callable[[list[str]], tuple[str, ...]]", operator.itemgetter(*indexes))


class PlanMatcher:
    """One page compared with a plan as it streams in; `values` is set once the whole page matched."""

    def __init__(self, plan: PagePlan, max_line_chars: int) -> None:
        self.plan = plan
        self.values: list[float] = []
        self._max_line_chars = max_line_chars
        self._parts: list[str] = []
        self._rests: list[str] = []  # what follows each line's plan key
        self._carry = ""
        self._pos = 0

    def feed(self, text: str) -> bool:
        """Take the next text; False once the page leaves the plan (the caller parses `text()`)."""
        self._parts.append(text)
        lines = text.split("\n")
        lines[0] = self._carry + lines[0]
        self._carry = lines.pop()
        if len(self._carry) > self._max_line_chars:
            return False  # the parser judges over-long lines where each chunk ends
        plan, pos = self.plan, self._pos
        end = pos + len(lines)
        # Each line starts with its plan key (a line by line test in C); what follows is checked whole
        # at the end: a comment or blank line has nothing more, a sample line no other space.
        if end > len(plan.keys) or not all(map(str.startswith, lines, plan.keys[pos:end])):
            return False
        self._rests += map(str.__getitem__, lines, plan.cuts[pos:end])
        self._pos = end
        return True

    def complete(self, tail: str) -> bool:
        """Every line of the plan was met with the same structure, nothing follows the last newline,
        and the kept values read by the parser's fast rule; then `values` holds them."""
        plan, rests = self.plan, self._rests
        if self._pos != len(plan.keys) or self._carry or tail:
            return False
        if "".join(plan.whole(rests)) or " " in "".join(plan.samples(rests)):
            return False  # a line whose last space is elsewhere: another structure
        tokens = plan.values(rests)
        # the parser's fast rule: what float() reads, but not Python's 1_000
        if "_" in "".join(tokens):
            return False
        try:
            self.values = list(map(float, tokens))
        except ValueError:
            return False
        return True

    def text(self) -> str:
        """Everything fed so far."""
        return "".join(self._parts)


class Parser(Protocol):
    """The parser's side of plans (exposition.ExpositionParser; this module does not import it)."""

    def feed(self, text: str) -> bool: ...

    def plan_rows(self) -> tuple[list[PlanFamily], list[int]] | None: ...

    def help_texts(self) -> dict[str, str]: ...

    @property
    def families_seen(self) -> int: ...

    def read_by_plan(self, plan: PagePlan, values: list[float]) -> Any: ...


def make_plan(
    text: str,
    expo: Any,
    new_parser: Callable[[], Parser],
    settings: tuple[object, ...],
    outputs_of: Callable[[list[PlanFamily], dict[str, str]], list[PlanOutput] | None],
    is_name: Callable[[str], bool],
) -> PagePlan | None:
    """The plan of a page the full parser read cleanly into `expo` (an Exposition); None when it has
    none. `outputs_of` is the parser's plan_outputs, `is_name` its test of a metric name."""

    lines = text.split("\n")
    if lines.pop() != "" or len(lines) > PLAN_MAX_LINES:
        return None  # a page without its last newline, or too big to keep
    keys: list[str] = []
    marked: list[str] = []
    for i, line in enumerate(lines):
        if line[:1] == "#" or not line:  # a comment, or a blank line between families
            keys.append(line)
            marked.append(line)
            continue
        cut = line.rfind(" ") + 1
        if cut == 0 or line[:cut].isspace():
            return None  # a line without a value, or a blank one
        keys.append(line[:cut])
        marked.append(f"{line[:cut]}{i}")  # its own line number for its value
    recording = new_parser()
    if not recording.feed("\n".join(marked) + "\n"):
        return None
    found = recording.plan_rows()
    if found is None:
        return None
    families, used = found
    lines_used = sorted(used)
    if len(set(lines_used)) != len(lines_used) or any(not 0 <= i < len(lines) for i in lines_used):
        return None
    for _, _, _, members, rows in families:
        for suffix, raw, _, i in rows:
            # each row from its own line, `name{labels} value` (a value may also sit in a line's text
            # before a timestamp: such a line is no plan's)
            name = keys[i][: len(keys[i]) - len(raw) - 1]
            if not keys[i].endswith(raw + " ") or members.get(name) != suffix or not is_name(name):
                return None
    index = {line_no: n for n, line_no in enumerate(lines_used)}
    planned = [
        (wire, key, kind, members, [(s, raw, ls, index[i]) for s, raw, ls, i in rows])
        for wire, key, kind, members, rows in families
    ]
    outputs = outputs_of(planned, recording.help_texts())
    if outputs is None:
        return None
    plan = PagePlan(
        settings=settings,
        keys=keys,
        cuts=[slice(len(key), None) for key in keys],
        whole=_picker([i for i, line in enumerate(lines) if line[:1] == "#" or not line]),
        samples=_picker([i for i, line in enumerate(lines) if line[:1] != "#" and line]),
        values=_picker(lines_used),
        outputs=outputs,
        families_seen=recording.families_seen,
        ray_prefixed=expo.ray_prefixed,
        prefixes_seen=frozenset(expo.prefixes_seen),
        samples_kept=expo.samples,
    )
    # the proof: the real page read through the plan gives exactly what the full parse gave
    check = new_parser()
    matcher = PlanMatcher(plan, 1 << 62)
    if not matcher.feed(text) or not matcher.complete(""):
        return None
    return plan if same(check.read_by_plan(plan, matcher.values), expo) else None


def same(a: Any, b: Any) -> bool:
    """Two readings of a page (Expositions) are the same, NaN values included (as their text is)."""
    return (
        repr((a.gauges, a.counters, a.histograms, a.help))
        == repr((b.gauges, b.counters, b.histograms, b.help))
        and (a.ray_prefixed, a.wanted, a.noted, a.prefixes_seen, a.malformed_families, a.malformed_count)
        == (
            b.ray_prefixed,
            b.wanted,
            b.noted,
            b.prefixes_seen,
            b.malformed_families,
            b.malformed_count,
        )
        and (a.skipped_lines, a.samples, a.truncated) == (b.skipped_lines, b.samples, b.truncated)
    )
