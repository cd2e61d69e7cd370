"""gpupulse-remediation: flags, environment equivalents, refusing to start without authentication."""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

import pytest

from gpupulse.durations import parse_flag_duration
from remediation.cli import SERVE_FLAGS, build_parser, main, settings_from_flags
from remediation.errors import ConfigError
from remediation.settings import Settings


def _settings(argv: list[str], env: dict[str, str] | None = None) -> Settings:
    ns = build_parser().parse_args(["serve", *argv])
    return settings_from_flags(ns, env or {})


def test_serve_refuses_to_start_without_a_token(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("GPUPULSE_REMEDIATION_TOKEN", raising=False)
    monkeypatch.delenv("GPUPULSE_REMEDIATION_AUTH_TOKEN_FILE", raising=False)
    monkeypatch.delenv("GPUPULSE_REMEDIATION_INSECURE_NO_AUTH", raising=False)
    rc = main(["serve", "--storage.path", str(tmp_path), "--web.listen-address", "127.0.0.1:0"])
    assert rc == 2
    err = capsys.readouterr().err
    assert "no authentication configured" in err and "--insecure-no-auth" in err
    assert list(tmp_path.iterdir()) == []  # refused before touching storage


def test_insecure_no_auth_must_be_explicit() -> None:
    with pytest.raises(ConfigError, match="no authentication"):
        _settings([])
    assert _settings(["--insecure-no-auth"]).insecure_no_auth is True
    assert _settings([], {"GPUPULSE_REMEDIATION_INSECURE_NO_AUTH": "true"}).insecure_no_auth is True


def test_token_comes_from_the_file_or_the_environment(tmp_path: Path) -> None:
    token_file = tmp_path / "token"
    token_file.write_text("from-file\n")
    assert _settings(["--auth.token-file", str(token_file)]).auth_token == "from-file"
    assert _settings([], {"GPUPULSE_REMEDIATION_TOKEN": "from-env"}).auth_token == "from-env"
    assert _settings([], {"GPUPULSE_REMEDIATION_AUTH_TOKEN_FILE": str(token_file)}).auth_token == "from-file"
    # the file wins over the raw environment token
    both = _settings(["--auth.token-file", str(token_file)], {"GPUPULSE_REMEDIATION_TOKEN": "env"})
    assert both.auth_token == "from-file"
    # and the token never shows up in the settings' repr (logs)
    assert "from-file" not in repr(both)


def test_empty_or_missing_token_file_is_an_error(tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.write_text("\n")
    with pytest.raises(ConfigError, match="empty"):
        _settings(["--auth.token-file", str(empty)])
    with pytest.raises(ConfigError, match="token-file"):
        _settings(["--auth.token-file", str(tmp_path / "missing")])


def test_flag_wins_over_environment_which_wins_over_default() -> None:
    env = {"GPUPULSE_REMEDIATION_TOKEN": "t", "GPUPULSE_REMEDIATION_QUEUE_MAX_PENDING": "50"}
    assert _settings([], {"GPUPULSE_REMEDIATION_TOKEN": "t"}).queue_max_pending == 10_000
    assert _settings([], env).queue_max_pending == 50
    assert _settings(["--queue.max-pending", "7"], env).queue_max_pending == 7


def test_every_flag_has_an_environment_twin_named_by_the_rule() -> None:
    for flag in SERVE_FLAGS:
        expected = "GPUPULSE_REMEDIATION_" + flag.name.upper().replace(".", "_").replace("-", "_")
        assert flag.env == expected


def test_flags_reach_the_engine_settings(tmp_path: Path) -> None:
    key = tmp_path / "pd"
    key.write_text("routing-key-123")
    s = _settings(
        [
            "--insecure-no-auth",
            "--web.listen-address",
            "127.0.0.1:19836",
            "--storage.path",
            str(tmp_path),
            "--dry-run",
            "--signatures",
            "/etc/sigs",
            "--signatures",
            "/opt/a,/opt/b",
            "--backend",
            "local",
            "--backend.local.restart-command",
            "systemctl restart 'my engine'",
            "--pager",
            "pagerduty",
            "--pager.pagerduty.routing-key-file",
            str(key),
            "--safety.max-concurrent-actions",
            "1",
            "--safety.max-actions-per-minute",
            "3",
            "--safety.max-nodes-migrated",
            "2",
            "--safety.max-nodes-migrated-fraction",
            "0.25",
            "--safety.window",
            "15m",
            "--scope.namespaces",
            "serving, training",
            "--scope.opt-in-label",
            "gpupulse_io_remediate",
            "--engine.tick-interval",
            "250ms",
            "--log.format",
            "json",
        ]
    )
    assert (s.listen_host, s.listen_port) == ("127.0.0.1", 19836)
    assert s.db_path == tmp_path / "gpupulse.db"
    e = s.engine
    assert e.dry_run is True
    assert e.signature_dirs == (Path("/etc/sigs"), Path("/opt/a"), Path("/opt/b"))
    assert e.local_backend.restart_command == ("systemctl", "restart", "my engine")
    assert e.pager.kind == "pagerduty" and e.pager.pagerduty_routing_key == "routing-key-123"
    assert e.budgets.max_concurrent_actions == 1
    assert e.budgets.max_actions_per_minute == 3
    assert e.budgets.max_nodes_migrated == 2
    assert e.budgets.max_nodes_migrated_fraction == 0.25
    assert e.budgets.migrate_window_seconds == 900
    assert e.scope.namespaces == ("serving", "training")
    assert e.scope.opt_in_label == "gpupulse_io_remediate"
    assert s.engine_tick_interval_seconds == 0.25
    assert s.log_format == "json"


def test_list_flags_from_the_environment_are_comma_separated() -> None:
    s = _settings(
        ["--insecure-no-auth"],
        {"GPUPULSE_REMEDIATION_SIGNATURES": "/a,/b", "GPUPULSE_REMEDIATION_SCOPE_NAMESPACES": "x,y"},
    )
    assert s.engine.signature_dirs == (Path("/a"), Path("/b"))
    assert s.engine.scope.namespaces == ("x", "y")


@pytest.mark.parametrize(
    ("argv", "env", "message"),
    [
        (["--web.listen-address", "nonsense"], {}, "--web.listen-address"),
        (["--queue.max-pending", "many"], {}, "--queue.max-pending"),
        (
            [],
            {"GPUPULSE_REMEDIATION_ENGINE_TICK_INTERVAL": "soon"},
            "GPUPULSE_REMEDIATION_ENGINE_TICK_INTERVAL",
        ),
        (["--storage.synchronous", "OFF"], {}, "--storage.synchronous"),
        (["--backend", "ssh"], {}, "--backend"),
        (["--pager", "webhook"], {}, "--pager.url"),
        (["--web.tls-cert-file", "/c.pem"], {}, "together"),
        (["--web.tls-client-ca-file", "/ca.pem"], {}, "tls-cert-file"),
        (["--safety.max-nodes-migrated-fraction", "1.5"], {}, "fraction"),
        (["--scope.namespaces", "*,prod"], {}, "stands alone"),
    ],
)
def test_bad_values_name_the_flag_or_variable(argv: list[str], env: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError, match=message.replace(".", r"\.")):
        _settings(["--insecure-no-auth", *argv], env)


def test_no_scope_flag_is_no_namespace_and_a_star_is_every_namespace() -> None:
    default = _settings(["--insecure-no-auth"]).engine.scope
    assert default.namespaces == () and not default.allows_namespace("default")
    every = _settings(["--insecure-no-auth", "--scope.namespaces=*"]).engine.scope
    assert every.namespaces == ("*",) and every.allows_namespace("prod-payments")
    listed = _settings(["--insecure-no-auth", "--scope.namespaces=a,b"]).engine.scope
    assert listed.allows_namespace("a") and not listed.allows_namespace("c")


def test_mutual_tls_client_ca_counts_as_authentication(tmp_path: Path) -> None:
    s = _settings(
        [
            "--web.tls-cert-file",
            str(tmp_path / "c.pem"),
            "--web.tls-key-file",
            str(tmp_path / "k.pem"),
            "--web.tls-client-ca-file",
            str(tmp_path / "ca.pem"),
        ]
    )
    assert s.tls_enabled and s.auth_token == ""


def test_flag_defaults_are_the_settings_defaults() -> None:
    """With no flags and no environment, serve runs on exactly the defaults of remediation/settings.py
    (the flags write durations in their own grammar; this holds the two to one value)."""
    env = {"KUBERNETES_SERVICE_HOST": "10.0.0.1", "POD_NAME": "", "POD_NAMESPACE": ""}
    got = _settings(["--insecure-no-auth"], env)
    expected = Settings(insecure_no_auth=True)
    # the replica's name falls back to the hostname: the one default that is not a constant
    assert dataclasses.replace(got, kube=dataclasses.replace(got.kube, identity="")) == expected


def test_duration_flags_take_the_shared_grammar_from_flags_and_environment() -> None:
    s = _settings(
        ["--insecure-no-auth", "--safety.page-window=1h30m", "--engine.tick-interval=250ms"],
        {
            "GPUPULSE_REMEDIATION_STORAGE_INBOX_RETENTION": "1w",
            "GPUPULSE_REMEDIATION_LOOPS_RESTART_WINDOW": "90",
        },
    )
    assert s.engine.budgets.page_window_seconds == 5400  # compound durations were refused before
    assert s.engine_tick_interval_seconds == 0.25
    assert s.inbox_retention_seconds == 7 * 86400
    assert s.engine.loops.restart_window_seconds == 90  # a bare number is still seconds


def test_the_page_budget_of_one_signature_is_a_flag() -> None:
    s = _settings(["--insecure-no-auth", "--safety.max-pages-per-signature=5"])
    assert s.engine.budgets.max_pages_per_signature == 5
    with pytest.raises(ConfigError, match=r"max_pages_per_signature must be positive"):
        _settings(["--insecure-no-auth", "--safety.max-pages-per-signature=0"])


@pytest.mark.parametrize("bad", ["1.5h", "1s1m", "5 minutes", "-1s"])
def test_bad_duration_flags_name_the_flag(bad: str) -> None:
    with pytest.raises(ConfigError, match=r"--safety\.page-window"):
        _settings(["--insecure-no-auth", f"--safety.page-window={bad}"])


def test_duration_defaults_are_written_in_the_grammar() -> None:
    for flag in SERVE_FLAGS:
        if flag.parse is parse_flag_duration:
            assert parse_flag_duration(str(flag.default)) >= 0, flag.name


def test_help_lists_the_environment_variables(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["serve", "--help"])
    out = capsys.readouterr().out
    assert "--web.listen-address" in out and "GPUPULSE_REMEDIATION_WEB_LISTEN_ADDRESS" in out


def test_parser_has_serve() -> None:
    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    assert "serve" in sub.choices


def test_signatures_subcommand_is_delegated_when_the_engine_ships_it(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import importlib

    real_import = importlib.import_module
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    assert "signatures" in sub.choices

    def no_signatures_cli(name: str, package: str | None = None) -> object:
        if name == "remediation.signatures_cli":
            raise ImportError(name)
        return real_import(name, package)

    monkeypatch.setattr(importlib, "import_module", no_signatures_cli)
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    # absent module: skipped, serve and the rest still work
    assert set(sub.choices) == {"serve", "incidents", "pause", "resume", "status", "breaker"}


def test_the_diagnosis_window_is_a_flag_and_reaches_the_diagnoser() -> None:
    from gpupulse.clock import SystemClock
    from remediation.engine import diagnoser_from_settings

    s = _settings(
        [
            "--insecure-no-auth",
            "--diagnosis.prometheus-url=http://127.0.0.1:9",
            "--diagnosis.lookback=2m",
            "--diagnosis.step=1s",
        ]
    )
    diagnoser = diagnoser_from_settings(s.engine, SystemClock())
    assert diagnoser is not None
    assert (diagnoser.settings.lookback_seconds, diagnoser.settings.step_seconds) == (120, 1)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--diagnosis.step=100ms"], r"lookback=40m at --diagnosis\.step=100ms reads 24000 points"),
        (["--diagnosis.lookback=1d", "--diagnosis.step=5s"], r"17280 points per series; Prometheus answers"),
        (["--diagnosis.step=0"], r"diagnosis\.step_seconds must be positive"),
        (["--diagnosis.lookback=soon"], r"--diagnosis\.lookback"),
    ],
)
def test_a_diagnosis_window_prometheus_refuses_is_refused_at_start(argv: list[str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        _settings(["--insecure-no-auth", *argv])


def test_node_actions_are_on_unless_scope_nodes_says_false() -> None:
    assert _settings(["--insecure-no-auth"]).engine.scope.nodes is True
    assert _settings(["--insecure-no-auth", "--scope.nodes=false"]).engine.scope.nodes is False
    off = _settings(["--insecure-no-auth"], {"GPUPULSE_REMEDIATION_SCOPE_NODES": "false"})
    assert off.engine.scope.nodes is False
    with pytest.raises(ConfigError, match=r"--scope.nodes: not a boolean: 'maybe'"):
        _settings(["--insecure-no-auth", "--scope.nodes=maybe"])
