"""`gpupulse-remediation`: the controller's command line (node_exporter-style flags, env equivalents).

Every flag `--a.b-c` can also be set as GPUPULSE_REMEDIATION_A_B_C (upper case, "." and "-" become
"_"); a flag on the command line wins over the environment, which wins over the default. The bearer
token itself may come from GPUPULSE_REMEDIATION_TOKEN instead of --auth.token-file.

Longer than our ~500-line mark on purpose: about 230 lines are the SERVE_FLAGS table (data: one entry
per flag, its default read from remediation/settings.py) that the parser, the environment twins, the
help and the chart tests all read. The Kubernetes wiring lives in remediation/kube/serve.py.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import importlib
import inspect
import logging
import os
import shlex
import socket
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

from gpupulse.cliargs import Parser
from gpupulse.clock import SystemClock
from gpupulse.durations import format_duration, parse_flag_duration
from gpupulse.logs import FORMATS, LEVELS, setup_logging
from gpupulse.version import package_version
from remediation.diagnosis.prom import MAX_POINTS
from remediation.errors import ConfigError, StoreError

from .auth import load_token
from .metrics import RemediationMetrics
from .model import Engine
from .settings import DEFAULT_LISTEN_HOST, EngineSettings, KubeSettings, Settings

ENV_PREFIX = "GPUPULSE_REMEDIATION_"
PROG = "gpupulse-remediation"

log = logging.getLogger(__name__)


def parse_bool(text: str) -> bool:
    low = text.strip().lower()
    if low in ("1", "true", "yes", "on"):
        return True
    if low in ("0", "false", "no", "off", ""):
        return False
    raise ValueError(f"not a boolean: {text!r}")


def parse_list(text: str) -> tuple[str, ...]:
    return tuple(p.strip() for p in text.split(",") if p.strip())


def parse_listen_address(text: str) -> tuple[str, int]:
    """'HOST:PORT', '[::1]:PORT' or ':PORT' (all interfaces)."""
    host, sep, port = text.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"not HOST:PORT: {text!r}")
    host = host.strip("[]") or DEFAULT_LISTEN_HOST
    return host, int(port)


@dataclass(frozen=True)
class Flag:
    """One serve flag: its name, how to parse a string, its default, and its help."""

    name: str
    parse: Callable[[str], Any]
    default: Any
    help: str
    boolean: bool = False
    choices: tuple[str, ...] = ()

    @property
    def dest(self) -> str:
        return self.name.replace(".", "_").replace("-", "_")

    @property
    def env(self) -> str:
        return ENV_PREFIX + self.dest.upper()


# flag defaults are the settings' defaults (remediation/settings.py), durations written in the flag
# grammar (gpupulse.durations); test_flag_defaults_are_the_settings_defaults holds the two to one value
_S, _K, _E = Settings(), KubeSettings(), EngineSettings()
SERVE_FLAGS: tuple[Flag, ...] = (
    Flag("web.listen-address", str, f"{_S.listen_host}:{_S.listen_port}", "HOST:PORT to listen on."),
    Flag("auth.token-file", str, "", "File holding the bearer token webhook and API clients must send."),
    Flag(
        "insecure-no-auth",
        parse_bool,
        False,
        "Serve without any authentication (tests, demos).",
        boolean=True,
    ),
    Flag("web.tls-cert-file", str, "", "Server certificate (PEM); enables HTTPS."),
    Flag("web.tls-key-file", str, "", "Server private key (PEM)."),
    Flag(
        "web.tls-client-ca-file",
        str,
        "",
        "CA bundle; when set, clients must present a certificate it signed.",
    ),
    Flag("web.max-body-bytes", int, _S.max_body_bytes, "Largest webhook body accepted (larger → 413)."),
    Flag(
        "web.read-header-timeout",
        parse_flag_duration,
        format_duration(_S.web_read_header_timeout_seconds),
        "A request head must be complete this long after its first byte (else 408 and close).",
    ),
    Flag(
        "web.read-body-timeout",
        parse_flag_duration,
        format_duration(_S.web_read_body_timeout_seconds),
        "Longest time to receive a request body (408).",
    ),
    Flag("storage.path", str, str(_S.storage_path), "Directory of the controller's SQLite database."),
    Flag(
        "storage.synchronous",
        str.upper,
        _S.storage_synchronous,
        "SQLite synchronous mode.",
        choices=("FULL", "NORMAL"),
    ),
    Flag(
        "storage.inbox-retention",
        parse_flag_duration,
        format_duration(_S.inbox_retention_seconds),
        "How long processed alerts stay in the inbox.",
    ),
    Flag(
        "storage.on-corrupt",
        str,
        _S.storage_on_corrupt,
        "A corrupt inbox: refuse to start, or set it aside and start empty (the loss is logged and counted).",
        choices=("refuse", "recreate"),
    ),
    Flag(
        "storage.accept-new-inbox",
        parse_bool,
        False,
        "Pair the ledger with an inbox other than the one it remembers (after replacing it on purpose).",
        boolean=True,
    ),
    Flag(
        "queue.max-pending", int, _S.queue_max_pending, "Unprocessed alerts before the webhook answers 503."
    ),
    Flag(
        "engine.tick-interval",
        parse_flag_duration,
        format_duration(_S.engine_tick_interval_seconds),
        "How often the engine's timers advance.",
    ),
    Flag(
        "engine.handle-timeout",
        parse_flag_duration,
        format_duration(_S.engine_handle_timeout_seconds),
        "Longest one engine.handle call may take.",
    ),
    Flag(
        "engine.max-event-age",
        parse_flag_duration,
        format_duration(_E.max_event_age_seconds),
        "Evidence older than this never acts: alerts processed this long after arrival, and open "
        "incidents after the controller did not watch for this long, until a fresh notification.",
    ),
    Flag(
        "engine.return-to-service",
        parse_bool,
        False,
        "When the alert of a GPU quarantined by a DeviceTaintRule resolves, run the backend's validation "
        "and lift the quarantine only on a pass (docs/design/device-quarantine.md).",
        boolean=True,
    ),
    Flag(
        "engine.return-to-service-timeout",
        parse_flag_duration,
        format_duration(_E.return_to_service_timeout_seconds),
        "Longest one validation may take before it is asked again.",
    ),
    Flag("dry-run", parse_bool, False, "Decide and record, never act or page.", boolean=True),
    Flag("signatures", parse_list, "", "Extra signature directories (comma-separated; flag repeatable)."),
    Flag("backend", str, _E.backend, "Action backend.", choices=("local", "kubernetes", "none")),
    Flag(
        "backend.local.restart-command",
        shlex.split,
        "",
        "Restart argv (split like a shell, run without one).",
    ),
    Flag(
        "backend.local.migrate-command",
        shlex.split,
        "",
        "Migrate argv (split like a shell, run without one).",
    ),
    Flag(
        "backend.local.timeout",
        parse_flag_duration,
        format_duration(_E.local_backend.timeout_seconds),
        "Local command timeout.",
    ),
    Flag("backend.local.pidfile", str, "", "PID file signalled on restart when no restart command is set."),
    Flag("pager", str, _E.pager.kind, "Where pages go.", choices=("webhook", "pagerduty", "slack", "none")),
    Flag("pager.url", str, "", "Generic or Slack-compatible webhook URL."),
    Flag("pager.url-file", str, "", "File holding the pager URL (it is a secret)."),
    Flag("pager.pagerduty.routing-key-file", str, "", "File holding the PagerDuty Events v2 routing key."),
    Flag("pager.pagerduty.url", str, _E.pager.pagerduty_url, "PagerDuty Events v2 endpoint."),
    Flag(
        "safety.max-concurrent-actions", int, _E.budgets.max_concurrent_actions, "Actions in flight at once."
    ),
    Flag(
        "safety.max-actions-per-minute", int, _E.budgets.max_actions_per_minute, "Actions started per minute."
    ),
    Flag(
        "safety.max-nodes-migrated", int, _E.budgets.max_nodes_migrated, "Nodes migrated within the window."
    ),
    Flag(
        "safety.max-nodes-migrated-fraction",
        float,
        _E.budgets.max_nodes_migrated_fraction,
        "Nodes migrated within the window, as a fraction of known nodes (0 disables).",
    ),
    Flag(
        "safety.window",
        parse_flag_duration,
        format_duration(_E.budgets.migrate_window_seconds),
        "Window of the node budgets.",
    ),
    Flag(
        "safety.max-pages-per-signature",
        int,
        _E.budgets.max_pages_per_signature,
        "Incidents of one signature paged one by one within the page window; beyond, one summary page.",
    ),
    Flag(
        "safety.max-pages-per-window",
        int,
        _E.budgets.max_pages_per_window,
        "Incidents paged one by one within the page window; beyond, one summary page per signature.",
    ),
    Flag(
        "safety.page-window",
        parse_flag_duration,
        format_duration(_E.budgets.page_window_seconds),
        "Window of the page budget.",
    ),
    Flag(
        "web.external-url",
        str,
        _E.external_url,
        "URL operators reach this controller at (links in summary pages).",
    ),
    Flag(
        "scope.namespaces",
        parse_list,
        "",
        "Namespaces whose pods and jobs the controller may act on (comma-separated). Empty = none, "
        "but GPU and node targets still act (see --scope.nodes). '*' = every namespace.",
    ),
    Flag(
        "scope.nodes",
        parse_bool,
        _E.scope.nodes,
        "Act on nodes: migrate cordons and taints a node and evicts every pod on it, whatever its "
        "namespace. false: GPU and node targets are out of scope and pod and job ladders skip migrate; "
        "with an empty --scope.namespaces too, nothing is acted on.",
    ),
    Flag(
        "scope.routing-namespaces",
        parse_list,
        "",
        "Namespaces that GPU, node and exporter alerts carry only to be routed (the chart's own, for "
        "prometheus-operator's OnNamespace matcher): not checked against --scope.namespaces.",
    ),
    Flag(
        "scope.node-selector",
        str,
        _E.scope.node_selector,
        "Label selector on the Node of GPU and node targets (e.g. nodepool=inference); needs "
        "--backend=kubernetes.",
    ),
    Flag(
        "scope.off-scope",
        str,
        _E.scope.off_scope,
        "What an out-of-scope alert becomes: ignore (recorded only) or page.",
        choices=("ignore", "page"),
    ),
    Flag(
        "scope.opt-in-label",
        str,
        _E.scope.opt_in_label,
        'Label an alert must carry as "true" to be acted on.',
    ),
    Flag(
        "loops.max-restarts",
        int,
        _E.loops.max_restarts,
        "Restarts of one target within the window before paging.",
    ),
    Flag(
        "loops.restart-window",
        parse_flag_duration,
        format_duration(_E.loops.restart_window_seconds),
        "Restart loop window.",
    ),
    Flag("cluster.node-count", int, _E.cluster_node_count, "Nodes in the cluster (for the fraction budget)."),
    Flag("verify.prometheus-url", str, _E.prometheus_url, "Prometheus base URL for PromQL verification."),
    Flag(
        "diagnosis.disabled",
        parse_bool,
        not _E.diagnosis.enabled,
        "Do not diagnose incidents (which layer changed when the symptom began).",
        boolean=True,
    ),
    Flag(
        "diagnosis.prometheus-url",
        str,
        _E.diagnosis.prometheus_url,
        "Prometheus the diagnosis reads (default: --verify.prometheus-url).",
    ),
    Flag(
        "diagnosis.wait",
        parse_flag_duration,
        format_duration(_E.diagnosis.wait_seconds),
        "How long an incident that may act waits for its diagnosis before the first action.",
    ),
    Flag(
        "diagnosis.deadline",
        parse_flag_duration,
        format_duration(_E.diagnosis.deadline_seconds),
        "Deadline of one diagnosis, all its queries together.",
    ),
    Flag(
        "diagnosis.lookback",
        parse_flag_duration,
        format_duration(_E.diagnosis.lookback_seconds),
        "History a diagnosis reads before the alert fired (at least the baseline its signals need).",
    ),
    Flag(
        "diagnosis.step",
        parse_flag_duration,
        format_duration(_E.diagnosis.step_seconds),
        "Resolution of the series a diagnosis reads (no finer than the scrape interval).",
    ),
    Flag(
        "diagnosis.dashboard-url",
        str,
        _E.diagnosis.dashboard_url,
        "Grafana dashboard URL for the page's link over the onset window.",
    ),
    Flag(
        "otlp.traces-endpoint", str, _E.otlp_traces_endpoint, "OTLP/HTTP traces endpoint; empty = no export."
    ),
    Flag(
        "kube.kubeconfig",
        str,
        "",
        "Kubeconfig for --backend=kubernetes (default: the service account in a cluster, else $KUBECONFIG).",
    ),
    Flag("kube.context", str, "", "Kubeconfig context (default: the current one)."),
    Flag(
        "kube.namespace",
        str,
        "",
        "The controller's namespace, where its Leases live (default $POD_NAMESPACE).",
    ),
    Flag(
        "kube.identity",
        str,
        "",
        "This replica's name, the Lease holder (default $POD_NAME, else the hostname).",
    ),
    Flag(
        "kube.request-timeout",
        parse_flag_duration,
        format_duration(_K.request_timeout_seconds),
        "Timeout of one Kubernetes API request.",
    ),
    Flag(
        "kube.leader-election",
        parse_bool,
        False,
        "Elect a leader on a Lease; only the leader acts. Required whenever replicas may overlap.",
        boolean=True,
    ),
    Flag("kube.lease-name", str, _K.lease_name, "Name of the leader Lease (the chart: one per release)."),
    Flag(
        "kube.legacy-lease-name",
        str,
        _K.legacy_lease_name,
        "A leader Lease an earlier version used: held too, and no leading while a replica of this"
        " release (--kube.legacy-lease-holder-prefix) holds it, so a rolling upgrade never has two leaders.",
    ),
    Flag(
        "kube.legacy-lease-holder-prefix",
        str,
        _K.legacy_lease_holder_prefix,
        "Pod-name prefix of this release's replicas: a holder of the legacy Lease without it is another"
        " release's, never waited on ('' = every holder is waited on).",
    ),
    Flag(
        "kube.instance",
        str,
        _K.instance,
        "The release this controller belongs to: labels and names its GpuIncident objects, so releases"
        " in one namespace share none ('' = the unlabelled names of earlier versions).",
    ),
    Flag(
        "kube.lease-duration",
        parse_flag_duration,
        format_duration(_K.lease_duration_seconds),
        "Leader Lease duration (whole seconds).",
    ),
    Flag(
        "kube.renew-deadline",
        parse_flag_duration,
        format_duration(_K.renew_deadline_seconds),
        "The leader steps down when it has not renewed for this long.",
    ),
    Flag(
        "kube.retry-period",
        parse_flag_duration,
        format_duration(_K.retry_period_seconds),
        "How often candidates try and the leader renews.",
    ),
    Flag(
        "kube.backend-config",
        str,
        "",
        "YAML mapping of Kubernetes backend settings (eviction deadline, PDB policy, ...).",
    ),
    Flag(
        "kube.ledger",
        str,
        _K.ledger,
        "Where incidents live: sqlite (local file) or kubernetes (GpuIncident objects; no shared volume).",
        choices=("sqlite", "kubernetes"),
    ),
    Flag("kube.incident-keep", int, _K.incident_keep, "Closed GpuIncident objects kept at most."),
    Flag(
        "kube.incident-retention",
        parse_flag_duration,
        format_duration(_K.incident_retention_seconds),
        "Closed GpuIncident objects older than this are deleted.",
    ),
    Flag(
        "kube.incident-status-interval",
        parse_flag_duration,
        format_duration(_K.incident_status_interval_seconds),
        "At most one GpuIncident status write per incident per interval for decisions with no effects.",
    ),
    Flag("log.format", str, _S.log_format, "Log format.", choices=FORMATS),
    Flag("log.level", str.lower, _S.log_level, "Log level.", choices=LEVELS),
)


def add_serve_flags(parser: argparse.ArgumentParser) -> None:
    """Register every serve flag; defaults stay None so env and defaults can be layered later."""
    for f in SERVE_FLAGS:
        env_note = f" [env {f.env}]"
        if f.boolean:
            parser.add_argument(
                f"--{f.name}", dest=f.dest, action="store_const", const=True, help=f.help + env_note
            )
        elif f.name == "signatures":
            parser.add_argument(
                f"--{f.name}", dest=f.dest, action="append", metavar="DIR", help=f.help + env_note
            )
        else:
            default = f" (default {f.default})" if f.default not in ("", None) else ""
            parser.add_argument(
                f"--{f.name}",
                dest=f.dest,
                metavar=f.name.rsplit(".", 1)[-1].upper().replace("-", "_"),
                help=f.help + (f" One of {', '.join(f.choices)}." if f.choices else "") + default + env_note,
            )


def resolve_flags(ns: argparse.Namespace, environ: Mapping[str, str]) -> dict[str, Any]:
    """Flag value, else environment, else default; every value parsed. Raises ConfigError naming the flag."""
    values: dict[str, Any] = {}
    for f in SERVE_FLAGS:
        raw = getattr(ns, f.dest, None)
        source = f"--{f.name}"
        if raw is None and f.env in environ:
            raw, source = environ[f.env], f.env
        if raw is None:
            raw, source = f.default, "default"
        try:
            if f.name == "signatures" and isinstance(raw, list):
                value: Any = tuple(d for item in raw for d in parse_list(item))
            elif isinstance(raw, str):
                if f.choices and f.parse(raw) not in f.choices:
                    raise ValueError(f"must be one of {', '.join(f.choices)}")
                value = f.parse(raw)
            else:
                value = raw
        except ValueError as e:
            raise ConfigError(f"{source}: {e}") from e
        values[f.dest] = value
    return values


def _read_secret(path: str, flag: str) -> str:
    try:
        text = Path(path).read_text(encoding="utf-8").strip()
    except OSError as e:
        raise ConfigError(f"--{flag} {path}: {e}") from e
    if not text:
        raise ConfigError(f"--{flag} {path} is empty")
    return text


def _path_or_none(text: str) -> Path | None:
    return Path(text) if text else None


def settings_from_flags(ns: argparse.Namespace, environ: Mapping[str, str] | None = None) -> Settings:
    """Build and validate Settings from parsed flags and the environment."""
    env = os.environ if environ is None else environ
    v = resolve_flags(ns, env)
    try:
        host, port = parse_listen_address(v["web_listen_address"])
    except ValueError as err:
        raise ConfigError(f"--web.listen-address: {err}") from err
    token_file = _path_or_none(v["auth_token_file"])
    base = EngineSettings()
    pager_url = _read_secret(v["pager_url_file"], "pager.url-file") if v["pager_url_file"] else v["pager_url"]
    routing_key = ""
    if v["pager_pagerduty_routing_key_file"]:
        routing_key = _read_secret(v["pager_pagerduty_routing_key_file"], "pager.pagerduty.routing-key-file")
    engine = dataclasses.replace(
        base,
        dry_run=v["dry_run"],
        max_event_age_seconds=v["engine_max_event_age"],
        return_to_service=v["engine_return_to_service"],
        return_to_service_timeout_seconds=v["engine_return_to_service_timeout"],
        signature_dirs=tuple(Path(d) for d in v["signatures"]),
        backend=v["backend"],
        local_backend=dataclasses.replace(
            base.local_backend,
            restart_command=tuple(v["backend_local_restart_command"]),
            migrate_command=tuple(v["backend_local_migrate_command"]),
            timeout_seconds=v["backend_local_timeout"],
            pidfile=_path_or_none(v["backend_local_pidfile"]),
        ),
        pager=dataclasses.replace(
            base.pager,
            kind=v["pager"],
            url=pager_url,
            pagerduty_routing_key=routing_key,
            pagerduty_url=v["pager_pagerduty_url"],
        ),
        budgets=dataclasses.replace(
            base.budgets,
            max_concurrent_actions=v["safety_max_concurrent_actions"],
            max_actions_per_minute=v["safety_max_actions_per_minute"],
            max_nodes_migrated=v["safety_max_nodes_migrated"],
            max_nodes_migrated_fraction=v["safety_max_nodes_migrated_fraction"],
            migrate_window_seconds=v["safety_window"],
            max_pages_per_signature=v["safety_max_pages_per_signature"],
            max_pages_per_window=v["safety_max_pages_per_window"],
            page_window_seconds=v["safety_page_window"],
        ),
        external_url=v["web_external_url"],
        loops=dataclasses.replace(
            base.loops, max_restarts=v["loops_max_restarts"], restart_window_seconds=v["loops_restart_window"]
        ),
        scope=dataclasses.replace(
            base.scope,
            namespaces=v["scope_namespaces"],
            nodes=v["scope_nodes"],
            routing_namespaces=v["scope_routing_namespaces"],
            opt_in_label=v["scope_opt_in_label"],
            node_selector=v["scope_node_selector"],
            off_scope=v["scope_off_scope"],
        ),
        cluster_node_count=v["cluster_node_count"],
        prometheus_url=v["verify_prometheus_url"],
        otlp_traces_endpoint=v["otlp_traces_endpoint"],
        diagnosis=dataclasses.replace(
            base.diagnosis,
            enabled=not v["diagnosis_disabled"],
            prometheus_url=v["diagnosis_prometheus_url"],
            wait_seconds=v["diagnosis_wait"],
            deadline_seconds=v["diagnosis_deadline"],
            lookback_seconds=v["diagnosis_lookback"],
            step_seconds=v["diagnosis_step"],
            dashboard_url=v["diagnosis_dashboard_url"],
        ),
    )
    settings = Settings(
        kube=kube_settings_from_values(v, env),
        listen_host=host,
        listen_port=port,
        auth_token_file=token_file,
        auth_token=load_token(token_file, env),
        insecure_no_auth=v["insecure_no_auth"],
        tls_cert_file=_path_or_none(v["web_tls_cert_file"]),
        tls_key_file=_path_or_none(v["web_tls_key_file"]),
        tls_client_ca_file=_path_or_none(v["web_tls_client_ca_file"]),
        max_body_bytes=v["web_max_body_bytes"],
        web_read_header_timeout_seconds=v["web_read_header_timeout"],
        web_read_body_timeout_seconds=v["web_read_body_timeout"],
        storage_path=Path(v["storage_path"]),
        storage_synchronous=v["storage_synchronous"],
        storage_on_corrupt=v["storage_on_corrupt"],
        storage_accept_new_inbox=v["storage_accept_new_inbox"],
        inbox_retention_seconds=v["storage_inbox_retention"],
        queue_max_pending=v["queue_max_pending"],
        engine_tick_interval_seconds=v["engine_tick_interval"],
        engine_handle_timeout_seconds=v["engine_handle_timeout"],
        engine=engine,
        log_format=v["log_format"],
        log_level=v["log_level"],
    )
    settings.validate()
    _check_diagnosis_range(engine.diagnosis.lookback_seconds, engine.diagnosis.step_seconds)
    return settings


def _check_diagnosis_range(lookback_seconds: float, step_seconds: float) -> None:
    """Refuse a lookback and step whose range queries Prometheus would refuse (every diagnosis would
    then end "no diagnosis"), at start rather than per incident."""
    points = lookback_seconds / step_seconds if step_seconds > 0 else float("inf")
    if points >= MAX_POINTS:
        raise ConfigError(
            f"--diagnosis.lookback={format_duration(lookback_seconds)} at "
            f"--diagnosis.step={format_duration(step_seconds)} reads {points:.0f} points per series; "
            f"Prometheus answers at most {MAX_POINTS} (a longer step or a shorter lookback)"
        )


def default_kubeconfig(environ: Mapping[str, str]) -> str:
    """'' (in-cluster service account) inside a pod, else $KUBECONFIG's first file or ~/.kube/config."""
    if environ.get("KUBERNETES_SERVICE_HOST"):
        return ""
    listed = [p for p in environ.get("KUBECONFIG", "").split(os.pathsep) if p]
    return listed[0] if listed else str(Path.home() / ".kube" / "config")


