"""Engine pages parsed line by line as they stream in: bounded, tolerant, and only what we map.

About 850 lines because it is one streaming state machine (families, histogram grouping, caps) whose
traps, listed below, are handled where the line is read, plus the parser's side of page plans
(pageplan.py): a page with the last clean page's structure is read by comparing lines, and its
families are made from what that structure decided (`read_by_plan`, `plan_outputs`).

Why not prometheus_client's parser: it refuses the whole page for one bad line (a sidecar sharing
the endpoint takes every engine family down), holds the whole text, and builds objects for every
sample of every family. Here:

- A malformed sample line costs only its family; a line that names no family is skipped. Both are
  counted (`Exposition.malformed_families`, `skipped_lines`).
- Only wanted families (those some normalizer reads) are kept; the rest are scanned and dropped,
  so a page full of unrelated series costs little memory.
- `max_samples` stops parsing (`truncated = "too_many_samples"`); the caller stops reading past a
  byte cap (`finish(truncated="too_large")`). The family cut in the middle is dropped, the complete
  ones before it are kept.

Traps handled here (docs/design/engines.md, "Parser traps"):
- Counters are indexed by base name (no `_total`): prometheus_client writes `x_total` on the TYPE
  line, TGI and Triton write `x` with samples `x`.
- `x_created` samples of counters and histograms are creation timestamps, not values.
- Ray's wrappers rename `vllm:x` to `vllm_x` (optionally `ray_vllm_x`); names are put back.
- Histogram children are grouped by their non-`le` labels in any line order (prometheus-cpp:
  `_count`, `_sum`, buckets; multiprocess: `_sum` first).
"""

from __future__ import annotations

import codecs
import functools
import itertools
import math
import operator
import re
import sys
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

from exporter.errors import ExpositionError
from exporter.exposition.pageplan import PagePlan, PlanFamily, PlanMatcher, PlanOutput, PlanSlot, make_plan

Labels = Mapping[str, str]

_RAY_PREFIX = re.compile(r"^(?:ray_)?(vllm|sglang)[:_]")
_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_LABEL = re.compile(r'[ \t]*([a-zA-Z_][a-zA-Z0-9_]*)[ \t]*=[ \t]*"((?:[^"\\\n]|\\.)*)"[ \t]*([,}])')
_TYPES = frozenset({"counter", "gauge", "histogram", "summary", "untyped", "unknown", "info", "stateset"})
_SUFFIXES = {
    "counter": ("_total", "_created"),
    "histogram": ("_bucket", "_sum", "_count", "_created"),
    "summary": ("_sum", "_count", "_created"),
}
# A line longer than this is malformed; the rest of it is skipped without being held.
MAX_LINE_CHARS = 64 * 1024
MAX_NAMED_PROBLEMS = 20  # names of malformed families kept for the log
# Parsed label blocks and sample heads kept per endpoint between scrapes (they repeat verbatim);
# bounded so that a page of ever-new label sets costs no more than the parse itself.
LABEL_CACHE_MAX = 4096
GARBAGE_LINES = 1000  # unreadable lines before the first family after which a page is given up
PLAN_KEY = "\n"  # where an endpoint's page plan sits in its cache (no line holds a newline)
_RECORD_MAX_CHARS = 1 << 20  # a page held to make a plan from; a bigger one gets none


class Sample(NamedTuple):
    """One sample of a gauge or counter (a tuple: a page makes hundreds)."""

    labels: Labels
    value: float


@dataclass(frozen=True)
class HistogramSeries:
    """One histogram child: cumulative (upper bound, count) pairs ending in +Inf."""

    labels: Labels
    buckets: tuple[tuple[float, float], ...]
    sum: float
    count: float


