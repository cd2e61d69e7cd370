"""The controller's HTTP service: webhook intake, operator API, metrics and probes, and its lifecycle."""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import signal
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import orjson
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from gpupulse.clock import Clock, SystemClock
from remediation.errors import BodyRefused, PayloadError, QueueFull, StoreError

from .api import Api
from .auth import TokenAuth, auth_middleware, build_ssl_context
from .httpguard import (
    DeadlineSite,
    check_content_type,
    content_coding,
    decode_body,
    head_deadline_middleware,
    read_body,
)
from .inbox import Inbox
from .intake import parse_notification
from .ledger import pair_inbox
from .metrics import RemediationMetrics
from .model import Engine
from .settings import Settings
from .worker import Worker, WorkerSettings

log = logging.getLogger(__name__)

ALERTS_PATH = "/api/v1/alerts"
RETRY_AFTER_SECONDS = "5"
REJECT_REASONS = ("auth", "size", "invalid", "overloaded", "storage")

EngineFactory = Callable[[Settings, RemediationMetrics], Awaitable[Engine]]


def _error(status: int, field: str, message: str, headers: dict[str, str] | None = None) -> web.Response:
    return web.json_response({"error": message, "field": field}, status=status, headers=headers)


@dataclass
class Controller:
    """The running parts one HTTP app serves."""

    settings: Settings
    inbox: Inbox
    engine: Engine
    worker: Worker
    metrics: RemediationMetrics
    auth: TokenAuth
    clock: Clock = field(default_factory=SystemClock)
    draining: bool = False

    def not_ready(self) -> str:
        """Why webhooks should not be sent here now ("" when ready): shutting down, the inbox or the
        worker stopped, or the inbox cannot commit (disk full, corrupt)."""
        if self.draining:
            return "shutting down"
        if not self.inbox.running:
            return "inbox is not open"
        if self.inbox.corrupt:
            return "inbox is corrupt"
        if not self.inbox.writable:
            return f"inbox cannot commit: {self.inbox.failure}"
        if not self.worker.running:
            return "worker is not running"
        return ""

    @property
    def ready(self) -> bool:
        """True while webhooks can be committed and processed."""
        return not self.not_ready()


class WebhookHandler:
    """POST /api/v1/alerts: validate, commit to the inbox, then acknowledge."""

    def __init__(self, ctl: Controller) -> None:
        self.ctl = ctl
        m = ctl.metrics
        # labelled children resolved once: .labels() costs more than the increment on this path
        self._received = {s: m.alerts_received.labels(status=s) for s in ("firing", "resolved")}
        self._rejected = {r: m.alerts_rejected.labels(reason=r) for r in REJECT_REASONS}

    def _reject(self, reason: str, response: web.Response) -> web.Response:
        self._rejected[reason].inc()
        return response

    async def handle(self, request: web.Request) -> web.Response:
        """Answer one webhook delivery (see docs/design/remediation-intake.md for the status codes)."""
        started = time.perf_counter()
        ctl = self.ctl
        if ctl.draining:
            return self._reject(
                "overloaded", _error(503, "", "shutting down", {"Retry-After": RETRY_AFTER_SECONDS})
            )
        settings = ctl.settings
        try:
            # authentication already passed (middleware): only now is the body read and inflated
            check_content_type(request)
            coding = content_coding(request)
            raw = await read_body(request, settings.max_body_bytes, settings.web_read_body_timeout_seconds)
            body = decode_body(raw, coding, settings.max_body_bytes)
        except BodyRefused as e:
            log.info("rejected webhook from %s: %s: %s", request.remote, e.field, e.message)
            reason = "size" if e.status == 413 else "invalid"
            message = e.message
            if e.status == 413:
                message += " (set max_alerts on the webhook receiver)"
            headers = {"Connection": "close"} if e.status in (408, 413) else None
            return self._reject(reason, _error(e.status, e.field, message, headers))
        try:
            records = parse_notification(body, ctl.clock.time())
        except PayloadError as e:
            log.info("rejected webhook from %s: %s", request.remote, e)
            return self._reject("invalid", web.json_response(e.as_json(), status=400))
        try:
            result = await ctl.inbox.ingest(
                records, settings.queue_max_pending, settings.engine.max_event_age_seconds
            )
        except QueueFull as e:
            # 5xx: Alertmanager retries it; a 4xx (429 included) would drop the notification
            return self._reject(
                "overloaded", _error(503, "alerts", f"queue full: {e}", {"Retry-After": RETRY_AFTER_SECONDS})
            )
        except StoreError as e:
            log.error("inbox write failed: %s", e)
            return self._reject(
                "storage", _error(503, "alerts", "storage unavailable", {"Retry-After": RETRY_AFTER_SECONDS})
            )
        if result.inserted or result.requeued:
            ctl.worker.submit(
                [(i, r.to_event(i)) for r, i in zip(records, result.ids, strict=True) if i is not None]
            )
        # re-deliveries are acknowledged but not counted: the counter is of alerts newly stored
        for status, n in result.inserted_by_status.items():
            self._received[status].inc(n)
        ctl.metrics.ingest_latency.observe(time.perf_counter() - started)
        body = orjson.dumps({"status": "ok", "accepted": result.inserted, "duplicates": result.duplicates})
        return web.Response(body=body, content_type="application/json")


