"""Receiver authentication: bearer token (constant-time compare) and optional mutual TLS."""

from __future__ import annotations

import hmac
import os
import ssl
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path

from aiohttp import web

from remediation.errors import ConfigError

TOKEN_ENV = "GPUPULSE_REMEDIATION_TOKEN"
# paths any client may read: Prometheus scrapes and kubelet probes carry no token
PUBLIC_PATHS = frozenset({"/metrics", "/healthz", "/readyz"})

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
OnReject = Callable[[web.Request], None]


def load_token(token_file: Path | None, environ: Mapping[str, str] | None = None) -> str:
    """The bearer token from the file (preferred) or GPUPULSE_REMEDIATION_TOKEN; '' when neither is set."""
    env = os.environ if environ is None else environ
    if token_file is not None:
        try:
            token = token_file.read_text(encoding="utf-8").strip()
        except (OSError, UnicodeDecodeError) as e:
            raise ConfigError(f"--auth.token-file {token_file}: {e}") from e
        if not token:
            raise ConfigError(f"--auth.token-file {token_file} is empty")
        return token
    return env.get(TOKEN_ENV, "").strip()


class TokenAuth:
    """Checks `Authorization: Bearer <token>`; an empty token means authentication is off."""

    def __init__(self, token: str) -> None:
        self._token = token.encode("utf-8")

    @property
    def enabled(self) -> bool:
        return bool(self._token)

    def check(self, header: str | None) -> bool:
        """True when the header carries the configured token (always true when auth is off)."""
        if not self._token:
            return True
        if not header:
            return False
        scheme, _, credentials = header.partition(" ")
        if scheme.lower() != "bearer":
            return False
        # compare_digest on bytes: constant time in the length of the secret, no early exit
        return hmac.compare_digest(credentials.strip().encode("utf-8", "surrogateescape"), self._token)


def auth_middleware(
    auth: TokenAuth, on_reject: OnReject | None = None
) -> Callable[..., Awaitable[web.StreamResponse]]:
    """aiohttp middleware: every path but PUBLIC_PATHS needs the token; failures answer 401 JSON."""

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.path in PUBLIC_PATHS or auth.check(request.headers.get("Authorization")):
            return await handler(request)
        if on_reject is not None:
            on_reject(request)
        return web.json_response(
            {"error": "missing or invalid bearer token", "field": "Authorization"},
            status=401,
            headers={"WWW-Authenticate": 'Bearer realm="gpupulse-remediation"'},
        )

    return middleware


def build_ssl_context(cert_file: Path, key_file: Path, client_ca_file: Path | None) -> ssl.SSLContext:
    """Server TLS context; with a client CA, clients must present a certificate it signed (mTLS)."""
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        ctx.load_cert_chain(str(cert_file), str(key_file))
        if client_ca_file is not None:
            ctx.load_verify_locations(cafile=str(client_ca_file))
            ctx.verify_mode = ssl.CERT_REQUIRED
    except (OSError, ssl.SSLError) as e:
        raise ConfigError(f"TLS files: {e}") from e
    return ctx
