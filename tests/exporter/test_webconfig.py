"""--web.config.file: the exporter toolkit's TLS and basic auth, on the real serving path (cli.serve
over a simulated GPU) with certificates made by openssl: refused without credentials, served with
them, probes open, a rotated certificate presented on the next connection, a broken edit never
taking the endpoint down, client certificates verified; bad files refused at start with one line."""

from __future__ import annotations

import asyncio
import base64
import os
import ssl
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import aiohttp
import bcrypt
import pytest
import yaml

from exporter import cli
from exporter.errors import WebConfigError
from exporter.webconfig import parse_web_config
from tests.fakes.prometheus_process import free_port

ROOT = Path(__file__).resolve().parents[2]
PASSWORD = "s3cret"
FILES = {"cert_file": "a", "key_file": "b"}
HASH = bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(rounds=4)).decode()


def _openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True, timeout=60)


def _ca(d: Path) -> tuple[Path, Path]:
    key, crt = d / "ca.key", d / "ca.crt"
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(crt),
             "-days", "2", "-subj", "/CN=gpupulse-test-ca")  # fmt: skip
    return key, crt


def _signed(d: Path, name: str, ca: tuple[Path, Path], *, server: bool) -> tuple[Path, Path]:
    key, csr, crt, ext = d / f"{name}.key", d / f"{name}.csr", d / f"{name}.crt", d / f"{name}.ext"
    _openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(csr),
             "-subj", f"/CN={name}")  # fmt: skip
    ext.write_text("subjectAltName=IP:127.0.0.1\n" if server else "extendedKeyUsage=clientAuth\n")
    _openssl("x509", "-req", "-in", str(csr), "-CA", str(ca[1]), "-CAkey", str(ca[0]), "-CAcreateserial",
             "-out", str(crt), "-days", "2", "-extfile", str(ext))  # fmt: skip
    return crt, key


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("pki")
    ca = _ca(d)
    out = {"ca": ca[1]}
    for name, server in (("server", True), ("server2", True), ("client", False)):
        out[f"{name}.crt"], out[f"{name}.key"] = _signed(d, name, ca, server=server)
    return out


def _write(path: Path, doc: object) -> None:
    # a new inode and size each time, as a ConfigMap or Secret update does
    tmp = path.with_suffix(".tmp")
    tmp.write_text(yaml.safe_dump(doc))
    os.replace(tmp, path)


@asynccontextmanager
async def _serving(config: Path) -> AsyncIterator[str]:
    port = free_port()
    args = cli.build_parser({}, None).parse_args(
        ["--simulate", "basic", "--web.listen-address", f"127.0.0.1:{port}", "--sampling.interval", "0.2",
         "--web.config.file", str(config)]
    )  # fmt: skip
    stop = asyncio.Event()
    task = asyncio.create_task(cli.serve(cli.settings_from_args(args), args, {}, None, stop))
    try:
        yield f"https://127.0.0.1:{port}"
    finally:
        stop.set()
        assert await asyncio.wait_for(task, 15) == 0


def _client_context(pki: dict[str, Path], cert: str | None = None) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=str(pki["ca"]))
    if cert:
        ctx.load_cert_chain(str(pki[f"{cert}.crt"]), str(pki[f"{cert}.key"]))
    return ctx


async def _presented(url: str, ctx: ssl.SSLContext) -> bytes:
    """The certificate (DER) the server presents on a new handshake."""
    host, port = url.removeprefix("https://").split(":")
    _, writer = await asyncio.open_connection(host, int(port), ssl=ctx)
    try:
        der: bytes = writer.get_extra_info("ssl_object").getpeercert(binary_form=True)
        return der
    finally:
        writer.close()


