"""The controller's pod tells its own CLI where the controller is and where its token lies, so
`kubectl exec <pod> -- gpupulse-remediation status|pause|incidents` (NOTES, runbooks) needs no flags."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helm.installs import install_values


@pytest.mark.parametrize("port", [9836, 19000])
def test_the_pods_environment_names_the_controllers_url_and_token_file(tmp_path: Path, port: int) -> None:
    objects = install_values(tmp_path, "gpupulse", {"controller": {"port": port}}).objects
    [deploy] = [
        o for o in objects if o["kind"] == "Deployment" and o["metadata"]["name"].endswith("-controller")
    ]
    [container] = deploy["spec"]["template"]["spec"]["containers"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["GPUPULSE_REMEDIATION_URL"] == f"http://127.0.0.1:{port}"
    token_flag = next(a for a in container["args"] if a.startswith("--auth.token-file="))
    assert env["GPUPULSE_REMEDIATION_AUTH_TOKEN_FILE"] == token_flag.split("=", 1)[1]
    assert f"--web.listen-address=0.0.0.0:{port}" in container["args"]
