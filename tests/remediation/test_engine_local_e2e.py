"""build_engine from settings alone: the local backend runs a real command, pages reach a real sink."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import cast

import pytest

from remediation.engine import RemediationEngine, build_engine
from remediation.metrics import RemediationMetrics
from remediation.settings import EnginePagerSettings, EngineSettings, LocalBackendSettings
from tests.fakes.clock import FakeClock
from tests.fakes.pager_sink import PagerSink
from tests.remediation.test_engine_support import CORRUPT_MODEL, LEAK, SCOPE, Rig


@pytest.mark.integration
async def test_settings_built_engine_acts_locally_and_pages_webhook(tmp_path: Path) -> None:
    sink = PagerSink()
    await sink.start()
    log = tmp_path / "restarts.log"
    script = "import sys; open(sys.argv[1], 'a').write(sys.argv[2] + '\\n')"
    settings = EngineSettings(
        scope=SCOPE,
        backend="local",
        local_backend=LocalBackendSettings(
            restart_command=(sys.executable, "-c", script, str(log), "{namespace}/{pod}")
        ),
        pager=EnginePagerSettings(kind="webhook", url=sink.url + "/page", retries=0),
    )
    clock = FakeClock()
    engine = cast(
        RemediationEngine, build_engine(settings, tmp_path / "gpupulse.db", RemediationMetrics(), clock)
    )
    helper = Rig(tmp_path, settings, clock=clock)
    helper.engine = engine
    try:
        await helper.fire(LEAK)
        assert log.read_text() == f"llm/{LEAK['pod']}\n"
        await helper.fire(CORRUPT_MODEL)
        (got,) = await sink.wait_for(1)
        assert got.path == "/page"
        assert got.body["signature"] == "model-artifact"
        assert got.body["target"]["pod"] == CORRUPT_MODEL["pod"]
        assert engine.stats()["incidents_open"] == 2
    finally:
        await engine.aclose()
        await sink.stop()