@dataclass
class Exposition:
    """Samples of one scrape, keyed by canonical name (colon prefixes restored, counters by base)."""

    gauges: dict[str, list[Sample]] = field(default_factory=dict)  # gauge and untyped
    counters: dict[str, list[Sample]] = field(default_factory=dict)  # base name, no `_total`
    histograms: dict[str, list[HistogramSeries]] = field(default_factory=dict)
    help: dict[str, str] = field(default_factory=dict)
    ray_prefixed: bool = False
    # None: every family was kept; otherwise asking for a family outside it is a programming error.
    wanted: frozenset[str] | None = None
    prefixes_seen: set[str] = field(default_factory=set)  # detection prefixes of every family seen
    noted: tuple[str, ...] = ()  # the prefixes the parser noted (prefixes_seen holds those it met)
    malformed_families: list[str] = field(default_factory=list)
    malformed_count: int = 0
    skipped_lines: int = 0
    samples: int = 0
    truncated: str | None = None  # "too_large" or "too_many_samples" when the page was cut

    def names(self) -> Iterable[str]:
        """Every canonical family name kept."""
        yield from self.gauges
        yield from self.counters
        yield from self.histograms

    def has_prefix(self, prefix: str) -> bool:
        """True when any family of the page (kept or not) starts with prefix."""
        if prefix in self.prefixes_seen:
            return True
        # every kept family was noted too: a noted prefix not seen starts none of them
        return prefix not in self.noted and any(n.startswith(prefix) for n in self.names())

    def _check(self, name: str) -> None:
        if self.wanted is not None and name not in self.wanted:
            raise LookupError(f"{name} is not among the families the parser keeps (declare it)")

    def gauge(self, name: str) -> list[Sample]:
        """Samples of a gauge (or untyped) family; [] when absent."""
        self._check(name)
        return self.gauges.get(name, [])

    def counter(self, name: str) -> list[Sample]:
        """Samples of a counter by wire or base name; falls back to untyped series of that name."""
        base = name.removesuffix("_total")
        self._check(base)
        if base in self.counters:
            return self.counters[base]
        return self.gauges.get(base + "_total") or self.gauges.get(base, [])

    def histogram(self, name: str) -> list[HistogramSeries]:
        """Children of a histogram family; [] when absent."""
        self._check(name)
        return self.histograms.get(name, [])


def is_name(text: str) -> bool:
    """A metric name, whole."""
    return _NAME.fullmatch(text) is not None


@functools.lru_cache(maxsize=4096)
def canonical_name(name: str) -> str:
    """Undo Ray's sanitising of `vllm:`/`sglang:` prefixes (`ray_vllm_x`, `vllm_x` -> `vllm:x`)."""
    return _RAY_PREFIX.sub(r"\1:", name, count=1)


@dataclass(slots=True)
class _Family:
    wire: str  # the name on the TYPE line (or the sample name of an untyped family)
    key: str  # canonical storage name (counters without `_total`)
    type: str
    keep: bool
    members: dict[str, str]  # sample name -> suffix ("" for a plain sample, "_created", "_bucket", ...)
    broken: bool = False
    rows: list[_Row] = field(default_factory=list)


_Row = tuple[str, str, "_LabelSet", float]  # (suffix, raw label text, labels, value)
_NO_MEMBERS: dict[str, str] = {}
_no_rows: list[_Row] = []  # what rows of no family would go to (none do: take is False)


def _members(wire: str, key: str, kind: str) -> dict[str, str]:
    if kind == "counter":
        # prometheus_client: TYPE x_total, samples x_total; TGI/Triton: TYPE x, samples x
        return {
            wire: "",
            key: "",
            key + "_total": "",
            key + "_created": "_created",
            wire + "_created": "_created",
        }
    if kind == "histogram":
        return {wire + s: s for s in ("_bucket", "_sum", "_count", "_created")}
    if kind == "summary":
        return {wire: "", **{wire + s: s for s in ("_sum", "_count", "_created")}}
    return {wire: ""}


@functools.lru_cache(maxsize=4096)
def _meaning(
    wire: str, kind: str, wanted: frozenset[str] | None, note_prefixes: tuple[str, ...]
) -> tuple[bool, str, bool, dict[str, str], tuple[str, ...]]:
    """What a family's wire name and type mean, the same on every page: (Ray-prefixed, storage key,
    kept, member sample names (shared: read only), noted prefixes it starts with)."""
    canon = canonical_name(wire)
    key = canon.removesuffix("_total") if kind == "counter" else canon
    keep = wanted is None or key in wanted
    if kind == "untyped" and wanted is not None:
        keep = keep or key.removesuffix("_total") in wanted
    noted = tuple(prefix for prefix in note_prefixes if canon.startswith(prefix))
    return canon != wire, key, keep, _members(wire, key, kind), noted


