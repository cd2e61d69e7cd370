"""The exporter's duration flags read the shared grammar (gpupulse.durations), as the controller's do."""

from __future__ import annotations

import pytest

from exporter import cli


def test_duration_flags_take_compound_durations_and_bare_seconds() -> None:
    args = cli.build_parser().parse_args(["--sampling.interval=1m30s", "--sampling.gpu-timeout=0.5"])
    settings = cli.settings_from_args(args)
    assert settings.sampling_interval_seconds == 90.0
    assert settings.gpu_call_timeout_seconds == 0.5


@pytest.mark.parametrize("bad", ["1s1m", "1.5s", "-1s", "1 s", ""])
def test_a_bad_duration_flag_exits_2_saying_why(bad: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as caught:
        cli.build_parser().parse_args([f"--sampling.interval={bad}"])
    assert caught.value.code == 2
    err = capsys.readouterr().err
    assert "--sampling.interval" in err
    assert "is not a duration" in err or "empty duration" in err
