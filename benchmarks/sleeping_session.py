"""Model sessions that sleep as long as a GPU would compute and answer zeros, so that what an engine process does
outside the model shows in its CPU time (benchmarks.engine_benchmark, benchmarks.frontend_cost).

Zeros, except a score per token (QA's start and end logits: outputs of shape rows x width) and a sentence embedding
per row: those are noise, the same each run, so that a front-end picks answer spans among distinct scores as it
does on a real model's logits, and writes an embedding's values as long as a real one's. On zeros every span ties,
and the span search took another path than real answers take (`bertcore.tasks.qa`); a zero vector's values are
written as `0.0`, in a tenth of the time.
NER's logits (a vector per token) stay zeros: every token gets label 0, so NER's grouping of entities is cheaper
here than on real text.

They go into an engine process that may run another checkout's code (a before/after comparison): so this module
imports nothing of the project at its top, and `copy_beside(directory)` writes its source there as MODULE_NAME,
for that process to import from its PYTHONPATH.
"""

from __future__ import annotations

import math
import shutil
import sys
import time
from pathlib import Path
from typing import Any

MODULE_NAME = "bertserve_sleeping_session"
NOISE_SEED = 37
NOISE_VALUES = 1 << 20  # 4 MiB of float32: 64 full batches of 32 x 512 tokens
EMBEDDING_OUTPUT = "sentence_embedding"  # bertcore.tasks.embedding.OUTPUT (nothing of the project imported here)


class SleepingSession:
    """A model's onnxruntime session that sleeps `fixed_s` + `per_token_s` per padded token of each batch and
    answers zeros of the real outputs' shapes (a score per token: noise); the rest (inputs, outputs, providers) is
    the real session's."""

    def __init__(self, real: Any, fixed_s: float, per_token_s: float) -> None:
        import numpy as np

        self.real = real
        self.fixed_s = fixed_s
        self.per_token_s = per_token_s
        self.outputs = {output.name: output.shape for output in real.get_outputs()}
        # Drawn once: a batch's token scores are a slice of it, so that answering costs the engine ~no CPU
        self.noise = np.random.default_rng(NOISE_SEED).normal(0.0, 4.0, NOISE_VALUES).astype(np.float32)
        self.next_noise = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.real, name)

    def run(self, names: list[str], feed: dict[str, Any], options: Any = None) -> list[Any]:
        import numpy as np

        from service.engine.runtime import output_shape

        rows, width = next(iter(feed.values())).shape
        time.sleep(self.fixed_s + self.per_token_s * rows * width)
        answers = []
        for name in names:
            shape = output_shape(self.outputs[name], rows, width)
            noisy = shape == (rows, width) or name == EMBEDDING_OUTPUT
            answers.append(self.noise_of(shape) if noisy else np.zeros(shape, np.float32))
        return answers

    def noise_of(self, shape: tuple[int, ...]) -> Any:
        """The next values of the noise in `shape` (from its start again where it runs out)."""
        count = math.prod(shape)
        if self.next_noise + count > len(self.noise):
            self.next_noise = 0
        start = self.next_noise
        self.next_noise += count
        return self.noise[start : start + count].reshape(shape).copy()


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
