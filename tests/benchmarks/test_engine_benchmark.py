"""The engine benchmark end to end: a real engine process with sleeping sessions, fed by a client process."""

from __future__ import annotations

from pathlib import Path

import pytest

from benchmarks.engine_benchmark import measure, parse_args, row_lengths
from export.pipeline import export_checkpoint
from tests.harness.serving import ROOT


def test_a_sleeping_engine_answers_every_request_in_batches_within_the_budget(tiny_checkpoint, tmp_path: Path) -> None:
    export_checkpoint(str(tiny_checkpoint("bert", "classification")), "tiny", tmp_path, variants="fp32")
    options = ["--repository", str(tmp_path), "--model", "tiny", "--seconds", "1.5", "--warmup-seconds", "0.5"]
    args = parse_args([*options, "--connections", "2", "--in-flight", "4"])
    args.max_batch_size, args.max_batch_tokens = 32, 2048  # fewer shapes to warm
    lengths, _ = row_lengths()
    figures = measure(ROOT, args, lengths)
    assert set(figures["statuses"]) == {200} and figures["rows_per_s"] > 0
    assert 1 <= figures["rows_per_batch"] <= 32
    assert figures["padded_per_real_token"] >= 1.0
    assert 0 < figures["batch_time_share"] <= 1.05
    assert 0 < figures["p50_ms"] <= figures["p99_ms"]


def test_a_missing_entry_is_a_clear_error_not_a_dead_engine(tmp_path: Path) -> None:
    args = parse_args(["--repository", str(tmp_path), "--model", "demo-sentiment"])
    with pytest.raises(SystemExit, match="make demo"):
        measure(ROOT, args, [10])
