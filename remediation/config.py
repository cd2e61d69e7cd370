"""Settings of the remediation controller: one typed place where every default lives."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from gpupulse.logs import LogFormat

from .engine_config import EngineSettings

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


class ConfigError(Exception):
    """A setting is missing, contradictory or unreadable; the service refuses to start."""


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
    lease_name: str = "gpupulse-remediation-leader"
    lease_duration_seconds: int = 15
    renew_deadline_seconds: float = 10.0
    retry_period_seconds: float = 2.0
    # YAML mapping of KubernetesBackendSettings fields (eviction deadline, PDB policy, ...)
    backend_config_file: Path | None = None


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
    # the decision engine's settings (dry-run, signatures, budgets, scope, backend, pager) live in
    # the engine's own dataclasses, so their defaults are defined once (remediation/engine_config.py)
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
        if kube.leader_election and not (
            kube.lease_duration_seconds > kube.renew_deadline_seconds > kube.retry_period_seconds > 0
        ):
            raise ConfigError(
                "leader election needs --kube.lease-duration > --kube.renew-deadline"
                " > --kube.retry-period > 0"
            )
