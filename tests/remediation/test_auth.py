"""Receiver authentication settings fail as configuration errors, never as tracebacks."""

from __future__ import annotations

from pathlib import Path

import pytest

from remediation.auth import TokenAuth, build_ssl_context, load_token
from remediation.config import ConfigError


@pytest.mark.parametrize(
    ("cert", "key"),
    [
        ("not a certificate", "not a key"),  # garbage in both
        (None, "whatever"),  # the certificate file does not exist
        ("", ""),  # empty files
    ],
    ids=["garbage", "missing", "empty"],
)
def test_bad_tls_certificate_or_key_files_are_a_clear_configuration_error(
    tmp_path: Path, cert: str | None, key: str
) -> None:
    cert_file, key_file = tmp_path / "tls.crt", tmp_path / "tls.key"
    if cert is not None:
        cert_file.write_text(cert)
    key_file.write_text(key)
    with pytest.raises(ConfigError, match="TLS files"):
        build_ssl_context(cert_file, key_file, None)


def test_a_bad_client_ca_file_is_a_configuration_error(tmp_path: Path) -> None:
    ca = tmp_path / "ca.pem"
    ca.write_text("-----BEGIN CERTIFICATE-----\nbm90IGEgY2VydA==\n-----END CERTIFICATE-----\n")
    with pytest.raises(ConfigError, match="TLS files"):
        build_ssl_context(tmp_path / "missing.crt", tmp_path / "missing.key", ca)


def test_token_file_problems_are_configuration_errors(tmp_path: Path) -> None:
    (tmp_path / "t").write_text("  \n")
    with pytest.raises(ConfigError, match="is empty"):
        load_token(tmp_path / "t")
    with pytest.raises(ConfigError, match=r"--auth\.token-file"):
        load_token(tmp_path / "absent")
    assert load_token(None, {"GPUPULSE_REMEDIATION_TOKEN": " s3cret \n"}) == "s3cret"


def test_only_the_bearer_scheme_with_the_exact_token_passes() -> None:
    auth = TokenAuth("s3cret")
    assert auth.check("Bearer s3cret") and auth.check("bearer s3cret")
    for header in (None, "", "Bearer", "Bearer s3cre", "Basic s3cret", "Bearer s3cret2"):
        assert not auth.check(header), header
    assert TokenAuth("").check(None)  # no token configured: authentication is off
