"""--attribution.kube-token-file: the bearer token of the pod and ResourceSlice watches, for an exporter
outside a pod (the training replays run it against the in-process API server), else the service
account's token. The replays' pod watch fails without it (tests/alerts/test_training_replay.py)."""

from __future__ import annotations

import argparse
from pathlib import Path

from exporter.attribution import collector as attribution
from exporter.kube.client import ApiSettings

SOCKET = "--attribution.kubelet-socket=/run/k.sock"


def _collector(*argv: str) -> attribution.AttributionCollector:
    parser = argparse.ArgumentParser()
    attribution.add_arguments(parser)
    built = attribution.from_args(parser.parse_args(list(argv)))
    assert built is not None
    return built


def test_the_token_file_reaches_both_watches(tmp_path: Path) -> None:
    token = tmp_path / "token"
    attr = _collector(
        SOCKET,
        "--attribution.node-name=gpu-7",
        "--attribution.dra-node-name=gpu-7",
        f"--attribution.kube-token-file={token}",
    )
    assert attr.settings.kube_token_path == str(token)
    assert attr._pods is not None and attr._slices is not None
    assert attr._pods._settings.token_path == token
    assert attr._slices._settings.token_path == token


def test_without_the_flag_the_service_account_token_is_read() -> None:
    attr = _collector(SOCKET, "--attribution.node-name=gpu-7")
    assert attr._pods is not None
    assert attr._pods._settings.token_path == ApiSettings.token_path
    assert str(ApiSettings.token_path) == "/var/run/secrets/kubernetes.io/serviceaccount/token"
