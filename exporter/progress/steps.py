"""A training job's step from the end of its container log (kubelet's /var/log/pods files), and how
the step changed over time: bounded, rotation-safe, pure apart from the file reads.

Kubelet writes each container's output to /var/log/pods/<namespace>_<pod>_<uid>/<container>/<N>.log
(N the restart count), one CRI line per output line: `<RFC 3339 time> <stream> <P|F> <text>` (P: a
partial line the runtime split, F: the line's end). It rotates a file by renaming it and opening a
new one (a new inode); copytruncate-style rotation shortens the file. Either way the next read
starts again from the end. A round reads at most `max_read_bytes` from where the last one stopped
(skipping to the end when more was written), and only whole lines: a huge line or binary garbage
costs its bytes, never more.

The default patterns match the step lines the common frameworks print by default (read in their
sources; docs/design/training.md, "Progress signal"). Patterns come from the exporter's flags only,
never from a pod annotation: a pod's author must not choose a regular expression the node agent runs.
"""

from __future__ import annotations

import os
import re
import statistics
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

from exporter.errors import ConfigError

DEFAULT_PATTERNS: tuple[str, ...] = (
    # Megatron-LM (and NeMo 1, Megatron-DeepSpeed) training_log: " iteration      100/  500000 |"
    r"\biteration\s+(\d+)\s*/\s*\d+",
    # NeMo 2 and Lightning-style key-value prints: "global_step: 99", "global_step=99"
    r"\bglobal_step\s*[=:]\s*(\d+)",
    # DeepSpeed's steps_per_print: "step=10, skipped=0, lr=..."; torchtitan: "step: 10  loss: 7.9"
    r"(?i)\bstep\s*[=:]\s*(\d+)",
    # tqdm bars (PyTorch Lightning's progress bar, HF Trainer's): "45%|####5  | 450/1000 [00:30<00:37"
    r"\|\s*(\d+)/\d+\s*\[\d",
    # MosaicML Composer's console logger: "[batch=10/100]"
    r"\[batch=(\d+)/\d+\]",
)
DEFAULT_MAX_READ_BYTES = 64 * 1024
_MAX_STEP_DIGITS = 15  # a larger "step" is not one
INTERVALS_KEPT = 9  # the update interval is the median of the last ones
_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")  # torchtitan colours its step lines
_CRI = re.compile(rb"^(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d+)?(?:Z|[+-]\d\d:\d\d)) (?:stdout|stderr) [PF] ")
_MAX_LOG_FILES = 64  # a container directory holds its restarts' files and a few rotated ones


def _is_step(text: str) -> bool:
    return 0 < len(text) <= _MAX_STEP_DIGITS and text.isascii() and text.isdigit()


def compile_patterns(patterns: Sequence[str]) -> tuple[re.Pattern[str], ...]:
    """Each pattern compiled; each must have exactly one capture group, the step (ConfigError)."""
    out: list[re.Pattern[str]] = []
    for text in patterns:
        try:
            pattern = re.compile(text)
        except re.error as exc:
            raise ConfigError(f"step pattern {text!r}: {exc}") from exc
        if pattern.groups != 1:
            raise ConfigError(f"step pattern {text!r}: needs exactly one capture group (the step)")
        out.append(pattern)
    return tuple(out)


def _cri_time(stamp: bytes) -> float | None:
    text = stamp.decode("ascii")
    whole, _, rest = text.partition(".")
    if rest:  # Python parses at most microseconds: keep 6 digits of the fraction, then the zone
        digits = len(rest) - len(rest.lstrip("0123456789"))
        text = f"{whole}.{rest[: min(digits, 6)]}{rest[digits:]}"
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


@dataclass(frozen=True)
class StepLine:
    """The last step a read found, and the runtime's time of its line (None without a CRI prefix)."""

    step: int
    line_time: float | None