def build_app(ctl: Controller) -> web.Application:
    """The aiohttp application: webhook, operator API (token), /metrics, /healthz, /readyz (public)."""

    def on_auth_reject(request: web.Request) -> None:
        if request.path == ALERTS_PATH:
            ctl.metrics.alerts_rejected.labels(reason="auth").inc()

    app = web.Application(
        middlewares=[head_deadline_middleware, auth_middleware(ctl.auth, on_auth_reject)],
        client_max_size=ctl.settings.max_body_bytes,
    )
    app.router.add_post(ALERTS_PATH, WebhookHandler(ctl).handle)
    Api(ctl.engine).add_routes(app)

    async def metrics(request: web.Request) -> web.Response:
        body = generate_latest(ctl.metrics.registry)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def healthz(request: web.Request) -> web.Response:
        # liveness: a worker that died of a bug, or an inbox SQLite calls damaged, will not come back
        # by itself; a restart does (the integrity check then refuses or recreates the inbox)
        if ctl.worker.crashed:
            return web.json_response({"status": "worker stopped unexpectedly"}, status=503)
        if ctl.inbox.corrupt:
            return web.json_response({"status": "inbox is corrupt; restart to check it"}, status=503)
        return web.json_response({"status": "ok"})

    async def readyz(request: web.Request) -> web.Response:
        why = ctl.not_ready()
        if not why:
            return web.json_response({"status": "ready", "queue_depth": ctl.inbox.pending})
        return web.json_response({"status": "not ready", "reason": why}, status=503)

    app.router.add_get("/metrics", metrics)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    return app


@dataclass
class RunningService:
    """A started controller: stop() drains and closes everything it opened."""

    ctl: Controller
    runner: web.AppRunner
    host: str
    port: int

    async def stop(self) -> None:
        """Refuse new webhooks, finish in-flight requests and the row in progress, close the store."""
        self.ctl.draining = True
        await self.runner.cleanup()
        await self.ctl.worker.stop(self.ctl.settings.shutdown_grace_seconds)
        await close_engine(self.ctl.engine)
        await self.ctl.inbox.close()


async def close_engine(engine: Engine) -> None:
    """Call the engine's aclose()/close() when it has one (the protocol does not require it)."""
    closer = getattr(engine, "aclose", None) or getattr(engine, "close", None)
    if closer is None:
        return
    try:
        result = closer()
        if inspect.isawaitable(result):
            await result
    except Exception:
        log.exception("engine close failed")


def worker_settings(settings: Settings) -> WorkerSettings:
    """The worker's part of the settings."""
    return WorkerSettings(
        tick_interval_seconds=settings.engine_tick_interval_seconds,
        handle_timeout_seconds=settings.engine_handle_timeout_seconds,
        retry_initial_seconds=settings.worker_retry_initial_seconds,
        retry_max_seconds=settings.worker_retry_max_seconds,
        retention_seconds=settings.inbox_retention_seconds,
    )


