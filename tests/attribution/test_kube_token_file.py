"""--kube.token-file (formerly --attribution.kube-token-file): the bearer token of the pod and
ResourceSlice watches, for an exporter outside a pod (the training replays run it against the
in-process API server), else the service account's token. The replays' pod watch fails without it
(tests/alerts/test_training_replay.py)."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from exporter.attribution import collector as attribution
from exporter.collectors.plugin import PluginContext
from exporter.kube import flags as kube_flags
from exporter.kube.client import ApiSettings
from exporter.kube.context import KubeContext

SOCKET = "--attribution.kubelet-socket=/run/k.sock"


def _collector(*argv: str) -> attribution.AttributionCollector:
    parser = argparse.ArgumentParser()
    kube_flags.add_arguments(parser)
    attribution.add_arguments(parser)
    args = parser.parse_args(list(argv))
    built = attribution.from_args(args, PluginContext(KubeContext(kube_flags.api_settings(args))))
    assert built is not None
    return built


@pytest.mark.parametrize("flag", ["--kube.token-file", "--attribution.kube-token-file"])
def test_the_token_file_reaches_both_watches(tmp_path: Path, flag: str) -> None:
    token = tmp_path / "token"
    attr = _collector(SOCKET, "--kube.node-name=gpu-7", f"{flag}={token}")
    assert attr.pods is not None and attr.slices is not None
    assert attr.pods.store.settings.token_path == token
    assert attr.slices._settings.token_path == token


def test_without_the_flag_the_service_account_token_is_read() -> None:
    attr = _collector(SOCKET, "--kube.node-name=gpu-7")
    assert attr.pods is not None
    assert attr.pods.store.settings.token_path == ApiSettings.token_path
    assert str(ApiSettings.token_path) == "/var/run/secrets/kubernetes.io/serviceaccount/token"