def _unescape(value: str) -> str:
    if "\\" not in value:
        return value
    out, i = [], 0
    while i < len(value):
        c = value[i]
        if c == "\\" and i + 1 < len(value):
            nxt = value[i + 1]
            out.append("\n" if nxt == "n" else nxt)
            i += 2
        else:
            out.append(c)
            i += 1
    return "".join(out)


def _value(token: str) -> float:
    if "_" in token:  # float() accepts 1_000, Prometheus does not
        raise ValueError(token)
    return float(token)


@dataclass(slots=True)
class _Child:
    labels: dict[str, str]
    buckets: list[tuple[float, int]] = field(default_factory=list)  # (bound, row)
    sum: int | None = None  # its rows
    count: int | None = None


class ExpositionParser:
    """Incremental parser: feed() text as it arrives, then finish()."""

    def __init__(
        self,
        wanted: Collection[str] | None = None,
        max_samples: int | None = None,
        note_prefixes: tuple[str, ...] = (),
        label_cache: dict[str, _Cached] | None = None,
        *,
        plans: bool = True,
    ) -> None:
        """`label_cache`: what the parser keeps per endpoint between scrapes (label blocks, sample
        heads, comment lines and, with `plans`, the page plan); None keeps nothing."""
        self._label_cache = label_cache
        self._wanted = frozenset(wanted) if wanted is not None else None
        self._max_samples = max_samples
        self._note_prefixes = note_prefixes
        self._families: dict[str, _Family] = {}  # kept families only
        self._families_seen = 0
        self._current: _Family | None = None
        self._help: dict[str, str] = {}
        self._carry = ""
        self._skipping_long_line = False
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self.expo = Exposition(wanted=self._wanted, noted=self._note_prefixes)
        self.stopped = False  # the sample cap was reached; stop feeding
        # A page plan (pageplan.py) for an endpoint parsed before (its cache is not empty): the page
        # is read through it while it matches, or recorded to make one.
        self._settings = (self._wanted, max_samples, note_prefixes)
        self._slot: PlanSlot | None = None
        self._matching: PlanMatcher | None = None
        self._record: list[str] | None = None
        self._recorded = 0
        if plans and label_cache:
            slot = label_cache.get(PLAN_KEY)
            if isinstance(slot, PlanSlot):
                self._slot = slot
            elif len(label_cache) < LABEL_CACHE_MAX:
                self._slot = label_cache[PLAN_KEY] = PlanSlot()
        if self._slot is not None:
            plan = self._slot.plan
            if plan is not None and plan.settings == self._settings:
                self._matching = PlanMatcher(plan, MAX_LINE_CHARS)
            elif self._slot.skip > 0:
                self._slot.skip -= 1
            else:
                self._record = []

    # ---- input --------------------------------------------------------------------------------
    def feed_bytes(self, chunk: bytes) -> bool:
        """Feed raw bytes; False once the parser wants no more."""
        return self.feed(self._decoder.decode(chunk))

    def feed(self, text: str) -> bool:
        """Feed text; False once the parser wants no more."""
        if self.stopped:
            return False
        if self._matching is not None:
            if self._matching.feed(text):
                return True
            text = self._left_plan()
        if self._record is not None:
            self._recorded += len(text)
            if self._recorded <= _RECORD_MAX_CHARS:
                self._record.append(text)
            else:
                self._record = None
        lines = text.split("\n")
        lines[0] = self._carry + lines[0]
        self._carry = lines.pop()
        cache = self._label_cache if self._label_cache is not None else {}
        expo = self.expo
        cap = self._max_samples if self._max_samples is not None else sys.maxsize
        first = 0
        if self._skipping_long_line and lines:
            self._skipping_long_line = False  # the tail of an over-long line
            first = 1
        # The current family's parts in locals, taken again after anything that may change them
        members, take, append = self._current_parts()
        samples = expo.samples
        for line in itertools.islice(lines, first, None):
            # The hot path, inlined: a series seen on an earlier scrape of this endpoint, as
            # `name{labels} value` with one space; only its value is new. Anything else (a comment, a
            # timestamp, a new series, a value float() reads but Prometheus does not) goes below.
            space = line.rfind(" ")
            head = cache.get(line[:space]) if space > 0 else None
            if type(head) is tuple and len(head) == 3:
                token = line[space + 1 :]
                if "_" not in token:
                    try:
                        value = float(token)
                    except ValueError:
                        pass
                    else:
                        suffix = members.get(head[0])
                        if suffix is None:
                            self._family_of(head[0])
                            members, take, append = self._current_parts()
                            suffix = members[head[0]]
                        if take:
                            append((suffix, head[1], head[2], value))
                            samples += 1
                            if samples > cap:
                                expo.samples = samples
                                expo.truncated = "too_many_samples"
                                self.stopped = True
                                return False
                        continue
            expo.samples = samples
            if line[:1] == "#":
                # TYPE and HELP lines seen on an earlier scrape, inlined; others take _comment
                got = cache.get(line)
                if type(got) is tuple and len(got) == 2:
                    self._current = self._open(got[0], got[1])
                elif type(got) is tuple and len(got) == 4:
                    if got[2] is not None:
                        self._help[got[0]] = got[2]
                else:
                    self._comment(line)
            else:
                self._line(line)
                if self.stopped:
                    return False
            members, take, append = self._current_parts()
            samples = expo.samples
        expo.samples = samples
        if len(self._carry) > MAX_LINE_CHARS:
            self._carry = ""
            self._skipping_long_line = True
            self._malformed(self._current)
        if self._families_seen == 0 and self.expo.skipped_lines >= GARBAGE_LINES:
            # So many lines and not one names a family: not an exposition (an HTML error page,
            # binary); reading the rest would only cost the sampler's time.
            self.stopped = True
            return False
        return True

    def _current_parts(self) -> tuple[Mapping[str, str], bool, Callable[[_Row], None]]:
        """The current family's members, whether its rows are taken, and its rows' append."""
        fam = self._current
        if fam is None:
            return _NO_MEMBERS, False, _no_rows.append
        return fam.members, fam.keep and not fam.broken, fam.rows.append

    def finish(self, truncated: str | None = None) -> Exposition:
        """The parsed page; `truncated` names why the caller stopped reading early."""
        if self._matching is not None:
            matcher = self._matching
            tail = self._decoder.decode(b"", final=True)
            if truncated is None and matcher.complete(tail):
                assert self._slot is not None
                self._slot.read(matcher.plan)
                return self.read_by_plan(matcher.plan, matcher.values)
            self.feed(self._left_plan() + tail)
        if not self.stopped and truncated is None:
            tail = self._carry + self._decoder.decode(b"", final=True)
            self._carry = ""
            if tail and not self._skipping_long_line:
                self._line(tail)
        if truncated is not None or self.stopped:
            # The family the cut went through may be missing rows: never serve half of it.
            self.expo.truncated = self.expo.truncated or truncated
            if self._current is not None:
                self._families.pop(self._current.key, None)
        self._build()
        if self._record is not None and self._slot is not None:
            self._slot.made(self._make_plan())
        return self.expo

    # ---- page plans (pageplan.py) -------------------------------------------------------------
    def _left_plan(self) -> str:
        """The page left its plan: everything fed so far, to parse; the slot learns it."""
        assert self._matching is not None and self._slot is not None
        text = self._matching.text()
        self._matching = None
        self._record = [] if self._slot.left() else None
        return text

    def _make_plan(self) -> PagePlan | None:
        expo = self.expo
        clean = not (
            self.stopped
            or expo.truncated
            or expo.malformed_count
            or expo.skipped_lines
            or self._skipping_long_line
        )
        if not clean or self._record is None:
            return None
        cache = self._label_cache
        wanted, cap, prefixes = self._settings

        def parser() -> ExpositionParser:
            return ExpositionParser(wanted, cap, prefixes, cache, plans=False)

        return make_plan("".join(self._record), expo, parser, self._settings, plan_outputs, is_name)

    def plan_rows(self) -> tuple[list[PlanFamily], list[int]] | None:
        """The kept families of a page whose values were line numbers (pageplan.make_plan), with each
        row's line number; None when the page was not read cleanly or a row is not from its line."""
        expo = self.expo
        if self.stopped or expo.malformed_count or expo.skipped_lines or self._carry:
            return None
        families: list[PlanFamily] = []
        used: list[int] = []
        for fam in self._families.values():
            rows = []
            for suffix, raw, ls, value in fam.rows:
                if not value.is_integer():
                    return None
                rows.append((suffix, raw, ls, int(value)))
                used.append(int(value))
            families.append((fam.wire, fam.key, fam.type, fam.members, rows))
        return families, used

    def help_texts(self) -> dict[str, str]:
        """HELP texts read so far, by wire name."""
        return self._help

    @property
    def families_seen(self) -> int:
        """Families opened so far, kept or not."""
        return self._families_seen

    def read_by_plan(self, plan: PagePlan, values: list[float]) -> Exposition:
        """The page a plan describes, with these values of its kept samples (in line order): what
        _build gives for it, with what depends only on the structure decided when the plan was made."""
        expo = self.expo
        expo.ray_prefixed = plan.ray_prefixed
        expo.prefixes_seen = set(plan.prefixes_seen)
        expo.samples = plan.samples_kept
        self._families_seen = plan.families_seen
        for kind, key, help_text, payload in plan.outputs:
            if help_text:
                expo.help.setdefault(key, help_text)
            if kind == "counter":
                expo.counters[key] = [Sample(labels, values[j]) for labels, j in payload]
            elif kind == "gauge":
                expo.gauges[key] = [Sample(labels, values[j]) for labels, j in payload]
            elif kind == "histogram":
                children = _histogram_series(payload, values)
                if children is None:
                    self._malformed(_Family(key, key, kind, True, _NO_MEMBERS))
                else:
                    expo.histograms[key] = children
        if not any(True for _ in expo.names()) and expo.malformed_count:
            raise ExpositionError(
                f"nothing readable in payload (0 unreadable lines, {expo.malformed_count} malformed)"
            )
        return expo

    # ---- lines --------------------------------------------------------------------------------
    def _line(self, line: str) -> None:
        if not line or line.isspace():
            return
        if line[0] == "#":
            self._comment(line)
            return
        if line[-1] == "\r":
            line = line[:-1]
        cache = self._label_cache
        space = line.rfind(" ")
        if cache is not None and space > 0:
            # A series seen on an earlier scrape of this endpoint, as `name{labels} value` with one
            # space: only the value is new (a timestamp, tabs or two spaces take the path below).
            head = cache.get(line[:space])
            if type(head) is tuple and len(head) == 3:
                try:
                    value = _value(line[space + 1 :])
                except ValueError:
                    pass  # e.g. `value\ttimestamp`: the full parse decides
                else:
                    self._add(head[0], head[1], head[2], value)
                    return
        m = _NAME.match(line)
        if m is None:
            self.expo.skipped_lines += 1  # names no family: costs nothing else
            return
        name = m.group(0)
        fam = self._current
        if fam is None or name not in fam.members:
            fam = self._family_of(name)
        if not fam.keep or fam.broken:
            return
        try:
            raw, labels, value = _sample(line, m.end(), cache)
        except ValueError:
            self._malformed(fam)
            return
        if cache is not None and space == m.end() + len(raw) and len(cache) < LABEL_CACHE_MAX:
            cache[line[:space]] = (name, raw, labels)
        self._append(fam, name, raw, labels, value)

    def _add(self, name: str, raw: str, labels: _LabelSet, value: float) -> None:
        fam = self._current
        if fam is None or name not in fam.members:
            fam = self._family_of(name)
        if not fam.keep or fam.broken:
            return
        self._append(fam, name, raw, labels, value)

    def _append(self, fam: _Family, name: str, raw: str, labels: _LabelSet, value: float) -> None:
        fam.rows.append((fam.members[name], raw, labels, value))
        self.expo.samples += 1
        if self._max_samples is not None and self.expo.samples > self._max_samples:
            self.expo.truncated = "too_many_samples"
            self.stopped = True

    def _comment(self, line: str) -> None:
        cache = self._label_cache
        got = cache.get(line) if cache is not None else None
        if type(got) is tuple and len(got) == 2:  # a TYPE line seen on an earlier scrape
            self._current = self._open(got[0], got[1])
            return
        if type(got) is tuple and len(got) == 4:  # a HELP line seen on an earlier scrape
            if got[2] is not None:
                self._help[got[0]] = got[2]
            return
        parts = line.split(None, 3)
        if len(parts) < 3 or parts[1] not in ("HELP", "TYPE"):
            return  # a plain comment
        name = parts[2]
        if _NAME.fullmatch(name) is None:
            self.expo.skipped_lines += 1
            return
        if parts[1] == "HELP":
            canon = canonical_name(name)
            text = None
            if self._wanted is None or canon in self._wanted or canon.removesuffix("_total") in self._wanted:
                text = _unescape(parts[3].rstrip("\r")) if len(parts) > 3 else ""
                self._help[name] = text
            if cache is not None and len(cache) < LABEL_CACHE_MAX:
                cache[line] = (name, "HELP", text, None)  # four items: never taken for a sample head
            return
        kind = parts[3].strip() if len(parts) > 3 else ""
        if kind not in _TYPES:
            self.expo.skipped_lines += 1
            return
        kind = "untyped" if kind == "unknown" else kind
        if cache is not None and len(cache) < LABEL_CACHE_MAX:
            cache[line] = (name, kind)
        self._current = self._open(name, kind)

    def _open(self, wire: str, kind: str) -> _Family:
        ray, key, keep, members, noted = _meaning(wire, kind, self._wanted, self._note_prefixes)
        if ray:
            self.expo.ray_prefixed = True
        fam = self._families.get(key)
        if fam is not None:
            if fam.type != kind:
                self._malformed(fam)  # one name, two types: neither can be trusted
            return fam
        self._families_seen += 1
        if noted:
            self.expo.prefixes_seen.update(noted)
        fam = _Family(wire, key, kind, keep, members)
        if keep:
            self._families[key] = fam  # families we drop are not remembered: a page of 80k costs nothing
        return fam

    def _family_of(self, name: str) -> _Family:
        fam = self._families.get(canonical_name(name))
        if fam is None or name not in fam.members:
            fam = self._open(name, "untyped")
        self._current = fam
        return fam

    def _malformed(self, fam: _Family | None) -> None:
        self.expo.malformed_count += 1
        if fam is None or fam.broken:
            return
        if len(self.expo.malformed_families) < MAX_NAMED_PROBLEMS:
            self.expo.malformed_families.append(fam.key)
        fam.broken = True
        fam.rows = []

    # ---- output -------------------------------------------------------------------------------
    def _build(self) -> None:
        expo = self.expo
        for fam in self._families.values():
            if fam.broken or not fam.rows:
                continue
            help_text = self._help.get(fam.wire)
            if help_text:
                expo.help.setdefault(fam.key, help_text)
            if fam.type == "counter":
                rows = [r for r in fam.rows if r[0] != "_created"]
                if _has_duplicates(rows):
                    self._malformed(fam)
                    continue
                expo.counters[fam.key] = [Sample(ls.labels, v) for _, _, ls, v in rows]
            elif fam.type == "histogram":
                children = _histogram_children(fam.rows)
                if children is None:
                    self._malformed(fam)
                    continue
                expo.histograms[fam.key] = children
            elif fam.type in ("gauge", "untyped"):
                base = fam.key.removesuffix("_created")
                if base != fam.key and (base in self._families or base + "_total" in self._families):
                    continue  # prometheus_client's creation timestamp of a counter or histogram
                if _has_duplicates(fam.rows):
                    self._malformed(fam)
                    continue
                expo.gauges[fam.key] = [Sample(ls.labels, v) for _, _, ls, v in fam.rows]
            # summaries, info and stateset families carry nothing we map
        kept = any(True for _ in expo.names())
        if not kept and (expo.malformed_count or (expo.skipped_lines and self._families_seen == 0)):
            raise ExpositionError(
                f"nothing readable in payload ({expo.skipped_lines} unreadable lines, "
                f"{expo.malformed_count} malformed)"
            )