async def start_service(
    settings: Settings,
    engine_factory: EngineFactory,
    metrics: RemediationMetrics | None = None,
    clock: Clock | None = None,
) -> RunningService:
    """Open the inbox, build the engine, start the worker and the HTTP(S) listener."""
    settings.validate()
    metrics = metrics or RemediationMetrics()
    clock = clock or SystemClock()
    inbox = Inbox(settings.inbox_path, settings.storage_synchronous, settings.storage_timeout_seconds)
    recreated = await inbox.start(settings.storage_on_corrupt)
    try:
        if recreated is not None:
            lost = "an unknown number of" if recreated.lost_alerts is None else str(recreated.lost_alerts)
            log.error(
                "inbox %s was corrupt (%s): set aside as %s and replaced by an empty inbox; "
                "%s accepted alerts not yet processed are lost",
                settings.inbox_path,
                recreated.reason,
                recreated.set_aside_as,
                lost,
            )
            metrics.inbox_recreated.inc()
            metrics.inbox_alerts_lost.inc(recreated.lost_alerts or 0)
        # the ledger remembers its inbox: an emptied or replaced one is refused (or re-paired, loudly)
        warning = await asyncio.to_thread(
            pair_inbox,
            settings.db_path,
            inbox.identity,
            clock.time(),
            settings.storage_accept_new_inbox or recreated is not None,
        )
        if warning:
            log.error("%s; paired with the new inbox", warning)
        metrics.leader.set(1)  # a controller without leader election acts; the kube factory overrides
        engine = await engine_factory(settings, metrics)
    except BaseException:
        await inbox.close()
        raise
    metrics.inbox_writable.set_function(lambda: 1.0 if inbox.writable else 0.0)
    worker = Worker(inbox, engine, metrics, worker_settings(settings), clock)
    ctl = Controller(settings, inbox, engine, worker, metrics, TokenAuth(settings.auth_token), clock)
    ssl_ctx = None
    if settings.tls_cert_file is not None and settings.tls_key_file is not None:
        ssl_ctx = build_ssl_context(
            settings.tls_cert_file, settings.tls_key_file, settings.tls_client_ca_file
        )
    # auto_decompress off: bodies are inflated by the handler, after authentication and bounded
    runner = web.AppRunner(
        build_app(ctl),
        access_log=None,
        shutdown_timeout=settings.shutdown_grace_seconds,
        auto_decompress=False,
    )
    await runner.setup()
    try:
        site = DeadlineSite(
            runner,
            settings.listen_host,
            settings.listen_port,
            header_timeout_seconds=settings.web_read_header_timeout_seconds,
            ssl_context=ssl_ctx,
        )
        await site.start()
    except BaseException:
        await runner.cleanup()
        await close_engine(engine)
        await inbox.close()
        raise
    worker.start()
    host, port = _bound_address(runner, settings)
    log.info(
        "listening on %s://%s:%d (auth %s, mTLS %s), inbox %s, %d alerts pending",
        "https" if ssl_ctx else "http",
        host,
        port,
        "token" if ctl.auth.enabled else "OFF",
        "on" if settings.tls_client_ca_file else "off",
        settings.inbox_path,
        inbox.pending,
    )
    if settings.engine.pager.kind == "none":
        log.warning(
            "--pager=none: pages (the breaker's too) reach only this log; set --pager to webhook, "
            "pagerduty or slack so that they reach someone"
        )
    return RunningService(ctl, runner, host, port)


def _bound_address(runner: web.AppRunner, settings: Settings) -> tuple[str, int]:
    for addr in runner.addresses:
        if isinstance(addr, tuple) and len(addr) >= 2:
            return str(addr[0]), int(addr[1])
    return settings.listen_host, settings.listen_port


async def serve(settings: Settings, engine_factory: EngineFactory) -> None:
    """Run until SIGTERM or SIGINT, then shut down cleanly."""
    service = await start_service(settings, engine_factory)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(sig, stop.set)
    try:
        await stop.wait()
    finally:
        log.info("shutting down")
        await service.stop()
