"""Settings of the decision engine (ladder, loops, safety, scope, pager, backend), with their defaults."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from remediation.selector import parse_selector

EngineBackendKind = Literal["local", "kubernetes", "none"]
EnginePagerKind = Literal["webhook", "pagerduty", "slack", "none"]


@dataclass(frozen=True)
class BudgetSettings:
    """Global budgets; an action beyond any of them opens the breaker (only a human closes it)."""

    # restart/migrate actions started and not yet finished
    max_concurrent_actions: int = 4
    # restart/migrate actions started in the last 60 s
    max_actions_per_minute: int = 20
    # distinct nodes touched by a migrate of a gpu/node target within migrate_window_seconds
    max_nodes_migrated: int = 3
    # the same as a fraction of known nodes (cluster_node_count, else nodes seen in alerts); 0 disables
    max_nodes_migrated_fraction: float = 0.2
    migrate_window_seconds: float = 3600.0
    # how often new incidents that arrive while the breaker is open are flushed as one grouped page
    # (and how often a summary page is updated)
    group_page_interval_seconds: float = 60.0
    # incidents paged one by one within page_window_seconds; beyond that, each signature's further
    # incidents join one summary page, updated (same dedup key) rather than repeated
    max_pages_per_window: int = 20
    page_window_seconds: float = 600.0


@dataclass(frozen=True)
class LoopSettings:
    """Loop and flapping detection; all counted from the ledger, so it survives restarts."""

    # a workload restarted this many times within restart_window_seconds is not restarted again
    max_restarts: int = 3
    restart_window_seconds: float = 3600.0
    # a new incident on a target migrated within this window goes straight to page
    migration_recurrence_window_seconds: float = 3600.0
    # more than this many firing/resolved transitions of one incident key within the window = flapping
    flap_max_transitions: int = 6
    flap_window_seconds: float = 1800.0


@dataclass(frozen=True)
class ScopeSettings:
    """Which targets the engine may act on; others are recorded and never acted on."""

    # empty = every namespace; any alert naming a namespace outside it is out of scope, whatever its
    # target (a pod target must name one)
    namespaces: tuple[str, ...] = ()
    # namespaces alerts carry only to be routed, not to name a workload: the chart stamps its own
    # namespace on node, GPU and exporter alerts so that prometheus-operator's default OnNamespace
    # matcher routes them to us. On targets other than pods such a namespace is not checked.
    routing_namespaces: tuple[str, ...] = ()
    # Kubernetes label selector on the Node of gpu and node targets (e.g. "nodepool=inference,
    # !gpupulse.io/no-remediation"); "" = every node. Needs a node-label source (the Kubernetes backend)
    node_selector: str = ""
    # what an out-of-scope alert becomes: "ignore" (recorded, never acted on or paged) or "page"
    # (a human is told, nothing is acted on)
    off_scope: Literal["ignore", "page"] = "ignore"
    # when set, an alert must carry this label (or annotation) with value "true";
    # Prometheus label names cannot hold "." or "/", so `gpupulse.io/remediate` arrives as e.g.
    # `label_gpupulse_io_remediate` (kube-state-metrics) or `gpupulse_io_remediate`
    opt_in_label: str = ""


@dataclass(frozen=True)
class EnginePagerSettings:
    """Where the page rung goes."""

    kind: EnginePagerKind = "none"
    url: str = ""  # generic webhook or Slack-compatible webhook URL
    pagerduty_routing_key: str = field(default="", repr=False)
    pagerduty_url: str = "https://events.pagerduty.com/v2/enqueue"
    source: str = "gpupulse-remediation"
    timeout_seconds: float = 10.0
    retries: int = 3
    retry_backoff_seconds: float = 0.5


@dataclass(frozen=True)
class LocalBackendSettings:
    """The local backend: argv templates (never a shell string) or a signal to a PID."""

    restart_command: tuple[str, ...] = ()
    migrate_command: tuple[str, ...] = ()
    timeout_seconds: float = 60.0
    # signal sent on restart when no restart_command is set (PID from pidfile or the `pid` label)
    restart_signal: str = "SIGTERM"
    pidfile: Path | None = None


@dataclass(frozen=True)
class EngineSettings:
    """Everything build_engine needs besides the database, metrics, clock and injected backends."""

    # decide and record (outcome dry_run), never call a backend and never send a page
    dry_run: bool = False
    # extra signature directories (user library); later directories override earlier ones by name
    signature_dirs: tuple[Path, ...] = ()
    include_builtin_signatures: bool = True
    budgets: BudgetSettings = field(default_factory=BudgetSettings)
    loops: LoopSettings = field(default_factory=LoopSettings)
    scope: ScopeSettings = field(default_factory=ScopeSettings)
    # 0 = unknown: the fraction budget then uses the number of distinct nodes seen in alerts
    cluster_node_count: int = 0
    # Prometheus base URL for PromQL verification (signatures with verify_promql); "" disables
    prometheus_url: str = ""
    prometheus_timeout_seconds: float = 5.0
    # evidence older than this is never acted on: a firing alert processed longer than this after it
    # was received (a backlog after an outage), and, after the engine did not watch for longer than
    # this (restart, failover), every open incident until a fresh notification confirms it
    max_event_age_seconds: float = 900.0
    # retries of an action that raised TemporaryError before the rung counts as failed
    max_temporary_retries: int = 3
    # an action still running after this long counts as a temporary failure
    action_timeout_seconds: float = 600.0
    # a page that could not be delivered is retried after this long
    page_retry_seconds: float = 30.0
    # a resolved PromQL-verified incident re-runs its query at most this often
    promql_recheck_seconds: float = 15.0
    # handled dedup keys are forgotten after this long (well beyond the inbox retention)
    handled_keys_retention_seconds: float = 30 * 24 * 3600.0
    # paged incidents that never resolve are closed as unresolved after this long
    paged_incident_max_age_seconds: float = 7 * 24 * 3600.0
    # where operators reach this controller (links in summary pages); "" = links are paths only
    external_url: str = ""
    # used when a signature has no runbook_url: <base>/<fault_class>
    runbook_base_url: str = "https://github.com/gpupulse/gpupulse/blob/main/docs/runbooks"
    pager: EnginePagerSettings = field(default_factory=EnginePagerSettings)
    backend: EngineBackendKind = "local"
    local_backend: LocalBackendSettings = field(default_factory=LocalBackendSettings)
    # OpenTelemetry: OTLP/HTTP traces endpoint (e.g. http://collector:4318/v1/traces); "" = no export
    otlp_traces_endpoint: str = ""
    service_name: str = "gpupulse-remediation"

    def validate(self) -> None:
        """Raise ValueError naming the first setting that cannot work."""
        b, lp = self.budgets, self.loops
        positive = {
            "budgets.max_concurrent_actions": b.max_concurrent_actions,
            "budgets.max_actions_per_minute": b.max_actions_per_minute,
            "budgets.max_nodes_migrated": b.max_nodes_migrated,
            "budgets.migrate_window_seconds": b.migrate_window_seconds,
            "budgets.max_pages_per_window": b.max_pages_per_window,
            "budgets.page_window_seconds": b.page_window_seconds,
            "loops.max_restarts": lp.max_restarts,
            "loops.restart_window_seconds": lp.restart_window_seconds,
            "loops.flap_max_transitions": lp.flap_max_transitions,
            "loops.flap_window_seconds": lp.flap_window_seconds,
            "action_timeout_seconds": self.action_timeout_seconds,
            "max_event_age_seconds": self.max_event_age_seconds,
            "local_backend.timeout_seconds": self.local_backend.timeout_seconds,
            "pager.timeout_seconds": self.pager.timeout_seconds,
        }
        for name, value in positive.items():
            if value <= 0:
                raise ValueError(f"engine setting {name} must be positive, got {value}")
        if not 0.0 <= b.max_nodes_migrated_fraction <= 1.0:
            raise ValueError("engine setting budgets.max_nodes_migrated_fraction must be within [0, 1]")
        if self.max_temporary_retries < 0 or self.cluster_node_count < 0:
            raise ValueError(
                "engine settings max_temporary_retries and cluster_node_count must not be negative"
            )
        if self.pager.kind in ("webhook", "slack") and not self.pager.url:
            raise ValueError(f"pager {self.pager.kind} needs a URL")
        if self.scope.off_scope not in ("ignore", "page"):
            raise ValueError("engine setting scope.off_scope must be ignore or page")
        parse_selector(self.scope.node_selector)  # SelectorError is a ValueError naming the term
        if self.pager.kind == "pagerduty" and not self.pager.pagerduty_routing_key:
            raise ValueError("pager pagerduty needs a routing key")
