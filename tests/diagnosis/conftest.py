"""The replayed stories' TSDB, backfilled once for every test of this directory that asks for it."""

from __future__ import annotations

import asyncio
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.diagnosis import replay_tsdb
from tests.fakes.prometheus_process import prometheus_available


@pytest.fixture(scope="session")
def tsdb(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    if not prometheus_available() or shutil.which("promtool") is None:
        pytest.skip("prometheus/promtool not installed")
    work = tmp_path_factory.mktemp("diagnosis")
    path = work / "tsdb"
    path.mkdir()
    asyncio.run(replay_tsdb.backfill(path, work))
    yield path
