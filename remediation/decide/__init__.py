"""Pure decisions: functions of (state, event, now) that return verdicts, pages and field values.

Nothing here reads or writes the ledger, runs an effect or looks at the clock: the transitions
(remediation/transitions/) read the state, call these, write what they return and hand effects to the
runner. That is what lets the rules be tested without a database or an event loop.

- freshness.py: whether an alert notification is fresh evidence, old, reordered or expired
- incidents.py: an incident's identity key, its opening fields, what a due timer means
- pages.py: the pages (one incident's, a summary of a storm, the breaker's group) and the page budget
"""

from __future__ import annotations

# rem_incidents.held: 1 = waiting for a fresh notification after a gap, 2 = and its next step came due
HELD, HELD_DUE = 1, 2
# how long a page send may take before the tick considers it lost and sends it again
PAGE_INFLIGHT_SECONDS = 120.0
# rem_state row of the last tick: a start long after it means the engine did not watch meanwhile
HEARTBEAT = "heartbeat"
# rem_state rows of summary pages (one per signature and storm) are named SUMMARY + group
SUMMARY = "summary:"