@dataclass(frozen=True)
class _LabelSet:
    """One parsed label block, shared by every sample (and every scrape) that repeats it verbatim."""

    labels: dict[str, str]  # read-only once built
    le: str | None  # the histogram bucket bound, when there is one
    rest: dict[str, str]  # labels without `le`
    key: tuple[tuple[str, str], ...]  # sorted items of rest: a histogram child's identity
    bound: float | None = None  # le as a number; None when absent or not a number


_NO_LABELS = _LabelSet({}, None, {}, ())
# One key object per distinct non-`le` label set: a histogram child's rows share it, so grouping them
# is mostly an identity test (a bounded table; equal keys made after a clear still compare equal).
_KEYS: dict[tuple[tuple[str, str], ...], tuple[tuple[str, str], ...]] = {}
# What a parser keeps per endpoint between scrapes, in one bounded dict: parsed label blocks by their
# text (keys start with "{"), (name, label text, labels) by a sample line's text before its value
# (keys start with the metric name), (name, type) by a TYPE line and (name, "HELP", text or None
# when the family is not kept, None) by a HELP line (keys start with "#").
_Cached = (
    _LabelSet | tuple[str, str, _LabelSet] | tuple[str, str] | tuple[str, str, str | None, None] | PlanSlot
)


def _label_set(raw: str) -> _LabelSet:
    """Parse `{a="b",...}` exactly (the whole block must match); ValueError otherwise."""
    labels: dict[str, str] = {}
    pos = 1
    if raw[pos : pos + 1] != "}":
        while True:
            m = _LABEL.match(raw, pos)
            if m is None:
                raise ValueError("bad label set")
            key = sys.intern(m.group(1))
            if key in labels:
                raise ValueError("label given twice")
            value = _unescape(m.group(2))
            labels[key] = sys.intern(value) if len(value) <= 64 else value
            pos = m.end()
            if m.group(3) == "}":
                break
            if raw[pos : pos + 1] == "}":  # a trailing comma
                pos += 1
                break
    else:
        pos += 1
    if pos != len(raw):
        raise ValueError("text after the label set")
    le = labels.get("le")
    rest = {k: v for k, v in labels.items() if k != "le"} if le is not None else labels
    bound = None
    if le is not None:
        try:
            bound = _value(le)
        except ValueError:
            pass  # a bucket of this label set makes its family malformed
    items = tuple(sorted(rest.items()))
    if len(_KEYS) >= LABEL_CACHE_MAX:
        _KEYS.clear()
    return _LabelSet(labels, le, rest, _KEYS.setdefault(items, items), bound)


