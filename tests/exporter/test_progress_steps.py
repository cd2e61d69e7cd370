"""The step lines of a container log: the frameworks' default lines, CRI framing, and a reader that
stays bounded through huge lines, garbage, rotation, truncation and a missing file."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from exporter.errors import ConfigError
from exporter.progress.steps import (
    DEFAULT_PATTERNS,
    LogTail,
    StepLine,
    compile_patterns,
    last_step,
    observe,
)

PATTERNS = compile_patterns(DEFAULT_PATTERNS)
T0 = "2026-12-01T10:00:00.123456789Z"


def cri(text: str, stamp: str = T0, tag: str = "F") -> bytes:
    return f"{stamp} stdout {tag} {text}\n".encode()


# One line each framework prints by default (formats read in their sources; docs/design/training.md)
FRAMEWORK_LINES = {
    "megatron": (
        " [2026-12-01 10:00:00] iteration      120/  500000 | consumed samples:       245760 | "
        "elapsed time per iteration (ms): 4213.7 | learning rate: 2.9E-04 |",
        120,
    ),
    "nemo2": (
        "Training epoch 0, iteration 99/999 | lr: 3e-04 | global_step: 99 | reduced_train_loss: 2.1",
        99,
    ),
    "deepspeed": (
        "[2026-12-01 10:00:00,001] [INFO] [logging.py:96:log_dist] [Rank 0] step=10, skipped=0, "
        "lr=[0.0001], mom=[(0.9, 0.999)]",
        10,
    ),
    "torchtitan": (
        "[rank0]:[titan] 2026-12-01 10:00:00,000 - root - INFO - \x1b[31mstep: 42  \x1b[32mloss:  7.9312  "
        "\x1b[33mmemory: 31.20GiB(39.45%)  \x1b[34mtps: 5,012\x1b[39m",
        42,
    ),
    "lightning-tqdm": (
        "Epoch 0:  45%|████▌     | 450/1000 [00:30<00:37, 14.80it/s, v_num=0, loss=2.31]",
        450,
    ),
    "hf-trainer-tqdm": (" 12%|█▏        | 60/500 [01:02<07:36,  1.04s/it]", 60),
    "composer": ("[batch=10/100]:", 10),
}


@pytest.mark.parametrize("name", sorted(FRAMEWORK_LINES))
def test_the_default_patterns_read_each_frameworks_step_line(name: str) -> None:
    text, step = FRAMEWORK_LINES[name]
    assert last_step(cri(text), PATTERNS) == StepLine(step, 1796119200.123456)


def test_lines_without_a_step_are_no_progress() -> None:
    chunk = cri("loading checkpoint from /ckpt/step-900") + cri("NCCL INFO Channel 00/32 : 0[0] -> 1[1]")
    assert last_step(chunk, PATTERNS) is None


def test_the_last_step_line_wins_and_a_tqdm_bar_reads_its_last_redraw() -> None:
    bar = "\r".join(f" 12%|█▏  | {n}/500 [01:02<07:36,  1.04s/it]" for n in (58, 59, 60))
    chunk = cri("step=8, skipped=0") + cri(bar) + cri("saving checkpoint")
    assert last_step(chunk, PATTERNS) == StepLine(60, 1796119200.123456)


def test_a_line_without_cri_framing_still_gives_its_step_without_a_time() -> None:
    assert last_step(b"step: 7  loss: 1.0\n", PATTERNS) == StepLine(7, None)


def test_binary_garbage_and_absurd_numbers_are_no_step() -> None:
    garbage = os.urandom(4096).replace(b"\n", b" ") + b"\n"
    absurd = cri("step=99999999999999999999999")
    assert last_step(garbage + absurd, PATTERNS) is None


def test_a_capture_that_is_no_number_or_thousands_of_digits_is_no_step() -> None:
    own = compile_patterns([r"phase=(\w+)", r"step=(\d+)"])
    chunk = cri("phase=warmup") + cri("step=" + "9" * 5000) + cri("step=12") + cri("step=٣")
    assert last_step(chunk, own) == StepLine(12, 1796119200.123456)


def test_a_pattern_must_capture_exactly_the_step() -> None:
    with pytest.raises(ConfigError, match="one capture group"):
        compile_patterns([r"step \d+"])
    with pytest.raises(ConfigError, match="step pattern"):
        compile_patterns([r"step (\d+"])


def container(tmp_path: Path) -> Path:
    d = tmp_path / "train_llama-worker-0_uid-0" / "trainer"
    d.mkdir(parents=True)
    return d


def test_the_reader_gives_each_new_step_once_and_nothing_when_nothing_was_written(tmp_path: Path) -> None:
    d = container(tmp_path)
    log = d / "0.log"
    log.write_bytes(cri("step=1, skipped=0"))
    tail = LogTail(d)
    assert tail.read(PATTERNS).step == StepLine(1, 1796119200.123456)
    assert tail.read(PATTERNS).step is None  # nothing new
    with log.open("ab") as f:
        f.write(cri("step=2, skipped=0", "2026-12-01T10:00:05Z"))
    assert tail.read(PATTERNS).step == StepLine(2, 1796119205.0)


def test_a_line_still_being_written_is_read_once_it_ends(tmp_path: Path) -> None:
    d = container(tmp_path)
    log = d / "0.log"
    log.write_bytes(f"{T0} stdout P step=".encode())
    tail = LogTail(d)
    assert tail.read(PATTERNS).step is None
    with log.open("ab") as f:
        f.write(b"5, skipped=0\n")
    assert tail.read(PATTERNS).step == StepLine(5, 1796119200.123456)


def test_only_the_end_of_a_large_backlog_is_read(tmp_path: Path) -> None:
    d = container(tmp_path)
    log = d / "0.log"
    log.write_bytes(b"".join(cri(f"step={n}, skipped=0") for n in range(100_000)))
    tail = LogTail(d, max_read_bytes=4096)
    assert os.path.getsize(log) > 1_000_000
    assert tail.read(PATTERNS).step == StepLine(99_999, 1796119200.123456)


def test_a_huge_line_is_skipped_and_the_reader_goes_on(tmp_path: Path) -> None:
    d = container(tmp_path)
    log = d / "0.log"
    log.write_bytes(cri("step=1, skipped=0"))
    tail = LogTail(d, max_read_bytes=4096)
    tail.read(PATTERNS)
    with log.open("ab") as f:
        f.write(b"x" * 50_000)  # no newline yet: a line far longer than one read
    assert tail.read(PATTERNS).oversized
    with log.open("ab") as f:
        f.write(b" step=999\n" + cri("step=3, skipped=0"))
    # the tail of the huge line is dropped with it; the next whole line is read
    assert tail.read(PATTERNS).step == StepLine(3, 1796119200.123456)


def test_rotation_and_truncation_start_again_from_the_new_file(tmp_path: Path) -> None:
    d = container(tmp_path)
    log = d / "0.log"
    log.write_bytes(b"".join(cri(f"step={n}, skipped=0") for n in range(50)))
    tail = LogTail(d)
    assert tail.read(PATTERNS).step == StepLine(49, 1796119200.123456)
    # kubelet rotates: rename, then a new file (new inode) shorter than the old offset
    log.rename(d / "0.log.20261201-100000")
    log.write_bytes(cri("step=50, skipped=0"))
    assert tail.read(PATTERNS).step == StepLine(50, 1796119200.123456)
    # copytruncate: same inode, shorter
    with log.open("r+b") as f:
        f.truncate(0)
    with log.open("ab") as f:
        f.write(cri("step=51"))
    assert tail.read(PATTERNS).step == StepLine(51, 1796119200.123456)


def test_a_restarted_container_is_read_from_its_new_file(tmp_path: Path) -> None:
    d = container(tmp_path)
    (d / "0.log").write_bytes(cri("step=700"))
    tail = LogTail(d)
    tail.read(PATTERNS)
    os.utime(d / "0.log", (1, 1))
    (d / "1.log").write_bytes(cri("step=650"))  # restart count 1, resumed from a checkpoint
    assert tail.read(PATTERNS).step == StepLine(650, 1796119200.123456)


def test_a_missing_log_is_an_oserror_the_collector_counts(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        LogTail(tmp_path / "gone").read(PATTERNS)
    empty = container(tmp_path)
    with pytest.raises(FileNotFoundError):
        LogTail(empty).read(PATTERNS)


def test_the_update_interval_is_the_median_of_recent_changes_and_ignores_a_restart() -> None:
    state = observe(None, 10, 100.0)
    assert state.interval_seconds is None
    for step, at in ((20, 110.0), (30, 120.0), (40, 300.0), (50, 310.0)):  # one 180 s checkpoint
        state = observe(state, step, at)
    assert (state.step, state.changed_at, state.interval_seconds) == (50, 310.0, 10.0)
    assert observe(state, 50, 900.0).changed_at == 310.0  # the same step again is no progress
    # a counter that goes backwards is a restart: a change now, and no interval across it
    state = observe(state, 30, 1500.0)
    assert (state.step, state.changed_at, state.interval_seconds) == (30, 1500.0, 10.0)
    state = observe(state, 40, 1510.0)
    assert state.interval_seconds == 10.0 and len(state.intervals) == 5
