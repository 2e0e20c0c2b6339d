"""Ending a serving process once its work is done, without the interpreter's teardown.

A drained server has answered every request, stopped its executors, and flushed its spans (the lifespan and the
engine's `serve` do that) before its `main` returns. Left to itself, the interpreter would then finalize its
modules and run the native libraries' static destructors. About once in 15-40 stops of the demo container that
teardown aborted a server that had just stopped cleanly: `Finished server process`, then `terminate called without
an active exception` and exit 134 or 139 (seen with onnxruntime, tokenizers, grpcio and uvloop loaded, and
onnxruntime's own thread alive; which library's destructor it was is not known). An orchestrator counts such an
exit as a crash. So the serving entry points flush what Python holds (log handlers, stdout and stderr) and end the
process at once, with `main`'s status.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
from typing import NoReturn


def exit_now(code: int) -> NoReturn:
    """Flush the log handlers and the standard streams, then end the process with `code` (no finalization)."""
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):  # closed or broken: nothing more can be said through it
            stream.flush()
    os._exit(code)