def _sample(line: str, pos: int, cache: dict[str, _Cached] | None) -> tuple[str, _LabelSet, float]:
    """(raw label text, labels, value) of a sample line whose name ends at pos; ValueError if malformed."""
    raw = ""
    labels = _NO_LABELS
    if pos < len(line) and line[pos] == "{":
        # The value and timestamp hold no "}", so the last one closes the label set even when a
        # label value contains one.
        end = line.rfind("}") + 1
        raw = line[pos:end]
        got = cache.get(raw) if cache is not None else None
        if not isinstance(got, _LabelSet):
            got = _label_set(raw)
            if cache is not None and len(cache) < LABEL_CACHE_MAX:
                cache[raw] = got
        labels = got
        pos = end
    if pos >= len(line) or line[pos] not in " \t":
        raise ValueError("no value")
    rest = line[pos:].split()
    if not rest or len(rest) > 2:
        raise ValueError("no value")
    value = _value(rest[0])
    if len(rest) == 2:
        int(rest[1])  # a timestamp in ms: checked, not used
    return raw, labels, value


def _has_duplicates(rows: list[_Row]) -> bool:
    # Prometheus refuses a whole page with a series twice; here only that family goes.
    if len({r[1] for r in rows}) == len(rows):
        return False  # no label text twice (the common case, without a tuple per row)
    return len({(r[0], r[1]) for r in rows}) != len(rows)