def kube_settings_from_values(v: Mapping[str, Any], environ: Mapping[str, str]) -> KubeSettings:
    """The kube.* flags, with the Downward-API environment (POD_NAMESPACE, POD_NAME) as defaults."""
    duration = v["kube_lease_duration"]
    if duration != int(duration) or duration < 1:
        raise ConfigError(f"--kube.lease-duration must be whole seconds, not {duration}")
    if v["kube_legacy_lease_name"] and v["kube_legacy_lease_name"] == v["kube_lease_name"]:
        raise ConfigError(
            f"--kube.legacy-lease-name must differ from --kube.lease-name ({v['kube_lease_name']})"
        )
    return KubeSettings(
        kubeconfig_path=v["kube_kubeconfig"] or default_kubeconfig(environ),
        context=v["kube_context"],
        namespace=v["kube_namespace"] or environ.get("POD_NAMESPACE", ""),
        identity=v["kube_identity"] or environ.get("POD_NAME", "") or socket.gethostname(),
        request_timeout_seconds=v["kube_request_timeout"],
        leader_election=v["kube_leader_election"],
        lease_name=v["kube_lease_name"],
        legacy_lease_name=v["kube_legacy_lease_name"],
        legacy_lease_holder_prefix=v["kube_legacy_lease_holder_prefix"],
        lease_duration_seconds=int(duration),
        renew_deadline_seconds=v["kube_renew_deadline"],
        retry_period_seconds=v["kube_retry_period"],
        backend_config_file=_path_or_none(v["kube_backend_config"]),
        ledger=v["kube_ledger"],
        incident_keep=v["kube_incident_keep"],
        incident_retention_seconds=v["kube_incident_retention"],
        incident_status_interval_seconds=v["kube_incident_status_interval"],
        instance=v["kube_instance"],
    )


