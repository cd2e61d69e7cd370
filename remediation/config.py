"""Settings of the remediation controller: one typed place where every default lives."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

BackendKind = Literal["local", "kubernetes"]
PagerKind = Literal["webhook", "pagerduty", "slack", "none"]
LogFormat = Literal["logfmt", "json"]
SyncMode = Literal["FULL", "NORMAL"]

DEFAULT_LISTEN_HOST = "0.0.0.0"
# 9836: next to the common GPU exporter ports; documented in docs/design/remediation-intake.md
DEFAULT_LISTEN_PORT = 9836
DEFAULT_MAX_BODY_BYTES = 1024 * 1024
DB_FILENAME = "gpupulse.db"


class ConfigError(Exception):
    """A setting is missing, contradictory or unreadable; the service refuses to start."""


@dataclass(frozen=True)
class PagerSettings:
    """Where pages go (one pager per controller)."""

    kind: PagerKind = "none"
    webhook_url: str = ""
    pagerduty_routing_key: str = field(default="", repr=False)
    pagerduty_url: str = "https://events.pagerduty.com/v2/enqueue"
    slack_webhook_url: str = field(default="", repr=False)
    timeout_seconds: float = 10.0


@dataclass(frozen=True)
class SafetySettings:
    """Global budgets; beyond them the breaker opens and everything pages."""

    max_concurrent_actions: int = 2
    max_actions_per_minute: int = 10
    max_nodes_migrated: int = 2
    max_nodes_migrated_fraction: float = 0.1
    window_seconds: float = 600.0


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
    storage_path: Path = Path("/var/lib/gpupulse-remediation")
    storage_synchronous: SyncMode = "FULL"
    storage_timeout_seconds: float = 5.0
    inbox_retention_seconds: float = 7 * 24 * 3600.0
    queue_max_pending: int = 10_000
    engine_tick_interval_seconds: float = 1.0
    engine_handle_timeout_seconds: float = 60.0
    worker_retry_initial_seconds: float = 1.0
    worker_retry_max_seconds: float = 300.0
    dry_run: bool = False
    signature_dirs: tuple[Path, ...] = ()
    backend: BackendKind = "local"
    backend_local_restart_command: str = ""
    backend_local_migrate_command: str = ""
    pager: PagerSettings = field(default_factory=PagerSettings)
    safety: SafetySettings = field(default_factory=SafetySettings)
    scope_namespaces: tuple[str, ...] = ()
    scope_opt_in_label: str = ""
    log_format: LogFormat = "logfmt"
    log_level: str = "info"
    shutdown_grace_seconds: float = 10.0

    @property
    def db_path(self) -> Path:
        """The one SQLite file the intake and the engine share."""
        return self.storage_path / DB_FILENAME

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
        if self.queue_max_pending < 1:
            raise ConfigError("--queue.max-pending must be at least 1")
        if self.engine_tick_interval_seconds <= 0:
            raise ConfigError("--engine.tick-interval must be positive")
        if not 0.0 <= self.safety.max_nodes_migrated_fraction <= 1.0:
            raise ConfigError("--safety.max-nodes-migrated-fraction must be within [0, 1]")
        if self.pager.kind == "webhook" and not self.pager.webhook_url:
            raise ConfigError("--pager=webhook needs --pager.webhook.url")
        if self.pager.kind == "pagerduty" and not self.pager.pagerduty_routing_key:
            raise ConfigError("--pager=pagerduty needs --pager.pagerduty.routing-key-file")
        if self.pager.kind == "slack" and not self.pager.slack_webhook_url:
            raise ConfigError("--pager=slack needs --pager.slack.webhook-url-file")
