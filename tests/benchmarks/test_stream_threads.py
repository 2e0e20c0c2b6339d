"""The stream-threads benchmark's measurements on a tiny real model: every caller's rows counted, lone calls timed."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from benchmarks.stream_threads import callers_rate, lone_ms, open_session
from export.pipeline import export_checkpoint


def test_callers_share_one_session_and_every_row_they_ran_is_counted(tiny_checkpoint, tmp_path: Path) -> None:
    export_checkpoint(str(tiny_checkpoint("bert", "classification")), "tiny", tmp_path, variants="fp32")
    session = open_session(tmp_path / "tiny" / "model.fp32.onnx", threads=1, spinning=False)
    names = [i.name for i in session.get_inputs()]

    def feed(rows: int, width: int) -> dict[str, np.ndarray]:
        return {name: np.ones((rows, width), np.int64) for name in names}

    calls = []
    real_run = session.run

    class Counting:  # the real session, its calls' row counts recorded
        def run(self, outputs: None, inputs: dict[str, np.ndarray]) -> list:
            calls.append(len(inputs[names[0]]))
            return real_run(outputs, inputs)

    rate = callers_rate(Counting(), [feed(16, 8), feed(3, 5)], callers=2, seconds=0.3)  # type: ignore[arg-type]
    assert set(calls) == {16, 3}  # both callers ran: each starts at its own feed
    assert 0 < rate <= sum(calls) / 0.3
    assert lone_ms(session, [feed(1, 4)] * 5) > 0
