"""The replayed stories' TSDB, backfilled once per line for every test of this directory that asks for
it: `tsdb` on the current line (Prometheus 3.x), `debian_tsdb` on Debian's 2.42 (one smoke replay). A
missing binary fails the test (MissingNeighbourError), it does not skip."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

from demo.neighbours import CURRENT, DEBIAN
from tests.diagnosis import replay_tsdb


def _backfilled(tmp_path_factory: pytest.TempPathFactory, line_name: str) -> Path:
    work = tmp_path_factory.mktemp(f"diagnosis-{line_name}")
    path = work / "tsdb"
    path.mkdir()
    asyncio.run(replay_tsdb.backfill(path, work, line_name))
    return path


@pytest.fixture(scope="session")
def tsdb(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    yield _backfilled(tmp_path_factory, CURRENT)


@pytest.fixture(scope="session")
def debian_tsdb(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    yield _backfilled(tmp_path_factory, DEBIAN)