def _histogram_children(rows: list[_Row]) -> list[HistogramSeries] | None:
    """Group _bucket/_sum/_count rows by their non-`le` labels; None when a child is inconsistent."""
    shape = _histogram_shape(rows)
    return None if shape is None else _histogram_series(shape, [r[3] for r in rows])


# A histogram child as its rows' structure made it: (labels, bucket bounds in order, the rows their
# counts are in, the row of its _sum, the row of its _count); what rows hold is judged each time.
_ChildShape = tuple[dict[str, str], list[float], list[int], int | None, int | None]


def _histogram_shape(rows: Sequence[tuple[str, str, _LabelSet, object]]) -> list[_ChildShape] | None:
    """The children of a histogram's rows; None when a bucket has no bound or a child a bound twice."""
    groups: dict[tuple[tuple[str, str], ...], _Child] = {}
    last: tuple[tuple[str, str], ...] | None = None
    child = _Child({})
    for n, (suffix, _, ls, _) in enumerate(rows):
        if suffix == "_created":
            continue
        key = ls.key
        if key is not last and key != last:  # a child's rows mostly come together
            found = groups.get(key)
            if found is None:
                found = groups[key] = _Child(ls.rest)
            child, last = found, key
        if suffix == "_bucket":
            if ls.bound is None:
                return None  # no le, or one that is not a number
            child.buckets.append((ls.bound, n))
        elif suffix == "_sum":
            child.sum = n
        elif suffix == "_count":
            child.count = n
    out: list[_ChildShape] = []
    for child in groups.values():
        if not child.buckets:
            continue
        # by bound: rows of one child have distinct bounds (else it is dropped just below), so the
        # order is the one sorting (bound, count) pairs gives
        buckets = sorted(child.buckets)
        bounds = [b for b, _ in buckets]
        if len(set(bounds)) != len(bounds):
            return None  # one bound twice
        out.append((child.labels, bounds, [n for _, n in buckets], child.sum, child.count))
    return out