def last_step(chunk: bytes, patterns: Sequence[re.Pattern[str]]) -> StepLine | None:
    """The step of the last line in `chunk` (whole lines) that a pattern matches, or None."""
    for raw in reversed(chunk.split(b"\n")):
        if not raw:
            continue
        line_time = None
        found = _CRI.match(raw)
        if found is not None:
            line_time = _cri_time(found.group(1))
            raw = raw[found.end() :]
        text = _ANSI.sub("", raw.decode("utf-8", "replace"))
        # a tqdm bar redraws itself with carriage returns: the last redraw is the latest step
        for segment in reversed(text.split("\r")):
            for pattern in patterns:
                # a capture that is no small whole number (letters, 5,000 digits) is no step
                hits = [g for m in pattern.finditer(segment) if _is_step(g := m.group(1) or "")]
                if hits:
                    return StepLine(int(hits[-1]), line_time)
    return None


def current_log(container_dir: Path) -> Path:
    """The file the runtime writes now: the newest `<N>.log` (rotated ones end in a date or .gz).
    Raises FileNotFoundError when there is none."""
    names: list[tuple[float, str]] = []
    with os.scandir(container_dir) as entries:
        for i, entry in enumerate(entries):
            if i >= _MAX_LOG_FILES:
                break
            if entry.name.endswith(".log") and entry.name[:-4].isdigit() and entry.is_file():
                names.append((entry.stat().st_mtime, entry.name))
    if not names:
        raise FileNotFoundError(f"no <N>.log in {container_dir}")
    return container_dir / max(names)[1]


@dataclass(frozen=True)
class TailRead:
    """What one read of a container's log found."""

    step: StepLine | None
    oversized: bool = False  # a line longer than max_read_bytes was skipped


@dataclass
class LogTail:
    """Where the last read of one container's log stopped (always at a line's start)."""

    container_dir: Path
    max_read_bytes: int = DEFAULT_MAX_READ_BYTES
    _file: tuple[str, int] | None = None  # (name, inode) read last
    _offset: int = 0

    def read(self, patterns: Sequence[re.Pattern[str]]) -> TailRead:
        """The last step line written since the previous read (blocking: run it off the loop).
        Raises OSError when the directory or its file is missing or unreadable."""
        path = current_log(self.container_dir)
        with path.open("rb") as f:
            st = os.fstat(f.fileno())
            same = self._file == (path.name, st.st_ino) and st.st_size >= self._offset
            start = self._offset if same else 0
            # more was written than one read takes: only the end is read, from a line's middle
            start = max(start, st.st_size - self.max_read_bytes)
            mid_line = start > (self._offset if same else 0)
            f.seek(start)
            chunk = f.read(self.max_read_bytes)
        self._file = (path.name, st.st_ino)
        if mid_line:
            cut = chunk.find(b"\n")
            if cut < 0:  # one line longer than a read: skip all of it
                self._offset = start + len(chunk)
                return TailRead(None, oversized=True)
            start, chunk = start + cut + 1, chunk[cut + 1 :]
        end = chunk.rfind(b"\n")
        if end < 0:
            # a line still being written; one longer than a read is skipped, never held
            oversized = len(chunk) >= self.max_read_bytes
            self._offset = start + len(chunk) if oversized else start
            return TailRead(None, oversized=oversized)
        self._offset = start + end + 1
        return TailRead(last_step(chunk[: end + 1], patterns))


@dataclass
class StepState:
    """How one source's step changed: the value, when it last changed, and how often it does."""

    step: float
    changed_at: float
    intervals: deque[float] = field(default_factory=lambda: deque(maxlen=INTERVALS_KEPT))

    @property
    def interval_seconds(self) -> float | None:
        """Median seconds between the last changes, None until it changed twice."""
        return statistics.median(self.intervals) if self.intervals else None


def observe(state: StepState | None, step: float, at: float) -> StepState:
    """The state after seeing `step` at time `at` (a log line's time, or the scrape's).

    A step that went down is a restart (the rank resumed from a checkpoint, or a bar began a new
    epoch): it counts as a change, and the time between the old run's last step and the new one's
    first (rescheduling, checkpoint load) is not taken for an update interval."""
    if state is None:
        return StepState(step, at)
    if step == state.step:
        return state
    advanced = step > state.step
    if advanced and at > state.changed_at:
        state.intervals.append(at - state.changed_at)
    state.step = step
    state.changed_at = max(at, state.changed_at) if advanced else at
    return state
