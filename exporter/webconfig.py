"""`--web.config.file`: TLS and basic auth for the exporter's endpoints, read as the Prometheus exporter
toolkit reads them (node_exporter's and dcgm-exporter's flag of the same name), so one file serves all.

    tls_server_config:
      cert_file: server.crt          # relative paths are relative to this file
      key_file: server.key
      client_auth_type: RequireAndVerifyClientCert   # or NoClientCert (default), VerifyClientCertIfGiven
      client_ca_file: ca.crt
      min_version: TLS12             # TLS10 .. TLS13
    basic_auth_users:
      prometheus: $2y$10$...         # bcrypt hashes (htpasswd -nBC 10 "" | tr -d ':\\n')
    http_server_config:
      headers:
        Strict-Transport-Security: max-age=31536000

Unlike the toolkit, /healthz and /readyz answer without credentials (the kubelet's probes carry
none, and they tell nothing). As the toolkit does, the file is read again while serving: a changed
certificate is presented from the next handshake on (rotation without a restart), changed users and
headers apply from the next request. Unlike the toolkit, which answers 500 while the file is broken,
a file that no longer loads keeps the last good one in force and is logged, so a bad edit never
takes the metrics endpoint down. Unknown keys and the toolkit's options that Python's TLS cannot
honour (RequestClientCert, RequireAnyClientCert: a client certificate asked for but not verified)
are refused when the file is loaded.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import hashlib
import logging
import os
import ssl
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import bcrypt
import yaml
from aiohttp import web

from exporter.errors import WebConfigError

log = logging.getLogger(__name__)

CLIENT_AUTH = {
    "NoClientCert": ssl.CERT_NONE,
    "VerifyClientCertIfGiven": ssl.CERT_OPTIONAL,
    "RequireAndVerifyClientCert": ssl.CERT_REQUIRED,
}
UNSUPPORTED_CLIENT_AUTH = ("RequestClientCert", "RequireAnyClientCert")
TLS_VERSIONS = {
    "TLS10": ssl.TLSVersion.TLSv1,
    "TLS11": ssl.TLSVersion.TLSv1_1,
    "TLS12": ssl.TLSVersion.TLSv1_2,
    "TLS13": ssl.TLSVersion.TLSv1_3,
}
# the response headers the toolkit lets the file set
ALLOWED_HEADERS = (
    "Strict-Transport-Security",
    "X-Content-Type-Options",
    "X-Frame-Options",
    "X-XSS-Protection",
    "Content-Security-Policy",
)
REALM = 'Basic realm="gpupulse-exporter"'
# the kubelet's probes carry no credentials and these two tell nothing but "alive" and "has a sample"
UNAUTHENTICATED_PATHS = ("/healthz", "/readyz")
# bcrypt is slow on purpose (about 50 ms at cost 10): a good password's check is remembered, and a
# user who does not exist is checked against this hash so that both take as long
_DUMMY_HASH = bcrypt.hashpw(b"gpupulse-no-such-user", bcrypt.gensalt(rounds=10))
AUTH_CACHE_MAX = 1024
BCRYPT_PREFIXES = ("$2a$", "$2b$", "$2y$")


@dataclass(frozen=True)
class TLSSettings:
    cert_file: Path
    key_file: Path
    client_auth: ssl.VerifyMode = ssl.CERT_NONE
    client_ca_file: Path | None = None
    min_version: ssl.TLSVersion = ssl.TLSVersion.TLSv1_2
    max_version: ssl.TLSVersion | None = None


@dataclass(frozen=True)
class WebConfig:
    """What one version of the file says."""

    tls: TLSSettings | None = None
    users: Mapping[str, bytes] = field(default_factory=dict)  # user -> bcrypt hash
    headers: Mapping[str, str] = field(default_factory=dict)


def _mapping(value: Any, where: str, allowed: tuple[str, ...]) -> dict[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise WebConfigError(f"{where} must be a mapping")
    unknown = sorted(set(map(str, value)) - set(allowed))
    if unknown:
        raise WebConfigError(f"{where}: unknown field(s) {', '.join(unknown)} (known: {', '.join(allowed)})")
    return value


def _tls(raw: Any, base: Path, where: str) -> TLSSettings | None:
    known = ("cert_file", "key_file", "client_auth_type", "client_ca_file", "min_version", "max_version",
             "cert", "key", "cipher_suites", "curve_preferences", "prefer_server_cipher_suites")  # fmt: skip
    tls = _mapping(raw, where, known)
    if not tls:
        return None
    for inline in ("cert", "key", "cipher_suites", "curve_preferences", "prefer_server_cipher_suites"):
        if inline in tls:
            raise WebConfigError(f"{where}.{inline} is not supported here: use cert_file and key_file")
    if not tls.get("cert_file") or not tls.get("key_file"):
        raise WebConfigError(f"{where} needs both cert_file and key_file")
    auth_type = str(tls.get("client_auth_type") or "NoClientCert")
    if auth_type in UNSUPPORTED_CLIENT_AUTH:
        raise WebConfigError(
            f"{where}.client_auth_type {auth_type} (a client certificate asked for but not verified) is "
            f"not supported; use one of {', '.join(CLIENT_AUTH)}"
        )
    if auth_type not in CLIENT_AUTH:
        raise WebConfigError(f"{where}.client_auth_type {auth_type!r} is not one of {', '.join(CLIENT_AUTH)}")
    ca = tls.get("client_ca_file")
    if CLIENT_AUTH[auth_type] != ssl.CERT_NONE and not ca:
        raise WebConfigError(f"{where}.client_auth_type {auth_type} needs client_ca_file")

    def version(key: str) -> ssl.TLSVersion | None:
        value = tls.get(key)
        if value is None:
            return None
        if str(value) not in TLS_VERSIONS:
            raise WebConfigError(f"{where}.{key} {value!r} is not one of {', '.join(TLS_VERSIONS)}")
        return TLS_VERSIONS[str(value)]

    return TLSSettings(
        cert_file=base / str(tls["cert_file"]),
        key_file=base / str(tls["key_file"]),
        client_auth=CLIENT_AUTH[auth_type],
        client_ca_file=base / str(ca) if ca else None,
        min_version=version("min_version") or ssl.TLSVersion.TLSv1_2,
        max_version=version("max_version"),
    )


def parse_web_config(text: str, path: Path) -> WebConfig:
    """The configuration a file's text describes (WebConfigError when it is not a valid one)."""
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise WebConfigError(f"{path}: not YAML: {exc}") from None
    top = _mapping(doc, str(path), ("tls_server_config", "basic_auth_users", "http_server_config"))
    users: dict[str, bytes] = {}
    raw_users = top.get("basic_auth_users") or {}
    if not isinstance(raw_users, dict):
        raise WebConfigError(f"{path}: basic_auth_users must map user names to bcrypt hashes")
    for user, hashed in raw_users.items():
        if not isinstance(hashed, str) or not hashed.startswith(BCRYPT_PREFIXES) or len(hashed) != 60:
            raise WebConfigError(f"{path}: basic_auth_users.{user} is not a bcrypt hash ($2y$..., 60 chars)")
        users[str(user)] = hashed.encode()
    http = _mapping(top.get("http_server_config"), f"{path}: http_server_config", ("headers", "http2"))
    headers = _mapping(http.get("headers"), f"{path}: http_server_config.headers", ALLOWED_HEADERS)
    return WebConfig(
        tls=_tls(top.get("tls_server_config"), path.parent, f"{path}: tls_server_config"),
        users=users,
        headers={str(k): str(v) for k, v in headers.items()},
    )


