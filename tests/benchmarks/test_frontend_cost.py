"""The front-end cost benchmark end to end: a real process-mode server with sleeping engine sessions, on tiny
models, two short cells."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest

from benchmarks import request_shapes
from benchmarks.frontend_cost import (
    COLUMNS,
    busy_cells,
    comparison,
    main,
    measuring_order,
    median_figures,
    parse_args,
    task_texts,
    workload,
)
from benchmarks.realdata import shared_available
from export.pipeline import export_checkpoint
from tests.export.embedding_models import write_base_model
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
    timing = ["--seconds", "1", "--warmup-seconds", "0.5", "--tokenizer-seconds", "0.1", "--rounds", "2"]
    report = main([*options, *timing])

    printed = capsys.readouterr().out
    assert "  change classify x4 (round 2): " in printed
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
        assert row["rounds"] == 2

    # the side-by-side table: a run against itself is 1.00 in every figure
    lines = comparison(report["runs"]["change"], report["runs"]["change"])
    assert len(lines) == 4 and all(line.count("(1.00)") == 5 for line in lines[2:])


def test_an_embed_cell_answers_every_request_with_vectors_the_sleeping_session_made_noise(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """embed (only where named): the native embed route of an embedding entry; the sleeping session's vectors are
    noise, so the answers' JSON holds values as long as a real model's, not zeros."""
    repository = tmp_path / "models"
    base = write_base_model(tmp_path / "tiny-base", "bert")
    export_checkpoint(str(base), "tiny-embed", repository, task="embedding", variants="fp32", pooling="mean")
    out = tmp_path / "frontend_cost.json"
    options = ["--repository", str(repository), "--workdir", str(tmp_path), "--json", str(out)]
    options += ["--tasks", "embed", "--sizes", "2", "--connections", "2", "--seconds", "1", "--warmup-seconds", "0.5"]
    report = main([*options, "--tokenizer-seconds", "0.1"])

    assert "| embed | 2 |" in capsys.readouterr().out
    row = report["runs"]["change"]["cells"]["embed x2"]
    assert row["errors"] == {} and row["answered"] == row["requests"] > 0
    assert row["rows"] == row["sequences"] == 2 * row["answered"]
    for figure in FIGURES:
        assert isinstance(row[figure], float) and math.isfinite(row[figure]) and row[figure] > 0, figure
    work = workload("embed", "tiny-embed", ["one text", "another text"], 2)
    assert work.path == "/v1/models/tiny-embed/embed" and work.requests[0] == (
        {"inputs": ["one text", "another text"]},
        2,
    )


def test_the_sleeping_session_answers_noise_for_token_scores_and_embeddings_and_zeros_for_the_rest() -> None:
    from types import SimpleNamespace

    from benchmarks.sleeping_session import SleepingSession

    outputs = [
        SimpleNamespace(name="start_logits", shape=["batch", "sequence"]),
        SimpleNamespace(name="sentence_embedding", shape=["batch", 8]),
        SimpleNamespace(name="logits", shape=["batch", 3]),
    ]
    session = SleepingSession(SimpleNamespace(get_outputs=lambda: outputs), fixed_s=0.0, per_token_s=0.0)
    feed = {"input_ids": np.zeros((2, 5), np.int64)}
    tokens, vectors, logits = session.run([o.name for o in outputs], feed)
    assert tokens.shape == (2, 5) and np.unique(tokens).size == 10
    assert vectors.shape == (2, 8) and np.unique(vectors).size == 16
    assert logits.shape == (2, 3) and not logits.any()
    again = session.run(["sentence_embedding"], feed)[0]
    assert not np.array_equal(again, vectors)  # the next values of the noise, not the same ones


def test_rounds_swap_the_order_and_report_each_figures_median() -> None:
    assert measuring_order(["base", "change"], 0) == ["base", "change"]
    assert measuring_order(["base", "change"], 1) == ["change", "base"]
    assert measuring_order(["change"], 1) == ["change"]
    rounds = [
        {"requests_per_s": 100.0, "engine_us_per_row": 50.0, "errors": {}, "cores": {"engine": 0.2, "front-ends": 0.9}},
        {"requests_per_s": 130.0, "engine_us_per_row": None, "errors": {"429": 2}, "cores": {"engine": 0.4}},
        {"requests_per_s": 90.0, "engine_us_per_row": 70.0, "errors": {"429": 1, "0": 1}, "cores": {"engine": 0.3}},
    ]
    combined = median_figures(rounds)
    assert combined["requests_per_s"] == 100.0
    assert combined["engine_us_per_row"] is None  # missing in a round: no median of the others alone
    assert combined["errors"] == {"0": 1, "429": 3}  # every round's failures count
    assert combined["cores"] == {"engine": 0.3, "front-ends": 0.9}
    assert combined["rounds"] == 3
    assert median_figures(rounds[:1]) is rounds[0]


def test_a_cell_measured_on_a_busy_machine_is_flagged() -> None:
    runs = {
        "base": {"cells": {"classify x1": {"other_cores": 0.02}, "ner x16": {"other_cores": 0.9}}},
        "change": {"cells": {"classify x1": {"other_cores": None}, "ner x16": {}}},  # unknown: no warning
    }
    assert busy_cells(runs) == [
        "base ner x16: WARNING: other programs used 0.90 cores of this machine while it was measured (beyond the "
        "server and this benchmark): the figures hold that work too; rerun on a quiet machine"
    ]
    rounds = [{"other_cores": 0.1}, {"other_cores": 0.8}, {"other_cores": 0.05}]
    assert median_figures(rounds)["other_cores"] == 0.1  # one busy round of three is outvoted, as every figure


def test_long_documents_are_a_task_of_their_own_on_the_qa_route() -> None:
    """qa-long (only where named): SQuAD questions with their article's paragraphs joined to a long document, sent
    to the QA route of the QA entry; the default run keeps its four tasks."""
    assert parse_args([]).tasks == ["classify", "ner", "qa", "rerank"]
    assert parse_args(["--tasks", "qa,qa-long"]).tasks == ["qa", "qa-long"]
    pairs, source = task_texts("qa-long", 8)
    work = workload("qa-long", "reader", pairs, 2)
    assert work.path == "/v1/models/reader/qa" and len(work.requests) == len(pairs) // 2
    body, inputs = work.requests[0]
    assert inputs == 2 and body["inputs"][0] == {"question": pairs[0][0], "context": pairs[0][1]}
    if shared_available():
        assert "600 words" in source and len(pairs) == 8
        assert all(len(context.split()) == request_shapes.QA_CONTEXT_WORDS for _, context in pairs)


def test_long_texts_are_tasks_of_their_own_on_their_routes() -> None:
    """classify-long and ner-long (only where named): texts long enough for the tokenizer pool, on the classify and
    NER routes of those entries."""
    assert parse_args(["--tasks", "classify-long,ner-long"]).tasks == ["classify-long", "ner-long"]
    for task, route in (("classify-long", "classify"), ("ner-long", "ner")):
        texts, source = task_texts(task, 6)
        work = workload(task, "entry", texts, 3)
        assert work.path == f"/v1/models/entry/{route}" and len(work.requests) == 2
        assert work.requests[0] == ({"inputs": texts[:3]}, 3)
        if shared_available():
            assert len(texts) == 6 and all(isinstance(text, str) for text in texts)
            assert min(len(text) for text in texts) > 100 and "sentences a text" in source
