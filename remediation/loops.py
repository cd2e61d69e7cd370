"""Loop detection over the ledger: restart loops, recurrence after migration, flapping alerts.

Everything is counted from SQLite rows, so a controller restart forgets nothing.
"""

from __future__ import annotations

from dataclasses import dataclass

from remediation.ledger import Ledger
from remediation.settings import LoopSettings


@dataclass(frozen=True)
class LoopVerdict:
    """Why automation must stop for this target (empty kind = no loop)."""

    kind: str = ""
    detail: str = ""

    def __bool__(self) -> bool:
        return bool(self.kind)


class LoopDetector:
    """Answers the three loop questions the engine asks before acting."""

    def __init__(self, ledger: Ledger, settings: LoopSettings) -> None:
        self.ledger = ledger
        self.settings = settings

    def restart_loop(self, loop_key: str, now: float, job: bool = False) -> LoopVerdict:
        """True when the workload was already restarted max_restarts times within the window.

        A job's migrate restarts the job too (cordon, then restart), so for a job both rungs count."""
        s = self.settings
        since = now - s.restart_window_seconds
        count = self.ledger.count_loop_actions(loop_key, "restart", since)
        if job:
            count += self.ledger.count_loop_actions(loop_key, "migrate", since)
        if count >= s.max_restarts:
            return LoopVerdict(
                "restart_loop",
                f"{loop_key} restarted {count} times within {s.restart_window_seconds:.0f} s "
                f"(limit {s.max_restarts}); not restarting again",
            )
        return LoopVerdict()

    def recurrence_after_migration(self, loop_key: str, now: float) -> LoopVerdict:
        """True when this target was migrated recently and the fault is back."""
        s = self.settings
        count = self.ledger.count_loop_actions(
            loop_key, "migrate", now - s.migration_recurrence_window_seconds
        )
        if count:
            return LoopVerdict(
                "migration_recurrence",
                f"{loop_key} was migrated within {s.migration_recurrence_window_seconds:.0f} s "
                "and the fault recurred",
            )
        return LoopVerdict()

    def flapping(self, key: str, now: float) -> LoopVerdict:
        """True when the alert changed state more than flap_max_transitions times within the window."""
        s = self.settings
        count = self.ledger.count_transitions(key, now - s.flap_window_seconds)
        if count > s.flap_max_transitions:
            return LoopVerdict(
                "flapping",
                f"alert changed state {count} times within {s.flap_window_seconds:.0f} s "
                f"(limit {s.flap_max_transitions}); paging instead of acting",
            )
        return LoopVerdict()
