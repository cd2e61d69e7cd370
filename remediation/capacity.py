"""minHealthy per pool: whether taking one more node out would cross the pool's unavailable budget.

The verdict is one pure function over counts, so the Kubernetes backend (which counts the cordons the
cluster really has: remediation/kube/pools.py) and the engine (which, with the local and no-op backends
and in dry run, counts what the controller itself did, from the ledger) share one rule and one text.
"""

from __future__ import annotations

from collections.abc import Collection

from remediation.ledger import REAL_ACTION_STATUSES, Ledger
from remediation.settings import PoolSettings

# the refusal's words: a page that says this is about capacity, never about the fault
WOULD_EXCEED = "would exceed the pool's unavailable budget"


def pool_refusal(settings: PoolSettings, pool: str, total: int, out: Collection[str], node: str) -> str:
    """Why taking `node` out of a pool of `total` nodes, `out` of which are out already, is refused
    ("" when it is not, or when no budget is set). A node already out costs nothing more."""
    allowed = settings.allowed_out(total)
    if allowed is None or node in out:
        return ""
    if len(out) + 1 <= allowed:
        return ""
    name = f"pool {pool!r}" if pool else "the pool of every GPU node"
    shown = ", ".join(sorted(out)[:5]) + (" ..." if len(out) > 5 else "")
    return (
        f"migrate of {node} {WOULD_EXCEED}: {name} has {total} nodes, {len(out)} out already "
        f"({shown or 'none'}), at most {allowed} may be out at once "
        f"(max_unavailable {settings.max_unavailable}); nothing was changed"
    )


def nodes_taken_out(ledger: Ledger, since: float) -> set[str]:
    """Nodes the controller took out since `since` (migrates done, running or dry-run): what counts as
    out where the controller cannot see the cluster's cordons (the local and no-op backends)."""
    return ledger.migrated_nodes(since, (*REAL_ACTION_STATUSES, "dry_run"))