def _histogram_series(shape: list[_ChildShape], values: Sequence[float]) -> list[HistogramSeries] | None:
    """The children with these row values; None when a child's cumulative counts fall."""
    out: list[HistogramSeries] = []
    for labels, bounds, at, sum_at, count_at in shape:
        counts = [values[n] for n in at]
        if any(map(operator.lt, counts[1:], counts)):
            return None  # cumulative counts that fall: not a histogram
        total = values[sum_at] if sum_at is not None else math.nan
        count = values[count_at] if count_at is not None else math.nan
        if math.isnan(count):
            count = counts[-1]
        buckets = list(zip(bounds, counts, strict=True))
        if bounds[-1] != math.inf:
            buckets.append((math.inf, count))
        out.append(HistogramSeries(labels, tuple(buckets), total, count))
    return out


def _held(rows: list[tuple[str, str, _LabelSet, int]], row: int | None) -> int | None:
    return None if row is None else rows[row][3]


def plan_outputs(families: list[PlanFamily], help_texts: Mapping[str, str]) -> list[PlanOutput] | None:
    """What _build makes of a clean page's kept families (rows holding value indexes, in line order),
    with the structure decided: for reading the next pages through a plan (pageplan.py)."""
    keys = {f[1] for f in families}
    out: list[PlanOutput] = []
    for wire, key, kind, _, rows in families:
        if not rows:
            continue
        help_text = help_texts.get(wire) or None
        if kind == "counter":
            out.append(
                (kind, key, help_text, [(ls.labels, j) for suffix, _, ls, j in rows if suffix != "_created"])
            )
        elif kind == "histogram":
            shape = _histogram_shape(rows)
            if shape is None:
                return None  # not a page a plan can describe
            # the rows a child's counts are in, as the indexes of the page values those rows hold
            at_values = [
                (labels, bounds, [rows[n][3] for n in at], _held(rows, sum_at), _held(rows, count_at))
                for labels, bounds, at, sum_at, count_at in shape
            ]
            out.append((kind, key, help_text, at_values))
        elif kind in ("gauge", "untyped"):
            base = key.removesuffix("_created")
            if base != key and (base in keys or base + "_total" in keys):
                out.append(("", key, help_text, None))  # a creation timestamp: its HELP only
            else:
                out.append(("gauge", key, help_text, [(ls.labels, j) for _, _, ls, j in rows]))
        else:
            out.append(("", key, help_text, None))  # summaries, info, stateset: their HELP only
    return out


def parse_exposition(
    text: str,
    wanted: Collection[str] | None = None,
    max_samples: int | None = None,
    note_prefixes: tuple[str, ...] = (),
) -> Exposition:
    """Parse a whole page at once; raise ExpositionError when nothing in it is an exposition."""
    parser = ExpositionParser(wanted, max_samples, note_prefixes, {})
    parser.feed(text)
    return parser.finish()
