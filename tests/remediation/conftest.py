"""Fixtures for the controller's intake, worker, API and CLI tests (fakes in tests/fakes/intake.py)."""

from __future__ import annotations

import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:  # tests/fakes is shared by the helpers; make `tests.fakes` importable
    sys.path.insert(0, str(REPO))

from demo.neighbours import line  # noqa: E402
from tests.fakes.clock import FakeClock  # noqa: E402
from tests.fakes.intake import Harness, make_settings, start_harness  # noqa: E402


@pytest.fixture
async def harness(tmp_path: Path) -> AsyncIterator[Harness]:
    h = await start_harness(make_settings(tmp_path))
    yield h
    await h.session.close()
    await h.service.stop()


@pytest.fixture
def alertmanager_available() -> None:
    # the current line's Alertmanager: MissingNeighbourError (a failure, not a skip) when not built
    assert line().alertmanager.exists()


@pytest.fixture
def fake_clock() -> Iterator[FakeClock]:
    yield FakeClock(start=time.time())
