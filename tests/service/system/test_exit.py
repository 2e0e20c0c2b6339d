"""exit_now: what the process said is out, its status is main's, and the interpreter's teardown never runs."""

from __future__ import annotations

import subprocess
import sys
import textwrap

from tests.harness.serving import ROOT

SCRIPT = textwrap.dedent(
    """
    import atexit, logging, sys
    from service.system.exit import exit_now

    logging.basicConfig(stream=sys.stderr, level=logging.INFO, format="%(message)s")
    atexit.register(lambda: print("teardown ran", flush=True))
    sys.stdout.write("answered, no newline yet")  # held in stdout's buffer: exit_now must flush it
    logging.getLogger("x").info("Finished server process")
    exit_now(7)
    """
)


def test_exit_now_flushes_and_ends_without_teardown():
    done = subprocess.run([sys.executable, "-c", SCRIPT], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 7
    assert done.stdout == "answered, no newline yet"  # flushed, and no atexit hook ran after it
    assert "Finished server process" in done.stderr
    assert "teardown ran" not in done.stdout + done.stderr
