"""Every exception the controller raises on purpose, in one place (like httpx's _exceptions.py).

    RemediationError                  base of them all
    ├── ConfigError                   a setting is missing, contradictory or unreadable: no start (exit 2)
    ├── CLIError                      a `signatures` sub-command user error: one line, exit 2
    ├── StoreError                    the inbox or ledger cannot be read or written (disk, timeout)
    │   └── StoreCorrupt              a database file fails SQLite's integrity check
    ├── QueueFull                     accepting these alerts would pass --queue.max-pending (503)
    ├── PayloadError                  not an Alertmanager notification we accept (400, names the field)
    ├── BodyRefused                   a request body that cannot be read as sent (4xx in `status`)
    ├── ActionError                   a backend's restart or migrate did not happen
    │   ├── PermanentError            it never can as asked (forbidden, no owner): the rung fails
    │   └── TemporaryError            it may next time (`delay_seconds`): the rung is retried
    ├── PagerError                    a page could not be delivered (retried from the ledger)
    ├── VerifyError                   Prometheus could not answer a verify query (not yet passed)
    ├── KubeError                     a Kubernetes API call failed (`status`, `reason`, `body`)
    │   ├── KubeNotFound (404)  KubeConflict (409)  KubeTooManyRequests (429)
    │   └── KubeForbidden (403)  KubeUnavailable (5xx, no answer)  KubeInvalid (422, 400)
    ├── LeadershipLost                this replica stopped leading: exit so it restarts as a follower
    │   └── ReplicationLost           the ledger's write-through to the cluster failed for good
    │       └── Fenced                another replica wrote our incidents, or our lease lapsed
    ├── NotLeader                     an engine call reached a follower
    ├── SelectorError (ValueError)    not a valid Kubernetes label selector
    └── SignatureError (ValueError)   a signature file is invalid (names file, signature and field)

The two ValueErrors stay ValueErrors: build_engine documents ValueError for invalid settings and
signature files, and the settings' validate() turns them into ConfigError.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


class RemediationError(Exception):
    """Base of the controller's own exceptions."""


class ConfigError(RemediationError):
    """A setting is missing, contradictory or unreadable; the service refuses to start."""


class CLIError(RemediationError):
    """A user error: printed as one line, exit status 2."""


class StoreError(RemediationError):
    """The inbox could not be read or written (disk full, corrupt file, timeout)."""


class StoreCorrupt(StoreError):
    """A database file fails SQLite's integrity check or is not a database at all."""


class QueueFull(RemediationError):
    """Accepting these alerts would exceed the pending-work limit; nothing was recorded."""


class PayloadError(RemediationError):
    """The payload is not an Alertmanager notification we can accept; `field` names what is wrong."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message

    def as_json(self) -> dict[str, str]:
        return {"error": self.message, "field": self.field}


class BodyRefused(RemediationError):
    """The body cannot be read as sent; `status` is the 4xx to answer, `field` what is wrong."""

    def __init__(self, status: int, field: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.field = field
        self.message = message


class ActionError(RemediationError):
    """A backend's action did not happen, or only in part: `left` then says, for the page, what state
    it left the cluster in and how to undo it ("" when nothing)."""

    left: str = ""


class PermanentError(ActionError):
    """The action can never succeed as asked (forbidden, no owner, target gone): do not retry it."""


class TemporaryError(ActionError):
    """The action failed this time (API timeout, PDB blocks eviction): it may be retried after delay.

    nothing_changed: the backend knows the server did not act (every write was refused, e.g. a 429
    from API Priority and Fairness, or the node's Lease is held by another action); the attempt is
    then no action for loops and budgets."""

    def __init__(self, message: str, delay_seconds: float = 5.0, *, nothing_changed: bool = False) -> None:
        super().__init__(message)
        self.delay_seconds = delay_seconds
        self.nothing_changed = nothing_changed


class PagerError(RemediationError):
    """The page could not be delivered."""


class VerifyError(RemediationError):
    """Prometheus could not answer (unreachable, bad query); the check counts as not yet passed."""


class KubeError(RemediationError):
    """An API call failed; `status` is the HTTP code (0 when no response came back)."""

    def __init__(
        self,
        status: int,
        reason: str,
        message: str,
        body: Mapping[str, Any] | None = None,
        retry_after_header_seconds: float = 0.0,
    ) -> None:
        super().__init__(f"{status} {reason}: {message}")
        self.status = status
        self.reason = reason
        self.message = message
        self.body: Mapping[str, Any] = body or {}
        # what the response's Retry-After header asked for (API Priority and Fairness sends only that)
        self.retry_after_header_seconds = retry_after_header_seconds

    @property
    def retry_after_seconds(self) -> float:
        """How long the server asked us to wait: details.retryAfterSeconds of a Status body, else the
        Retry-After header (a 429 of API Priority and Fairness has a text body and only the header),
        else 0."""
        value = (self.body.get("details") or {}).get("retryAfterSeconds")
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return float(value)
        return self.retry_after_header_seconds


class KubeNotFound(KubeError):
    """404: the object does not exist (any more)."""


class KubeConflict(KubeError):
    """409: already exists, stale resourceVersion, or a UID precondition that no longer holds."""


class KubeTooManyRequests(KubeError):
    """429: an eviction blocked by a PodDisruptionBudget, or API rate limiting (retry_after_seconds)."""


class KubeForbidden(KubeError):
    """401/403: our credentials or RBAC do not allow this call."""


class KubeUnavailable(KubeError):
    """5xx, timeouts, connection failures: the call may succeed later."""


class KubeInvalid(KubeError):
    """400/413/415/422 (and a 500 saying etcd found the object too large): the request itself is wrong."""


class LeadershipLost(RemediationError):
    """This replica stopped leading; the process exits so it restarts clean, as a follower."""


class ReplicationLost(LeadershipLost):
    """The write-through of a decision to the cluster's incidents failed: its effects are dropped and
    the replica steps down (the next leader rebuilds from the cluster)."""


class Fenced(ReplicationLost):
    """Another replica wrote our incidents since we read them, or our lease lapsed: stop acting."""


class NotLeader(RemediationError):
    """An engine call reached a replica that is not the leader."""


class SelectorError(RemediationError, ValueError):
    """The selector text is not a valid Kubernetes label selector."""


class SignatureError(RemediationError, ValueError):
    """A signature file is invalid; the message names the file, signature and field."""
