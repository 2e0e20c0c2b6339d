"""The base's readOnlyRootFilesystem, for real: the server, with the base's settings, in a mount namespace where
the whole root filesystem is read-only but for a tmpfs on /tmp (the pod's emptyDir) and the repository is a
read-only mount (the PVC), loads, answers, and drains and exits on SIGTERM. Needs root and mount namespaces
(`unshare`), as CI has; skipped, saying so, elsewhere."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from tests.deploy.manifests import ROOT
from tests.harness.environment import offline_env
from tests.harness.serving import ServiceProcess, free_port

UNSHARE = shutil.which("unshare")
MOUNT_POINT = Path("/srv")  # an empty folder of the Debian layout, where the repository is bind-mounted
STASH = Path("/mnt")  # another, where /tmp is set aside when this checkout lies under it


def namespaces_work() -> bool:
    if UNSHARE is None or os.geteuid() != 0 or not MOUNT_POINT.is_dir() or not STASH.is_dir():
        return False
    return subprocess.run([UNSHARE, "-m", "--propagation", "private", "true"], capture_output=True).returncode == 0


pytestmark = pytest.mark.skipif(
    not namespaces_work(), reason="needs root, unshare (util-linux) and mount namespaces, and the folders /srv and /mnt"
)


def keep_visible_under_tmp() -> tuple[str, str]:
    """Shell steps that keep this checkout (and its .venv) reachable when it lies under /tmp, as a clean clone
    may: the pod's tmpfs on /tmp would hide it. /tmp is bind-mounted aside first, then the checkout is bound
    back (read-only, like the rest of the root) over the tmpfs."""
    if not ROOT.is_relative_to("/tmp"):
        return "", ""
    aside = f"mount --bind /tmp {STASH} && "
    back = f' && mkdir -p "{ROOT}" && mount --bind "{STASH}/{ROOT.relative_to("/tmp")}" "{ROOT}"'
    return aside, back


def test_server_runs_on_a_read_only_root(pod_env: dict[str, str], deploy_repository: Path, tmp_path: Path) -> None:
    port = free_port()
    aside, back = keep_visible_under_tmp()
    script = (
        f'{aside}mount --bind "{deploy_repository}" {MOUNT_POINT} && mount -o remount,bind,ro {MOUNT_POINT}'
        f" && mount -o remount,bind,ro / && mount -t tmpfs -o size=64m tmpfs /tmp{back}"
        " && if touch /.bertserve-write-check 2>/dev/null; then echo 'root is writable'; exit 3; fi"
        f' && exec "{sys.executable}" -m service --repository {MOUNT_POINT} --host 127.0.0.1 --port {port}'
    )
    env = offline_env({**pod_env, "PYTHONUNBUFFERED": "1"})
    log_path = tmp_path / "server.log"
    with log_path.open("w") as log:
        process = subprocess.Popen(
            [UNSHARE, "-m", "--propagation", "private", "sh", "-c", script],
            cwd=ROOT,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    server = ServiceProcess(f"http://127.0.0.1:{port}", process, log_path)
    try:
        server.wait_ready(timeout=60)
        response = httpx.post(f"{server.url}/v1/models/tiny-sst2/classify", json={"inputs": ["fine"]}, timeout=30)
        assert response.status_code == 200, response.text
    finally:
        code = server.stop(signal.SIGTERM, timeout=float(pod_env["BERTSERVE_DRAIN_TIMEOUT_S"]) + 5)
    # uvicorn re-raises the signal once shut down: "terminated by SIGTERM" after a complete shutdown is a clean exit.
    assert code in (0, -signal.SIGTERM), server.log()[-3000:]
    assert "Application shutdown complete" in server.log(), server.log()[-3000:]
