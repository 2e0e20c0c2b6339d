"""The Makefile's `make run` as a new user's shell sets it off: where it listens, by make's own variables or by the
server's settings, and not by a HOST that tcsh exports with the machine's name."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def served_on(*make_args: str, **environment: str) -> str:
    """`make -n run`'s server command (printed, not run): its --host and --port."""
    env = {key: value for key, value in os.environ.items() if key not in ("HOST", "PORT") and "BERTSERVE" not in key}
    done = subprocess.run(
        ["make", "-n", "run", *make_args],
        cwd=ROOT,
        env={**env, **environment},
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    (line,) = [line for line in done.stdout.splitlines() if " -m service " in line]
    words = line.split()
    return f"{words[words.index('--host') + 1]}:{words[words.index('--port') + 1]}"


@pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")
def test_make_run_listens_where_it_is_told() -> None:
    assert served_on() == "127.0.0.1:8000"
    assert served_on("HOST=0.0.0.0", "PORT=9000") == "0.0.0.0:9000"
    assert served_on(HOST="build-vm") == "127.0.0.1:8000"  # tcsh's HOST: the machine's name, not an address
    assert served_on(BERTSERVE_HOST="::1", BERTSERVE_PORT="8123") == "::1:8123"  # the settings, as documented
    assert served_on(PORT="7000") == "127.0.0.1:7000"
