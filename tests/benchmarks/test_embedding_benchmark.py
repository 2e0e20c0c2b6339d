"""The embedding benchmark's own logic, without a server or Infinity: the request bodies, the error line a failed
server's log gives, the table (a failed and a not-run engine among measured ones) and the verdicts against issue
38's targets (an engine whose vectors are not the model's does not count)."""

from __future__ import annotations

from typing import Any

import numpy as np

from benchmarks.embedding_benchmark import (
    COLUMNS,
    cosines,
    embedding_cases,
    error_line,
    median_row,
    table,
    verdicts,
)

INFINITY_LOG = """\
INFO     starting
ERROR:    Traceback (most recent call last):
  File "/venv/lib/python3.11/site-packages/infinity_emb/transformer/embedder/optimum.py", line 88, in encode_core
    "token_embeddings": outputs["last_hidden_state"],
KeyError: 'last_hidden_state'

ERROR:    Application startup failed. Exiting.
"""


def sizes(rate_1: float, rate_16: float, statuses_16: dict[str, int] | None = None) -> dict[str, Any]:
    def row(rate: float, statuses: dict[str, int]) -> dict[str, Any]:
        return {"embeddings_per_s": rate, "p50_ms": 10.0, "p99_ms": 20.0, "statuses": statuses}

    return {"1 input": row(rate_1, {"200": 100}), "16 inputs": row(rate_16, statuses_16 or {"200": 10})}


def report(torch_cosine: float = 1.0) -> dict[str, Any]:
    return {
        "servers": {
            "bertserve fp32": {"min_cosine": 1.0, **sizes(90.0, 300.0), "recall@1": 63.61, "recall@10": 91.75},
            "bertserve int8": {"min_cosine": 0.9935, **sizes(120.0, 400.0, {"200": 9, "503": 1})},
            "Infinity torch (fp32)": {"min_cosine": torch_cosine, **sizes(50.0, 130.0)},
            "Infinity optimum (onnxruntime)": {"error": "exited with 3: KeyError: 'last_hidden_state'"},
            "Infinity other": {"not_run": "--infinity not given"},
        },
        "raw": {"batch 16, sorted by length": 320.0, "batch 16, data order": 280.0},
    }


def test_the_bodies_are_openai_embeddings_requests_of_1_and_16_sentences() -> None:
    sentences = [f"sentence {i}" for i in range(40)]
    cases = embedding_cases(sentences, "m", 4)
    bodies, counts, connections = cases["16 inputs"]
    assert len(bodies) == 2 and counts == [16, 16] and connections == 4
    assert bodies[1] == {"model": "m", "input": sentences[16:32]}
    bodies, counts, _ = cases["1 input"]
    assert len(bodies) == 40 and bodies[3] == {"model": "m", "input": ["sentence 3"]} and set(counts) == {1}


def test_a_failed_server_is_named_by_its_exception_line() -> None:
    assert error_line(INFINITY_LOG) == "KeyError: 'last_hidden_state'"
    ort = "onnxruntime.capi.onnxruntime_pybind11_state.Fail: [ONNXRuntimeError] : 1 : FAIL : Load model failed"
    assert error_line(f"a\n{ort}\nERROR:    Application startup failed. Exiting.\n") == ort
    assert error_line("no exception here\nthe last line\n\n") == "the last line"
    assert error_line("") == "no output"


def test_the_table_has_a_row_per_server_and_says_which_failed_or_did_not_run() -> None:
    lines = table(report())
    assert lines[0] == COLUMNS and len(lines) == 2 + 5 + 1
    assert lines[2] == "| bertserve fp32 | 90.0 | 10.0 | 20.0 | 300.0 | 10.0 | 20.0 | 1.0 | 63.61 / 91.75 |"
    assert "400.0 (1 not 200)" in lines[3] and lines[3].endswith("| 0.9935 | - |")
    assert "| Infinity optimum (onnxruntime) | failed: exited with 3: KeyError: 'last_hidden_state' |" in lines[5]
    assert "| Infinity other | not run: --infinity not given |" in lines[6]
    assert lines[7].startswith("| raw onnxruntime session") and "| 320.0 |" in lines[7]


def test_the_verdicts_compare_with_the_best_engine_that_serves_the_model() -> None:
    lines = verdicts(report())
    assert lines[0] == "16 inputs: bertserve fp32 / Infinity torch (fp32) = 2.31x (target >= 2x: met)"
    assert lines[1] == "1 input: bertserve fp32 / Infinity torch (fp32) = 1.80x (target >= 1.5x: met)"
    assert lines[2].startswith("16 inputs: bertserve fp32 / raw sorted batch-16 session = 93.8% (target >= 85%: met)")
    # vectors that are not the model's (a wrong pooling) are no comparison
    assert verdicts(report(torch_cosine=0.24))[0].startswith("16 inputs: no Infinity engine was measured")
    failed = report()
    failed["servers"]["bertserve fp32"] = {"error": "not ready"}
    assert verdicts(failed) == ["bertserve fp32 was not measured: no comparison"]


def test_the_rounds_give_their_medians_and_the_statuses_summed() -> None:
    rows = [
        {"connections": 4, "embeddings_per_s": r, "requests_per_s": r, "p50_ms": r, "p99_ms": r, "statuses": s}
        for r, s in ((10.0, {"200": 5}), (30.0, {"200": 7, "503": 1}), (20.0, {"200": 6}))
    ]
    merged = median_row(rows)
    assert merged["embeddings_per_s"] == merged["p99_ms"] == 20.0
    assert merged["statuses"] == {"200": 18, "503": 1} and merged["rounds"] == rows


def test_cosines_are_of_the_directions_only() -> None:
    reference = np.array([[1.0, 0.0], [0.0, 2.0]], dtype=np.float32)
    vectors = np.array([[3.0, 0.0], [1.0, 1.0]], dtype=np.float32)
    assert np.allclose(cosines(vectors, reference), [1.0, 2**-0.5])
