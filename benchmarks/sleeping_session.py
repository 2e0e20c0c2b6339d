"""Model sessions that sleep as long as a GPU would compute and answer zeros, so that what an engine process does
outside the model shows in its CPU time (benchmarks.engine_benchmark, benchmarks.frontend_cost).

They go into an engine process that may run another checkout's code (a before/after comparison): so this module
imports nothing of the project at its top, and `copy_beside(directory)` writes its source there as MODULE_NAME,
for that process to import from its PYTHONPATH.
"""

from __future__ import annotations

import shutil
import sys
import time
from pathlib import Path
from typing import Any

MODULE_NAME = "bertserve_sleeping_session"


class SleepingSession:
    """A model's onnxruntime session that sleeps `fixed_s` + `per_token_s` per padded token of each batch and
    answers zeros of the real outputs' shapes; the rest (inputs, outputs, providers) is the real session's."""

    def __init__(self, real: Any, fixed_s: float, per_token_s: float) -> None:
        self.real = real
        self.fixed_s = fixed_s
        self.per_token_s = per_token_s
        self.outputs = {output.name: output.shape for output in real.get_outputs()}

    def __getattr__(self, name: str) -> Any:
        return getattr(self.real, name)

    def run(self, names: list[str], feed: dict[str, Any], options: Any = None) -> list[Any]:
        import numpy as np

        from service.engine.runtime import output_shape

        rows, width = next(iter(feed.values())).shape
        time.sleep(self.fixed_s + self.per_token_s * rows * width)
        return [np.zeros(output_shape(self.outputs[name], rows, width), np.float32) for name in names]


def sleep_on_load(engine_core: Any, fixed_s: float, per_token_s: float, announce: bool = False) -> None:
    """Wrap `engine_core.load` (service.engine.core.EngineCore) so that every model it loads sleeps; with
    `announce`, one line on stderr says how many."""
    load = engine_core.load

    def sleeping_load(self: Any) -> None:
        load(self)
        swapped = 0
        for model in self.models.values():
            if model.runtime is not None:
                model.runtime.session = SleepingSession(model.runtime.session, fixed_s, per_token_s)
                swapped += 1
        if announce:
            print(
                f"{MARK} in {swapped} model(s): {1000 * fixed_s:g} ms + {1e6 * per_token_s:g} us a padded token "
                "per batch",
                file=sys.stderr,
                flush=True,
            )

    engine_core.load = sleeping_load


MARK = "sleeping sessions"  # the start of the line `sleep_on_load(..., announce=True)` writes


def copy_beside(directory: Path) -> Path:
    """This module's source in `directory` as MODULE_NAME.py, importable by a process with `directory` on its path."""
    directory.mkdir(parents=True, exist_ok=True)
    target = directory / f"{MODULE_NAME}.py"
    shutil.copyfile(__file__, target)
    return target
