"""Receiver authentication: the token check, the middleware's answers, and TLS settings that fail as
configuration errors, never as tracebacks."""

from __future__ import annotations

import shutil
import ssl
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web

from remediation.auth import PUBLIC_PATHS, TokenAuth, auth_middleware, build_ssl_context, load_token
from remediation.errors import ConfigError


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
    for header in (None, "", "Bearer", "Bearer s3cre", "Basic s3cret", "Token s3cret", "Bearer s3cret2"):
        assert not auth.check(header), header
    assert TokenAuth("").check(None)  # no token configured: authentication is off


def test_auth_is_enabled_exactly_when_a_token_is_set() -> None:
    # the startup log reports "token" or "OFF" from this
    assert TokenAuth("s3cret").enabled is True
    assert TokenAuth("").enabled is False


class _Site:
    """A one-route app behind the auth middleware, on a free 127.0.0.1 port."""

    def __init__(self, auth: TokenAuth, record_rejects: bool) -> None:
        self.rejected: list[str] = []
        self.records = record_rejects
        on_reject = (lambda request: self.rejected.append(request.path)) if record_rejects else None
        self.app = web.Application(middlewares=[auth_middleware(auth, on_reject)])

        async def ok(request: web.Request) -> web.Response:
            return web.json_response({"path": request.path})

        for path in (*PUBLIC_PATHS, "/api/v1/alerts"):
            self.app.router.add_get(path, ok)
        self.runner = web.AppRunner(self.app)
        self.url = ""

    async def start(self) -> None:
        await self.runner.setup()
        site = web.TCPSite(self.runner, "127.0.0.1", 0)
        await site.start()
        assert site._server is not None
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[attr-defined]
        self.url = f"http://127.0.0.1:{port}"

    async def get(self, path: str, token: str | None = None) -> tuple[int, object, str]:
        headers = {"Authorization": f"Bearer {token}"} if token is not None else {}
        async with aiohttp.ClientSession() as s, s.get(self.url + path, headers=headers) as resp:
            return resp.status, await resp.json(), resp.headers.get("WWW-Authenticate", "")


@pytest.fixture(params=[True, False], ids=["on-reject", "no-on-reject"])
async def site(request: pytest.FixtureRequest) -> AsyncIterator[_Site]:
    s = _Site(TokenAuth("s3cret"), record_rejects=request.param)
    await s.start()
    yield s
    await s.runner.cleanup()


async def test_the_middleware_answers_401_without_the_token_and_passes_it_with(site: _Site) -> None:
    status, body, challenge = await site.get("/api/v1/alerts")
    assert status == 401
    assert body == {"error": "missing or invalid bearer token", "field": "Authorization"}
    assert challenge == 'Bearer realm="gpupulse-remediation"'
    assert (await site.get("/api/v1/alerts", "wrong"))[0] == 401
    assert await site.get("/api/v1/alerts", "s3cret") == (200, {"path": "/api/v1/alerts"}, "")
    for path in sorted(PUBLIC_PATHS):  # scrapes and probes carry no token
        assert (await site.get(path))[0] == 200, path
    # each rejection is reported once (the server counts them); passing requests are not
    assert site.rejected == (["/api/v1/alerts"] * 2 if site.records else [])


async def test_without_a_token_every_path_is_open() -> None:
    s = _Site(TokenAuth(""), record_rejects=True)
    await s.start()
    try:
        assert (await s.get("/api/v1/alerts"))[0] == 200
        assert s.rejected == []
    finally:
        await s.runner.cleanup()


@pytest.fixture
def self_signed(tmp_path: Path) -> tuple[Path, Path]:
    if shutil.which("openssl") is None:
        pytest.skip("openssl not installed")
    cert, key = tmp_path / "tls.crt", tmp_path / "tls.key"
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
         "-days", "2", "-subj", "/CN=127.0.0.1", "-keyout", str(key), "-out", str(cert)],
        check=True, capture_output=True, timeout=30,
    )  # fmt: skip
    return cert, key


def test_a_client_ca_makes_client_certificates_required(self_signed: tuple[Path, Path]) -> None:
    cert, key = self_signed
    plain = build_ssl_context(cert, key, None)
    assert plain.verify_mode == ssl.CERT_NONE  # TLS only: clients present no certificate
    mutual = build_ssl_context(cert, key, cert)  # the self-signed certificate is its own CA
    assert mutual.verify_mode == ssl.CERT_REQUIRED
    assert plain.minimum_version == mutual.minimum_version == ssl.TLSVersion.TLSv1_2
