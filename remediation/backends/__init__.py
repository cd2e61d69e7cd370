"""Action backends (restart/migrate) and pagers; `kubernetes` lives beside these in its own module."""

from __future__ import annotations

import logging

from remediation.errors import PermanentError
from remediation.model import ActionResult, Page, Target

log = logging.getLogger(__name__)


class NoBackend:
    """Backend for `backend: none`: every action fails permanently, so the ladder pages."""

    name = "none"

    async def restart(self, target: Target, reason: str) -> ActionResult:
        raise PermanentError("no action backend configured")

    async def migrate(self, target: Target, reason: str) -> ActionResult:
        raise PermanentError("no action backend configured")


class LogPager:
    """Pager for `pager: none`: pages are written to the log (and the ledger) only."""

    name = "log"

    async def send(self, page: Page) -> None:
        """Log the page at WARNING; nothing leaves the process."""
        log.warning(
            "page %s (%s, %s): %s%s",
            page.dedup_key,
            page.severity,
            page.signature,
            page.summary,
            " [resolved]" if page.resolved else "",
        )
