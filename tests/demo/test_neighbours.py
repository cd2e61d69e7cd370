"""demo/neighbours.py: the one place naming the binaries tests, replays and the demo run on."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from demo.neighbours import CURRENT, DEBIAN, LINES, Line, MissingNeighbourError, line, pins


def test_the_current_line_is_the_pinned_build_and_reports_its_version() -> None:
    current = line()
    assert current.name == CURRENT == LINES[0]
    version = pins()["prometheus"].version  # v0.316.0 -> 3.16.0
    for tool in (current.prometheus, current.promtool):
        out = subprocess.run([tool, "--version"], capture_output=True, text=True, timeout=30, check=True)
        assert f"version 3.{int(version.split('.')[1][1:])}." in out.stdout + out.stderr
    for tool in (current.alertmanager, current.amtool):
        out = subprocess.run([tool, "--version"], capture_output=True, text=True, timeout=30, check=True)
        assert f"version {pins()['alertmanager'].version[1:]}" in out.stdout + out.stderr


def test_the_debian_line_is_2_42_from_usr_bin() -> None:
    debian = line(DEBIAN)
    assert debian.prometheus == Path("/usr/bin/prometheus")
    assert debian.alertmanager == Path("/usr/bin/prometheus-alertmanager")
    out = subprocess.run(
        [debian.promtool, "--version"], capture_output=True, text=True, timeout=30, check=True
    )
    assert "version 2.42." in out.stdout + out.stderr


def test_an_unbuilt_pin_raises_naming_the_script(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("GPUPULSE_NEIGHBOURS", str(tmp_path))
    # a binary without its .built stamp (an interrupted build) is not taken either
    folder = tmp_path / f"prometheus-{pins()['prometheus'].version}" / "bin"
    folder.mkdir(parents=True)
    (folder / "promtool").write_text("#!/bin/sh\n")
    (folder / "promtool").chmod(0o755)
    with pytest.raises(MissingNeighbourError, match="run scripts/neighbours prometheus"):
        line().binary("promtool")


def test_a_missing_debian_binary_raises_naming_the_package(tmp_path: Path) -> None:
    with pytest.raises(MissingNeighbourError, match="apt-get install prometheus"):
        Line(DEBIAN, debian_bin=tmp_path).binary("amtool")


def test_an_unknown_line_is_refused() -> None:
    with pytest.raises(ValueError, match=r"unknown line '2\.x'"):
        line("2.x")
