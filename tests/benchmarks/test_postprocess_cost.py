"""benchmarks.postprocess_cost: post-processing's CPU per input, in-process, on the shared data."""

from __future__ import annotations

import pytest

from benchmarks.postprocess_cost import main
from benchmarks.realdata import SHARED, shared_available


@pytest.mark.shared
@pytest.mark.skipif(not shared_available(), reason=f"needs ../shared's checkpoints and data ({SHARED})")
def test_prints_a_figure_per_task_and_strategy(capsys: pytest.CaptureFixture[str]) -> None:
    figures = main(["--sentences", "32", "--repeats", "2"])
    assert set(figures) == {"classification", "ner simple", "ner first", "ner none"}
    assert all(0 < figure < 10_000 for figure in figures.values())
    printed = capsys.readouterr().out
    assert "bertcore from" in printed and "ner first:" in printed
