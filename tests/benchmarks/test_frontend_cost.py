"""The front-end cost benchmark end to end: a real process-mode server with sleeping engine sessions, on tiny
models, two short cells."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from benchmarks.frontend_cost import COLUMNS, comparison, main
from export.pipeline import export_checkpoint
from tests.tiny_models import CROSS_ENCODER

FIGURES = (
    "requests_per_s",
    "sequences_per_s",
    "frontend_us_per_request",
    "frontend_us_per_sequence",
    "tokenizer_us_per_sequence",
    "frontend_per_tokenizer",
    "engine_us_per_row",
)


def test_a_classify_and_a_rerank_cell_report_every_figure_and_no_error(
    tiny_checkpoint, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    repository = tmp_path / "models"
    export_checkpoint(str(tiny_checkpoint("bert", "classification")), "tiny-classify", repository, variants="fp32")
    cross_encoder = tiny_checkpoint("bert", "classification", **CROSS_ENCODER)
    export_checkpoint(str(cross_encoder), "tiny-rerank", repository, variants="fp32")
    out = tmp_path / "frontend_cost.json"
    options = ["--repository", str(repository), "--workdir", str(tmp_path), "--json", str(out)]
    options += ["--tasks", "classify,rerank", "--sizes", "4", "--connections", "4"]
    report = main([*options, "--seconds", "1", "--warmup-seconds", "0.5", "--tokenizer-seconds", "0.1"])

    printed = capsys.readouterr().out
    header = next(line for line in printed.splitlines() if line.startswith("| task | inputs |"))
    assert all(heading in header for heading, _, _ in COLUMNS) and "errors" in header
    assert "| classify | 4 |" in printed and "| rerank | 4 |" in printed
    assert json.loads(out.read_text())["entries"] == {"classify": "tiny-classify", "rerank": "tiny-rerank"}

    cells = report["runs"]["change"]["cells"]
    assert set(cells) == {"classify x4", "rerank x4"}
    for key, row in cells.items():
        assert row["errors"] == {} and row["answered"] == row["requests"] > 0, key
        for figure in FIGURES:
            assert isinstance(row[figure], float) and math.isfinite(row[figure]) and row[figure] > 0, (key, figure)
        assert row["sequences"] == 4 * row["answered"]
        assert row["frontend_us_per_request"] == pytest.approx(4 * row["frontend_us_per_sequence"], rel=0.01)
        assert row["rows"] == row["sequences"]  # one row per sentence or (query, document) pair

    # the side-by-side table: a run against itself is 1.00 in every figure
    lines = comparison(report["runs"]["change"], report["runs"]["change"])
    assert len(lines) == 4 and all(line.count("(1.00)") == 5 for line in lines[2:])
