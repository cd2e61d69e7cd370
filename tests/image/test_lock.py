"""Runtime dependencies are ranges in pyproject.toml and exact, hashed pins in requirements.lock; the
venv the tests run in has exactly those pins, so the image ships what was tested."""

from __future__ import annotations

import importlib.metadata
import re
import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[2]
PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s\\;]+)")


def _lock() -> dict[str, tuple[str, list[str]]]:
    """Name -> (version, hashes) of requirements.lock."""
    out: dict[str, tuple[str, list[str]]] = {}
    current = None
    for line in (ROOT / "requirements.lock").read_text().splitlines():
        if m := PIN.match(line):
            current = canonicalize_name(m.group(1))
            out[current] = (m.group(2), [])
        elif current and (h := re.search(r"--hash=sha256:([0-9a-f]{64})", line)):
            out[current][1].append(h.group(1))
        elif line and not line.startswith((" ", "#")):
            raise AssertionError(f"requirements.lock: not an exact pin: {line!r}")
    return out


def _runtime() -> list[Requirement]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return [Requirement(r) for r in project["dependencies"]]


def test_runtime_dependencies_are_ranges_not_pins() -> None:
    pinned = [str(r) for r in _runtime() if any(s.operator in ("==", "===") for s in r.specifier)]
    assert pinned == []


def test_the_lock_pins_every_runtime_dependency_within_its_range_with_hashes() -> None:
    lock = _lock()
    assert lock, "requirements.lock is empty"
    for requirement in _runtime():
        name = canonicalize_name(requirement.name)
        assert name in lock, f"{name} is not in requirements.lock: run scripts/lock"
        version, _ = lock[name]
        assert requirement.specifier.contains(version, prereleases=True), (
            f"{name}=={version} outside {requirement}"
        )
    assert all(hashes for _, hashes in lock.values()), "every pin carries its hashes"


def test_the_test_venv_has_exactly_the_locked_versions() -> None:
    drift = {}
    for name, (version, _) in _lock().items():
        try:
            installed = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            installed = None
        if installed != version:
            drift[name] = (version, installed)
    assert drift == {}, (
        f"(locked, installed): re-run scripts/setup, or scripts/lock after changing ranges: {drift}"
    )


def test_the_image_build_needs_no_registry_and_no_network() -> None:
    containerfile = (ROOT / "image" / "Containerfile").read_text()
    froms = [line.split()[1] for line in containerfile.splitlines() if line.startswith("FROM ")]
    assert froms == ["${BASE}"]  # the mmdebstrap root filesystem, never a registry image
    pip = [line for line in containerfile.splitlines() if "pip install" in line]
    assert pip and all("--no-index" in line for line in pip)
    script = (ROOT / "scripts" / "build-image").read_text()
    assert "--pull=never" in script and "--require-hashes" in script


def test_the_image_is_rebuilt_when_any_packaged_directory_changes() -> None:
    # scripts/build-image keys the image on the files it lists; a package missing there would ship
    # stale code from a reused image.
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    packaged = {p.rstrip("*") for p in pyproject["tool"]["setuptools"]["packages"]["find"]["include"]}
    script = (ROOT / "scripts" / "build-image").read_text()
    (listed,) = re.findall(r"source_key=\$\( \(find ([^\\]*)\\", script)
    assert packaged <= set(listed.split()), packaged - set(listed.split())
