"""Clocks for exporter tests: a hand-moved clock, and the exporter view of a simulation clock."""

from __future__ import annotations

from typing import Protocol


class ScenarioTime(Protocol):
    def monotonic(self) -> float: ...


class StepClock:
    """Wall and monotonic time that move only when told."""

    def __init__(self, start_unix: float = 1_800_000_000.0) -> None:
        self.offset = 0.0
        self.start_unix = start_unix

    def time(self) -> float:
        return self.start_unix + self.offset

    def monotonic(self) -> float:
        return self.offset

    def advance(self, seconds: float) -> None:
        self.offset += seconds


class ScenarioClock:
    """The exporter's clock on top of a simulation clock: wall time = the sim's epoch + scenario time."""

    def __init__(self, scenario_clock: ScenarioTime, epoch_us: int) -> None:
        self.scenario_clock, self.epoch_us = scenario_clock, epoch_us

    def time(self) -> float:
        return self.epoch_us / 1e6 + self.scenario_clock.monotonic()

    def monotonic(self) -> float:
        return self.scenario_clock.monotonic()