def _configure(context: ssl.SSLContext, tls: TLSSettings) -> None:
    context.minimum_version = tls.min_version
    context.maximum_version = tls.max_version or ssl.TLSVersion.MAXIMUM_SUPPORTED
    try:
        context.load_cert_chain(tls.cert_file, tls.key_file)
        if tls.client_ca_file is not None:
            context.load_verify_locations(tls.client_ca_file)
    except (OSError, ssl.SSLError) as exc:
        raise WebConfigError(f"TLS: cannot load {tls.cert_file} / {tls.key_file}: {exc}") from None
    context.verify_mode = tls.client_auth


def _context(tls: TLSSettings) -> ssl.SSLContext:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    _configure(context, tls)
    return context


class WebConfigFile:
    """The file, read again when it changed (modification time and size), the last good one kept.

    The listening socket has one TLS context for its whole life; a new certificate is loaded into it,
    so every handshake after the reload presents it. A reload is looked for on every request and on
    every handshake that names a server (SNI)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._stamp: tuple[int, int] | None = None
        self.config = self._read()  # at start, an error is fatal (WebConfigError)
        self.context = _context(self.config.tls) if self.config.tls is not None else None
        if self.context is not None:
            self.context.sni_callback = lambda *_: self.refresh()

    def _read(self) -> WebConfig:
        try:
            stat = self.path.stat()
            text = self.path.read_text()
        except OSError as exc:
            raise WebConfigError(f"--web.config.file {self.path}: {exc.strerror or exc}") from None
        self._stamp = (stat.st_mtime_ns, stat.st_size)
        return parse_web_config(text, self.path)

    def refresh(self) -> None:
        """Read the file again if it changed; keep the last good version when it no longer loads."""
        try:
            stat = self.path.stat()
        except OSError as exc:
            log.warning("web config %s: %s; keeping the last good one", self.path, exc)
            return
        if (stat.st_mtime_ns, stat.st_size) == self._stamp:
            return
        try:
            config = self._read()
            if (config.tls is None) != (self.context is None):
                raise WebConfigError("TLS cannot be turned on or off without a restart")
            if config.tls is not None and self.context is not None:
                _context(config.tls)  # all of it loads before the live context is touched
                _configure(self.context, config.tls)
        except WebConfigError as exc:  # logged once per broken version (its stamp is kept)
            log.error("web config %s: reload failed, keeping the last good one: %s", self.path, exc)
            return
        self.config = config
        log.info("web config %s reloaded", self.path)


def _password_ok(hashed: bytes, password: bytes) -> bool:
    return bcrypt.checkpw(password, hashed)


def auth_middleware(web_config: WebConfigFile) -> Callable[..., Awaitable[web.StreamResponse]]:
    """Basic auth and the configured headers on every request."""
    good: dict[bytes, None] = {}  # digests of (user, password, hash) already checked, oldest first

    @web.middleware
    async def middleware(
        request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
    ) -> web.StreamResponse:
        web_config.refresh()
        config = web_config.config
        open_path = request.path in UNAUTHENTICATED_PATHS
        if config.users and not open_path and not await _authorized(request, config.users, good):
            raise web.HTTPUnauthorized(headers={"WWW-Authenticate": REALM, **config.headers})
        response = await handler(request)
        response.headers.update(config.headers)
        return response

    return middleware


async def _authorized(request: web.Request, users: Mapping[str, bytes], good: dict[bytes, None]) -> bool:
    header = request.headers.get("Authorization", "")
    scheme, _, value = header.partition(" ")
    if scheme.lower() != "basic":
        return False
    try:
        user, sep, password = base64.b64decode(value.strip(), validate=True).decode().partition(":")
    except (binascii.Error, UnicodeDecodeError):
        return False
    if not sep:
        return False
    hashed = users.get(user)
    digest = hashlib.sha256(b"\0".join((user.encode(), password.encode(), hashed or b""))).digest()
    if hashed is not None and digest in good:
        return True
    ok = await asyncio.to_thread(_password_ok, hashed or _DUMMY_HASH, password.encode())
    if ok and hashed is not None:
        good[digest] = None
        while len(good) > AUTH_CACHE_MAX:
            del good[next(iter(good))]
        return True
    return False


def web_config_from_flag(value: str) -> WebConfigFile | None:
    """The file named by --web.config.file ("" = none); WebConfigError when it cannot be used."""
    if not value:
        return None
    return WebConfigFile(Path(os.path.expanduser(value)))
