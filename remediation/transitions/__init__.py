"""The engine's state machine over the ledger: each transition is one SQLite transaction.

A transition reads an incident, asks the pure rules in remediation/decide, records intent and
outcome, and returns effects (remediation/effects.py) for the runner to carry out after the commit.
The transitions are split by what starts them, each module building on the one before:

    base.py      shared state and helpers, `transact` (one transaction, metrics after commit)
    paging.py    an incident's page, the breaker's grouped page, a storm's summary page
    ladder.py    start a rung (loops, pause, breaker, budgets), escalate, verify, cool down, close
    events.py    an alert notification: open, renew, fire again, resolve
    timers.py    a tick; recovery at start and after a gap in watching
    outcomes.py  the result of an action, a page or a PromQL check (`Transitions`: all of them)
    board.py     the on-call board each tick publishes: open incidents, latest actions, budgets left
"""

from __future__ import annotations

from remediation.transitions.outcomes import Transitions

__all__ = ["Transitions"]