async def _get(
    url: str, ctx: ssl.SSLContext, user: str | None = None, password: str = PASSWORD, wait: bool = True
) -> tuple[int, str, dict[str, str], bytes]:
    """(status, body, headers, the certificate a new handshake presents); retried until it listens."""
    headers = {}
    if user is not None:
        headers["Authorization"] = "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()
    for _ in range(200 if wait else 1):
        connector = aiohttp.TCPConnector(ssl=ctx, force_close=True)
        try:
            async with aiohttp.ClientSession(connector=connector) as session:
                async with session.get(url, headers=headers) as resp:
                    status, body, got = resp.status, await resp.text(), dict(resp.headers)
            return status, body, got, await _presented(url.rsplit("/", 1)[0], ctx)
        except aiohttp.ClientConnectorError:
            if not wait:
                raise
            await asyncio.sleep(0.05)
    raise AssertionError(f"{url} never answered")


def _der(crt: Path) -> bytes:
    return ssl.PEM_cert_to_DER_cert(crt.read_text())


def _config(pki: dict[str, Path], server: str = "server", **tls: str) -> dict[str, object]:
    return {
        "tls_server_config": {
            "cert_file": str(pki[f"{server}.crt"]),
            "key_file": str(pki[f"{server}.key"]),
            **tls,
        },
        "basic_auth_users": {"prometheus": HASH},
        "http_server_config": {"headers": {"Strict-Transport-Security": "max-age=31536000"}},
    }


async def test_tls_and_basic_auth_guard_metrics_and_leave_the_probes_open(
    pki: dict[str, Path], tmp_path: Path
) -> None:
    config = tmp_path / "web.yml"
    _write(config, _config(pki))
    ctx = _client_context(pki)
    async with _serving(config) as url:
        status, text, headers, der = await _get(f"{url}/metrics", ctx, "prometheus")
        assert status == 200 and "gpu_up" in text
        assert der == _der(pki["server.crt"])
        assert headers["Strict-Transport-Security"] == "max-age=31536000"
        status, _, headers, _ = await _get(f"{url}/metrics", ctx)
        assert status == 401 and headers["WWW-Authenticate"] == 'Basic realm="gpupulse-exporter"'
        assert (await _get(f"{url}/metrics", ctx, "prometheus", password="wrong"))[0] == 401
        assert (await _get(f"{url}/metrics", ctx, "nobody"))[0] == 401
        assert (await _get(f"{url}/readyz", ctx))[0] == 200
        with pytest.raises(aiohttp.ClientError):  # plain HTTP to the TLS port gets no answer
            async with aiohttp.ClientSession() as session:
                await session.get(url.replace("https", "http") + "/metrics")


async def test_a_rotated_certificate_is_presented_and_a_broken_edit_keeps_the_last_good_file(
    pki: dict[str, Path], tmp_path: Path
) -> None:
    config = tmp_path / "web.yml"
    _write(config, _config(pki))
    ctx = _client_context(pki)
    async with _serving(config) as url:
        assert (await _get(f"{url}/metrics", ctx, "prometheus"))[3] == _der(pki["server.crt"])
        _write(config, _config(pki, server="server2"))
        await _get(f"{url}/readyz", ctx)  # the request after the change reloads it
        status, _, _, der = await _get(f"{url}/metrics", ctx, "prometheus", wait=False)
        assert status == 200 and der == _der(pki["server2.crt"])
        config.write_text("tls_server_config: [not, a, mapping\n")
        for _ in range(3):  # still served with the last good file: its users, its certificate
            status, _, _, der = await _get(f"{url}/metrics", ctx, "prometheus", wait=False)
            assert status == 200 and der == _der(pki["server2.crt"])
        assert (await _get(f"{url}/metrics", ctx, wait=False))[0] == 401