async def build_default_engine(settings: Settings, metrics: RemediationMetrics) -> Engine:
    """The ladder engine from remediation/engine.py (imported lazily: it pulls in the backends)."""
    engine_mod = importlib.import_module("remediation.engine")
    try:
        # build_engine opens the ledger and recovers interrupted actions: blocking, so off the loop
        built = await asyncio.to_thread(
            engine_mod.build_engine, settings.engine, settings.db_path, metrics, SystemClock()
        )
    except ValueError as e:  # invalid engine settings or signature files
        raise ConfigError(str(e)) from e
    if inspect.isawaitable(built):
        built = await built
    return cast(Engine, built)


def build_parser() -> argparse.ArgumentParser:
    """The full parser: serve, plus `signatures` when the engine ships its sub-commands."""
    parser = Parser(prog=PROG, description="GPU fault remediation controller.")
    parser.add_argument("--version", action="version", version=f"{PROG} {package_version()}")
    sub = parser.add_subparsers(dest="command", required=True)
    serve = sub.add_parser("serve", help="Run the controller (webhook intake, engine, API).")
    add_serve_flags(serve)
    try:
        signatures_cli = importlib.import_module("remediation.signatures_cli")
    except ImportError:
        signatures_cli = None
    if signatures_cli is not None:
        signatures_cli.register(sub)
    importlib.import_module("remediation.incidents_cli").register(sub)
    importlib.import_module("remediation.control_cli").register(sub)
    return parser


def run_serve(ns: argparse.Namespace, environ: Mapping[str, str] | None = None) -> int:
    """`serve`: validate settings, then run until SIGTERM/SIGINT."""
    from remediation.errors import LeadershipLost

    from .kube.serve import serve_kubernetes
    from .server import serve

    try:
        settings = settings_from_flags(ns, environ)
    except ConfigError as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return 2
    setup_logging(settings.log_format, settings.log_level)
    if settings.insecure_no_auth and not settings.auth_token:
        log.warning(
            "authentication is OFF (--insecure-no-auth): anyone who can reach the port can post alerts"
        )
    try:
        if settings.engine.backend == "kubernetes":
            asyncio.run(serve_kubernetes(settings))
        else:
            asyncio.run(serve(settings, build_default_engine))
    except LeadershipLost as e:
        print(f"{PROG}: {e}", file=sys.stderr)
        return 1
    except ConfigError as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return 2
    except (OSError, StoreError) as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return 1
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Console entry point."""
    parser = build_parser()
    ns = parser.parse_args(argv)
    if ns.command == "serve":
        return run_serve(ns)
    func = getattr(ns, "func", None)
    if func is None:
        parser.print_help()
        return 2
    result = func(ns)
    return int(result or 0)
