"""serve_benchmark's ceiling: the raw session runs the graph the server serves, not always fp32."""

from __future__ import annotations

from pathlib import Path

from benchmarks.serve_benchmark import _session
from export.pipeline import export_checkpoint


def test_the_raw_session_opens_the_served_variants_graph(tiny_checkpoint, tmp_path: Path) -> None:
    export_checkpoint(str(tiny_checkpoint("bert", "classification")), "tiny", tmp_path, variants="fp32,int8")
    entry = tmp_path / "tiny"
    for variant in ("fp32", "int8"):
        session = _session(entry, 1, variant)
        assert Path(session._model_path) == entry / f"model.{variant}.onnx"  # onnxruntime keeps the path it opened