async def test_client_certificates_are_required_and_verified(pki: dict[str, Path], tmp_path: Path) -> None:
    config = tmp_path / "web.yml"
    doc = _config(pki, client_auth_type="RequireAndVerifyClientCert", client_ca_file=str(pki["ca"]))
    doc.pop("basic_auth_users")
    _write(config, doc)
    async with _serving(config) as url:
        assert (await _get(f"{url}/metrics", _client_context(pki, "client")))[0] == 200
        with pytest.raises(aiohttp.ClientError):
            await _get(f"{url}/metrics", _client_context(pki), wait=False)


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        ({"tls_server_config": {"cert_file": "a.crt"}}, "needs both cert_file and key_file"),
        ({"tls_srever_config": {}}, "unknown field(s) tls_srever_config"),
        ({"tls_server_config": {**FILES, "client_auth_type": "RequireAnyClientCert"}}, "not supported"),
        ({"tls_server_config": {**FILES, "client_auth_type": "Sometimes"}}, "is not one of"),
        ({"tls_server_config": {**FILES, "client_auth_type": "VerifyClientCertIfGiven"}}, "client_ca_file"),
        ({"tls_server_config": {**FILES, "min_version": "SSL3"}}, "min_version"),
        ({"basic_auth_users": {"alice": "plaintext"}}, "is not a bcrypt hash"),
        ({"basic_auth_users": ["alice"]}, "must map user names"),
        ({"http_server_config": {"headers": {"Set-Cookie": "x"}}}, "unknown field(s) Set-Cookie"),
        ("- just a list", "must be a mapping"),
    ],
)  # fmt: skip
def test_a_file_the_toolkit_would_refuse_is_refused_with_the_key_named(doc: object, message: str) -> None:
    text = doc if isinstance(doc, str) else yaml.safe_dump(doc)
    with pytest.raises(WebConfigError) as err:
        parse_web_config(text, Path("/etc/gpupulse/web.yml"))
    assert message in str(err.value)


def test_relative_paths_are_relative_to_the_file() -> None:
    doc = {"tls_server_config": {"cert_file": "tls/a.crt", "key_file": "/abs/b.key"}}
    parsed = parse_web_config(yaml.safe_dump(doc), Path("/etc/gpupulse/web.yml"))
    assert parsed.tls is not None
    assert parsed.tls.cert_file == Path("/etc/gpupulse/tls/a.crt")
    assert parsed.tls.key_file == Path("/abs/b.key")


@pytest.mark.parametrize(
    "content", [None, "basic_auth_users: {a: nope}\n", "tls_server_config: {cert_file: x, key_file: y}\n"]
)
def test_the_exporter_refuses_to_start_on_a_bad_file_with_one_line(
    tmp_path: Path, content: str | None
) -> None:
    config = tmp_path / "web.yml"
    if content is not None:
        config.write_text(content)
    done = subprocess.run(
        [sys.executable, "-m", "exporter.cli", "--simulate", "basic", "--web.listen-address", "127.0.0.1:0",
         "--web.config.file", str(config)],
        cwd=ROOT, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 2
    assert "Traceback" not in done.stderr
    assert str(config) in done.stderr or "cannot load" in done.stderr
    assert len([line for line in done.stderr.splitlines() if "error:" in line]) == 1


async def test_a_real_prometheus_scrapes_it_over_tls_with_basic_auth(
    pki: dict[str, Path], tmp_path: Path
) -> None:
    """The boundary: Prometheus 3's scrape client (tls_config, basic_auth) against our TLS listener,
    and the same Prometheus without the password is refused (up 0, 401 in lastError)."""
    from demo.neighbours import neighbour_binary
    from tests.fakes.prometheus_process import running_prometheus

    config = tmp_path / "web.yml"
    _write(config, _config(pki))
    async with _serving(config) as url:
        await _get(f"{url}/readyz", _client_context(pki))
        target = url.removeprefix("https://")
        tls = {"ca_file": str(pki["ca"])}
        scrape = {
            "global": {"scrape_interval": "1s"},
            "scrape_configs": [
                {"job_name": "good", "scheme": "https", "tls_config": tls,
                 "basic_auth": {"username": "prometheus", "password": PASSWORD},
                 "static_configs": [{"targets": [target]}]},
                {"job_name": "nopass", "scheme": "https", "tls_config": tls,
                 "static_configs": [{"targets": [target]}]},
            ],
        }  # fmt: skip
        async with running_prometheus(yaml.safe_dump(scrape), binary=neighbour_binary("prometheus")) as prom:
            await prom.wait_for('gpu_up{job="good"}', timeout_seconds=60)
            await prom.wait_for('up{job="nopass"} == 0', timeout_seconds=60)
            targets = await prom.api("targets")
            [refused] = [t for t in targets["activeTargets"] if t["labels"]["job"] == "nopass"]
            assert "401" in refused["lastError"]
