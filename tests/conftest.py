"""Suite-wide collection: which tests must share one pytest-xdist worker.

`scripts/test` runs the suite on several workers (`--dist loadgroup`): most tests wait on a real
Prometheus, Alertmanager or API server rather than on the CPU, so a 2-core machine runs several at
once. A session fixture that starts something expensive (a control plane, a backfilled TSDB, every
chart install) would be started once per worker; the tests that use it are kept on one worker, and
so are the tests of a module whose module-scoped fixture starts something (a Prometheus with data, a
controller), and the tests that share one image store.
"""

from __future__ import annotations

import pytest

# Session fixtures that start something expensive: their tests go to one worker per fixture.
_SHARED_FIXTURES = ("real_cluster", "tsdb", "debian_tsdb", "installs")
# Directories whose tests share state outside pytest (buildah's image store, the release registry).
_SHARED_DIRS = ("image",)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        group = _group_of(item)
        if group is not None:
            item.add_marker(pytest.mark.xdist_group(group))


def _group_of(item: pytest.Item) -> str | None:
    names = getattr(item, "fixturenames", ())
    for fixture in _SHARED_FIXTURES:
        if fixture in names:
            return fixture
    parts = item.path.parts
    for directory in _SHARED_DIRS:
        if "tests" in parts and directory in parts[parts.index("tests") + 1 : parts.index("tests") + 2]:
            return directory
    info = getattr(item, "_fixtureinfo", None)
    if info is not None:
        for name in names:
            if any(d.scope == "module" for d in info.name2fixturedefs.get(name, ())):
                return str(item.path)  # once per module, on one worker
    return None
