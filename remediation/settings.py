"""The controller's settings: one tree of typed, frozen dataclasses where every default lives.

    Settings                    `gpupulse-remediation serve` (listen, auth, TLS, storage, queue, worker, logs)
    ├── engine: EngineSettings  the decision engine (dry run, signatures, freshness, retries, pages)
    │   ├── budgets: BudgetSettings      actions, migrated nodes and pages per window (the breaker)
    │   ├── loops: LoopSettings          restart loops, recurrence after a migrate, flapping
    │   ├── scope: ScopeSettings         namespaces, node selector, opt-in label, off-scope handling
    │   ├── pager: EnginePagerSettings   where the page rung goes
    │   └── local_backend: LocalBackendSettings   the local backend's commands
    └── kube: KubeSettings      how `--backend kubernetes` reaches the cluster; leader election

Units are in the field names (`_seconds`, `_bytes`, `_fraction`); each default is documented next to
its field, and the CLI (remediation/cli.py) takes its flag defaults from here. The Kubernetes
backend's own tunables (eviction deadline, PDB policy) are KubernetesBackendSettings in
remediation/backends/kubernetes.py, read from --kube.backend-config.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from gpupulse.logs import LogFormat
from remediation.errors import ConfigError
from remediation.selector import parse_selector

SyncMode = Literal["FULL", "NORMAL"]
OnCorrupt = Literal["refuse", "recreate"]

DEFAULT_LISTEN_HOST = "0.0.0.0"
# 9836: next to the common GPU exporter ports; documented in docs/design/remediation-intake.md
DEFAULT_LISTEN_PORT = 9836
DEFAULT_MAX_BODY_BYTES = 1024 * 1024
DB_FILENAME = "gpupulse.db"
# the inbox has its own file: SQLite allows one writer per file, and sharing the engine's file made
# every webhook commit wait behind engine transactions (measured: ack p99 0.3-0.7 s at 500 alerts/s)
INBOX_FILENAME = "inbox.db"

# --kube.instance: a label value that also prefixes object names (a DNS-1123 label)
_INSTANCE = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")

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
    max_nodes_migrated_fraction: float = 0.1
    migrate_window_seconds: float = 3600.0
    # how often new incidents that arrive while the breaker is open are flushed as one grouped page
    # (and how often a summary page is updated)
    group_page_interval_seconds: float = 60.0
    # incidents paged one by one within page_window_seconds, of one signature and of all together;
    # beyond either, that signature's further incidents join one summary page, updated (same dedup
    # key) rather than repeated: a fleet-wide storm of one signature pages its first few, then once
    max_pages_per_signature: int = 3
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


# the one value of ScopeSettings.namespaces (flag --scope.namespaces='*', chart ["*"]) that means
# every namespace; an empty scope means none
ALL_NAMESPACES = "*"


@dataclass(frozen=True)
class ScopeSettings:
    """Which targets the engine may act on; others are recorded and never acted on."""

    # the namespaces whose workloads may be acted on: empty = none (pod and job targets never act;
    # GPU and node targets still may), ("*",) = every namespace. Any alert naming a namespace outside
    # it is out of scope, whatever its target (routing_namespaces aside, below)
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
    # may the engine act on nodes: migrate cordons and taints a node and evicts every pod on it,
    # whatever its namespace. False: GPU and node targets are out of scope and the migrate rung of
    # pod and job ladders is skipped; with an empty `namespaces` too, nothing is ever acted on
    nodes: bool = True
    # when set, an alert must carry this label (or annotation) with value "true";
    # Prometheus label names cannot hold "." or "/", so `gpupulse.io/remediate` arrives as e.g.
    # `label_gpupulse_io_remediate` (kube-state-metrics) or `gpupulse_io_remediate`
    opt_in_label: str = ""

    @property
    def every_namespace(self) -> bool:
        """True when the scope is `*`: workloads in any namespace may be acted on."""
        return ALL_NAMESPACES in self.namespaces

    def allows_namespace(self, namespace: str) -> bool:
        """May a workload in `namespace` be acted on? ("" = a workload that names none)"""
        return self.every_namespace or (bool(namespace) and namespace in self.namespaces)

    def validate(self) -> None:
        """Raise ValueError when the namespace scope is ambiguous."""
        if ALL_NAMESPACES in self.namespaces and len(self.namespaces) > 1:
            raise ValueError(
                f"scope.namespaces: {ALL_NAMESPACES!r} means every namespace and stands alone, "
                f"got {list(self.namespaces)}"
            )
        if ALL_NAMESPACES in self.routing_namespaces:
            raise ValueError(f"scope.routing_namespaces cannot be {ALL_NAMESPACES!r}: name the namespaces")


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
class EngineDiagnosisSettings:
    """The diagnosis step (docs/design/diagnosis.md): when it runs and how long it may take."""

    enabled: bool = True
    # Prometheus to read the signals from; "" = the PromQL verification's (prometheus_url), and
    # when that is empty too, every incident says "no diagnosis: no Prometheus is configured"
    prometheus_url: str = ""
    query_timeout_seconds: float = 5.0
    deadline_seconds: float = 20.0  # the whole step, all queries together
    # an incident whose signature could act differently on a diagnosis waits this long for it
    # before its first action; without an answer by then the ladder runs as without diagnosis
    wait_seconds: float = 30.0
    lookback_seconds: float = 2400.0
    step_seconds: float = 15.0
    max_concurrent: int = 2  # diagnoses running at once
    max_queued: int = 50  # beyond this many waiting, an incident gets "no diagnosis: busy"
    # Grafana dashboard URL for the page's link over the onset window; "" = no link
    dashboard_url: str = ""


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
    # when the alert of a GPU quarantined by a DeviceTaintRule resolves, validate the GPU (the
    # backend's validation Job) and lift the quarantine only on a pass (docs/design/device-quarantine.md);
    # off: the GPU stays out until a human runs the undo its page names
    return_to_service: bool = False
    # longest one validation may take; past it, it is asked again (its Job is found by name)
    return_to_service_timeout_seconds: float = 3600.0
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
    diagnosis: EngineDiagnosisSettings = field(default_factory=EngineDiagnosisSettings)

    @property
    def diagnosis_prometheus_url(self) -> str:
        """Where the diagnosis reads its signals ("" = no Prometheus)."""
        return self.diagnosis.prometheus_url or self.prometheus_url

    def validate(self) -> None:
        """Raise ValueError naming the first setting that cannot work."""
        b, lp = self.budgets, self.loops
        positive = {
            "budgets.max_concurrent_actions": b.max_concurrent_actions,
            "budgets.max_actions_per_minute": b.max_actions_per_minute,
            "budgets.max_nodes_migrated": b.max_nodes_migrated,
            "budgets.migrate_window_seconds": b.migrate_window_seconds,
            "budgets.max_pages_per_signature": b.max_pages_per_signature,
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
            "diagnosis.query_timeout_seconds": self.diagnosis.query_timeout_seconds,
            "diagnosis.deadline_seconds": self.diagnosis.deadline_seconds,
            "diagnosis.wait_seconds": self.diagnosis.wait_seconds,
            "diagnosis.lookback_seconds": self.diagnosis.lookback_seconds,
            "diagnosis.step_seconds": self.diagnosis.step_seconds,
            "diagnosis.max_concurrent": self.diagnosis.max_concurrent,
            "diagnosis.max_queued": self.diagnosis.max_queued,
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
        self.scope.validate()
        if self.scope.off_scope not in ("ignore", "page"):
            raise ValueError("engine setting scope.off_scope must be ignore or page")
        parse_selector(self.scope.node_selector)  # SelectorError is a ValueError naming the term
        if self.pager.kind == "pagerduty" and not self.pager.pagerduty_routing_key:
            raise ValueError("pager pagerduty needs a routing key")


@dataclass(frozen=True)
class KubeSettings:
    """How `serve --backend kubernetes` reaches the cluster and whether replicas elect a leader."""

    # empty: the pod's service account when running in a cluster, else $KUBECONFIG (resolved by the CLI)
    kubeconfig_path: str = ""
    context: str = ""
    namespace: str = ""  # the controller's namespace (Leases live here); default $POD_NAMESPACE
    identity: str = ""  # this replica's name (Lease holder); default $POD_NAME, else the hostname
    request_timeout_seconds: float = 10.0
    # on whenever more than one replica may run at once (rollouts included); see docs/reliability.md
    leader_election: bool = False
    # the chart names it per release; node lock Leases (gpupulse-node-<node>) are shared on purpose
    lease_name: str = "gpupulse-remediation-leader"
    # the Lease earlier versions shared (the chart: this default), held too during and after upgrades
    legacy_lease_name: str = ""
    legacy_lease_holder_prefix: str = ""  # this release's pod names start with it
    lease_duration_seconds: int = 15
    renew_deadline_seconds: float = 10.0
    retry_period_seconds: float = 2.0
    # YAML mapping of KubernetesBackendSettings fields (eviction deadline, PDB policy, ...)
    backend_config_file: Path | None = None
    # where incidents live: "sqlite" (the local ledger file) or "kubernetes" (GpuIncident custom
    # resources; the local file is the leader's cache, rebuilt at each takeover: docs/design/ha.md)
    ledger: str = "sqlite"
    # closed GpuIncident objects kept: the newest incident_keep, none closed longer ago than retention
    incident_keep: int = 1000
    incident_retention_seconds: float = 30 * 86400.0
    incident_prune_interval_seconds: float = 600.0
    # at most one status write per incident per interval for decisions with no effect (alert states
    # of a storm); a decision with effects is written through at once (docs/design/ha.md)
    incident_status_interval_seconds: float = 2.0
    # the release this controller belongs to: its GpuIncident and GpuRemediationState objects are
    # labelled and named by it, so two releases in one namespace share none ("" = the unlabelled names
    # of earlier versions; remediation/kube/incidents.py). The chart sets the release's name.
    instance: str = ""


@dataclass(frozen=True)
class Settings:
    """Everything `gpupulse-remediation serve` is configured with."""

    listen_host: str = DEFAULT_LISTEN_HOST
    listen_port: int = DEFAULT_LISTEN_PORT
    auth_token_file: Path | None = None
    # the token itself (read from the file or GPUPULSE_REMEDIATION_TOKEN); never printed
    auth_token: str = field(default="", repr=False)
    insecure_no_auth: bool = False
    tls_cert_file: Path | None = None
    tls_key_file: Path | None = None
    tls_client_ca_file: Path | None = None
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    # a request head must be complete this long after its first byte (slowloris), the body after the head
    web_read_header_timeout_seconds: float = 10.0
    web_read_body_timeout_seconds: float = 30.0
    storage_path: Path = Path("/var/lib/gpupulse-remediation")
    storage_synchronous: SyncMode = "FULL"
    storage_timeout_seconds: float = 5.0
    # a corrupt inbox: refuse to start (default), or set it aside and start empty, logging the loss
    storage_on_corrupt: OnCorrupt = "refuse"
    # pair the ledger with an inbox other than the one it remembers (after deliberately replacing it)
    storage_accept_new_inbox: bool = False
    inbox_retention_seconds: float = 7 * 24 * 3600.0
    queue_max_pending: int = 10_000
    engine_tick_interval_seconds: float = 1.0
    engine_handle_timeout_seconds: float = 60.0
    worker_retry_initial_seconds: float = 1.0
    worker_retry_max_seconds: float = 300.0
    # the decision engine's settings (dry-run, signatures, budgets, scope, backend, pager)
    engine: EngineSettings = field(default_factory=EngineSettings)
    kube: KubeSettings = field(default_factory=KubeSettings)
    log_format: LogFormat = "logfmt"
    log_level: str = "info"
    shutdown_grace_seconds: float = 10.0

    @property
    def db_path(self) -> Path:
        """The engine's SQLite file (ledger, incidents, loops, safety)."""
        return self.storage_path / DB_FILENAME

    @property
    def inbox_path(self) -> Path:
        """The intake's SQLite file (accepted alerts, processed marks)."""
        return self.storage_path / INBOX_FILENAME

    @property
    def tls_enabled(self) -> bool:
        return self.tls_cert_file is not None

    def validate(self) -> None:
        """Raise ConfigError when the settings cannot run safely."""
        if not self.auth_token and self.tls_client_ca_file is None and not self.insecure_no_auth:
            raise ConfigError(
                "no authentication configured: give --auth.token-file or GPUPULSE_REMEDIATION_TOKEN "
                "(or --web.tls-client-ca-file), or pass --insecure-no-auth explicitly"
            )
        if (self.tls_cert_file is None) != (self.tls_key_file is None):
            raise ConfigError("--web.tls-cert-file and --web.tls-key-file must be given together")
        if self.tls_client_ca_file is not None and self.tls_cert_file is None:
            raise ConfigError("--web.tls-client-ca-file needs --web.tls-cert-file and --web.tls-key-file")
        if not 0 < self.listen_port < 65536 and self.listen_port != 0:
            raise ConfigError(f"--web.listen-address: port {self.listen_port} out of range")
        if self.max_body_bytes < 1024:
            raise ConfigError("--web.max-body-bytes must be at least 1024")
        if self.web_read_header_timeout_seconds <= 0 or self.web_read_body_timeout_seconds <= 0:
            raise ConfigError("--web.read-header-timeout and --web.read-body-timeout must be positive")
        if self.queue_max_pending < 1:
            raise ConfigError("--queue.max-pending must be at least 1")
        if self.engine_tick_interval_seconds <= 0:
            raise ConfigError("--engine.tick-interval must be positive")
        if self.engine_handle_timeout_seconds <= 0:
            raise ConfigError("--engine.handle-timeout must be positive")
        budgets = self.engine.budgets
        if not 0.0 <= budgets.max_nodes_migrated_fraction <= 1.0:
            raise ConfigError("--safety.max-nodes-migrated-fraction must be within [0, 1]")
        if self.engine.backend == "kubernetes":
            self._validate_kube()
        elif self.engine.scope.node_selector:
            raise ConfigError("--scope.node-selector reads Node labels: it needs --backend=kubernetes")
        pager = self.engine.pager
        if pager.kind in ("webhook", "slack") and not pager.url:
            raise ConfigError(f"--pager={pager.kind} needs --pager.url (or --pager.url-file)")
        if pager.kind == "pagerduty" and not pager.pagerduty_routing_key:
            raise ConfigError("--pager=pagerduty needs --pager.pagerduty.routing-key-file")
        try:
            self.engine.validate()  # the rest (budgets, selector syntax), in the engine's own words
        except ValueError as e:
            raise ConfigError(str(e)) from e

    def _validate_kube(self) -> None:
        kube = self.kube
        if not kube.namespace:
            raise ConfigError("--backend=kubernetes needs --kube.namespace (or POD_NAMESPACE)")
        if not kube.identity:
            raise ConfigError("--backend=kubernetes needs --kube.identity (or POD_NAME)")
        if kube.request_timeout_seconds <= 0:
            raise ConfigError("--kube.request-timeout must be positive")
        if kube.instance and not _INSTANCE.fullmatch(kube.instance):
            raise ConfigError(
                f"--kube.instance {kube.instance!r}: lowercase letters, digits and '-', starting and"
                " ending with a letter or digit, at most 63 (it is a label value)"
            )
        if kube.instance == "controller":  # the unnamed instance's switches object is called that
            raise ConfigError("--kube.instance cannot be 'controller' (the unnamed instance's object name)")
        if kube.leader_election and not (
            kube.lease_duration_seconds > kube.renew_deadline_seconds > kube.retry_period_seconds > 0
        ):
            raise ConfigError(
                "leader election needs --kube.lease-duration > --kube.renew-deadline"
                " > --kube.retry-period > 0"
            )
