"""Mutual TLS on the webhook: a client without a certificate from the configured CA never gets in."""

from __future__ import annotations

import shutil
import ssl
import subprocess
from pathlib import Path

import aiohttp
import pytest

from tests.fakes.intake import count_rows, make_settings, notification, start_harness

pytestmark = pytest.mark.integration


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=30)


@pytest.fixture
def pki(tmp_path: Path) -> Path:
    """A CA, a server certificate for 127.0.0.1, a client certificate from the CA, and a stranger's."""
    if shutil.which("openssl") is None:
        pytest.skip("openssl not installed")
    d = tmp_path / "pki"
    d.mkdir()
    for name in ("ca", "other-ca"):
        _openssl(
            "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", f"/CN={name}",
            "-keyout", f"{name}.key", "-out", f"{name}.pem", cwd=d,
        )  # fmt: skip
    (d / "san.ext").write_text("subjectAltName=IP:127.0.0.1\n")
    for name, ca, ext in (("server", "ca", True), ("client", "ca", False), ("stranger", "other-ca", False)):
        _openssl(
            "req", "-newkey", "rsa:2048", "-nodes", "-subj", f"/CN={name}",
            "-keyout", f"{name}.key", "-out", f"{name}.csr", cwd=d,
        )  # fmt: skip
        sign = ["x509", "-req", "-in", f"{name}.csr", "-CA", f"{ca}.pem", "-CAkey", f"{ca}.key"]
        sign += ["-CAcreateserial", "-days", "2", "-out", f"{name}.pem"]
        if ext:
            sign += ["-extfile", "san.ext"]
        _openssl(*sign, cwd=d)
    return d


async def test_mutual_tls_requires_a_client_certificate_from_the_ca(tmp_path: Path, pki: Path) -> None:
    settings = make_settings(
        tmp_path,
        auth_token="",  # mTLS alone authenticates
        tls_cert_file=pki / "server.pem",
        tls_key_file=pki / "server.key",
        tls_client_ca_file=pki / "ca.pem",
    )
    h = await start_harness(settings)
    url = f"https://127.0.0.1:{h.service.port}/api/v1/alerts"
    body = notification()

    def client_ctx(cert: str | None) -> ssl.SSLContext:
        ctx = ssl.create_default_context(cafile=str(pki / "ca.pem"))
        if cert:
            ctx.load_cert_chain(str(pki / f"{cert}.pem"), str(pki / f"{cert}.key"))
        return ctx

    try:
        async with aiohttp.ClientSession() as s:
            for cert in (None, "stranger"):
                with pytest.raises(aiohttp.ClientError):
                    async with s.post(url, json=body, ssl=client_ctx(cert)) as r:
                        await r.read()
            assert count_rows(h.inbox_path) == 0
            async with s.post(url, json=body, ssl=client_ctx("client")) as r:
                assert r.status == 200
        assert count_rows(h.inbox_path) == 1
    finally:
        await h.session.close()
        await h.service.stop()
