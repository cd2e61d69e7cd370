"""Which tests exercise a module: run pytest once with a call tracer and write the ids of the tests
during which a function of the module ran (scripts/mutation.py reads them to pick its tests).

Usage: python scripts/mutation_probe.py OUT.json MODULE.py [MODULE.py ...] -- PYTEST_ARGS ...

A test counts when any function or method defined in the module is called while the test (its
setup, call or teardown) runs, in the test's own thread, an asyncio task or a thread it starts;
module-level code (the import) does not count, since every importer would. Code run in a subprocess
is not seen. OUT.json holds {"modules": {MODULE.py: [test id, ...]}, "failed": [test id, ...]}; a
test that fails unmutated is listed apart, since a mutation run needs its tests green.
"""

from __future__ import annotations

import json
import os
import sys
import threading
from collections.abc import Generator, Sequence
from pathlib import Path
from types import FrameType
from typing import Any

import pytest


class Probe:
    """A pytest plugin that notes, per module, the tests during which one of its functions ran."""

    def __init__(self, modules: Sequence[str], root: Path) -> None:
        self._targets = {os.path.realpath(root / rel): rel for rel in modules}
        self._seen: dict[str, str | None] = {}  # co_filename -> the module it is (None: not one)
        self.hits: dict[str, set[str]] = {rel: set() for rel in modules}
        self.failed: set[str] = set()
        self._current: str | None = None

    def _module_of(self, filename: str) -> str | None:
        if filename not in self._seen:
            self._seen[filename] = self._targets.get(os.path.realpath(filename))
        return self._seen[filename]

    def _trace(self, frame: FrameType, event: str, arg: Any) -> None:
        # only "call" events reach a global trace function; returning None traces no lines
        current = self._current
        if current is not None and frame.f_code.co_name != "<module>":
            rel = self._module_of(frame.f_code.co_filename)
            if rel is not None:
                self.hits[rel].add(current)

    def pytest_sessionstart(self, session: pytest.Session) -> None:
        threading.settrace(self._trace)
        sys.settrace(self._trace)

    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        sys.settrace(None)
        threading.settrace(None)

    @pytest.hookimpl(wrapper=True)
    def pytest_runtest_protocol(self, item: pytest.Item, nextitem: pytest.Item | None) -> Generator[None]:
        self._current = item.nodeid
        try:
            return (yield)
        finally:
            self._current = None

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if report.failed:
            self.failed.add(report.nodeid)


def main(argv: Sequence[str]) -> int:
    if "--" not in argv or argv.index("--") < 2:
        print(__doc__.split("\n\n")[1], file=sys.stderr)
        return 2
    split = argv.index("--")
    out, modules, pytest_args = Path(argv[0]), list(argv[1:split]), list(argv[split + 1 :])
    probe = Probe(modules, Path.cwd())
    status = pytest.main(pytest_args, plugins=[probe])
    out.write_text(
        json.dumps(
            {
                "modules": {rel: sorted(ids - probe.failed) for rel, ids in probe.hits.items()},
                "failed": sorted(probe.failed),
            },
            indent=1,
        )
    )
    # failing tests are reported, not fatal: the caller leaves them out
    return 0 if status in (pytest.ExitCode.OK, pytest.ExitCode.TESTS_FAILED) else int(status)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
