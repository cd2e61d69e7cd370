"""How the controller opens its SQLite files (the inbox and the ledger): WAL, synchronous mode,
autocommit with explicit transactions, a busy timeout; integrity checks and setting a damaged file aside.
"""

from __future__ import annotations

import os
import sqlite3
import time
from pathlib import Path

from remediation.errors import StoreCorrupt

BUSY_TIMEOUT_MS = 10_000


def is_corruption(error: BaseException) -> bool:
    """True for SQLite's "database disk image is malformed" and "file is not a database"."""
    name = str(getattr(error, "sqlite_errorname", ""))
    return name.startswith(("SQLITE_CORRUPT", "SQLITE_NOTADB"))


def check_integrity(conn: sqlite3.Connection, path: Path) -> None:
    """Run PRAGMA quick_check (every page, no index cross-check); raise StoreCorrupt naming the file."""
    try:
        problems = [str(r[0]) for r in conn.execute("PRAGMA quick_check(5)").fetchall()]
    except sqlite3.DatabaseError as e:
        raise StoreCorrupt(f"{path}: {e}") from e
    if problems != ["ok"]:
        raise StoreCorrupt(f"{path}: integrity check failed: {'; '.join(problems)}")


def set_aside(path: Path, now: float) -> Path:
    """Move a database file and its WAL and shared-memory files out of the way; returns the new name."""
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(now))
    target = path.with_name(f"{path.name}.corrupt-{stamp}")
    for suffix in ("", "-wal", "-shm"):
        src = Path(f"{path}{suffix}")
        if src.exists():
            os.replace(src, Path(f"{target}{suffix}"))
    return target


def open_db(path: Path | str, synchronous: str = "FULL") -> sqlite3.Connection:
    """Open the shared controller database: WAL, given synchronous mode, autocommit, busy timeout."""
    if synchronous not in ("FULL", "NORMAL"):
        raise ValueError(f"synchronous must be FULL or NORMAL, not {synchronous!r}")
    db_path = Path(path)
    db_path.parent.mkdir(parents=True, exist_ok=True)
    # isolation_level=None: we issue BEGIN/COMMIT ourselves, so group commit is explicit
    conn = sqlite3.connect(
        db_path, isolation_level=None, check_same_thread=False, timeout=BUSY_TIMEOUT_MS / 1000
    )
    try:
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute(f"PRAGMA synchronous={synchronous}")
        conn.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}")
        conn.execute("PRAGMA foreign_keys=ON")
    except sqlite3.DatabaseError as e:
        conn.close()
        if is_corruption(e):
            raise StoreCorrupt(f"{db_path}: {e}") from e
        raise
    return conn
