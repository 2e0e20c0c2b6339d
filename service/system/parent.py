"""A child process that ends with its parent: the process-mode launcher's engine and front-ends.

Linux's PR_SET_PDEATHSIG has the kernel send the child a signal when the thread that started it ends, however it
ends (SIGKILL, an OOM kill). Without it a launcher killed with -9 left its engine and front-ends serving, with
nothing to restart them, holding the port against a new server."""

from __future__ import annotations

import ctypes
import signal
import sys

PR_SET_PDEATHSIG = 1


def end_with_parent(sig: int = signal.SIGTERM) -> None:
    """Ask the kernel for `sig` (a drain: SIGTERM) once the parent is gone; run in the child, before it execs (as
    a Popen's preexec_fn). Elsewhere than Linux, nothing."""
    if sys.platform == "linux":
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, sig, 0, 0, 0)
