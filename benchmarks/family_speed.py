"""Issue 31's encoder families: export cost, fused operators, and raw fp32 speed of ONNX Runtime vs PyTorch eager.

Per family: the tiny test checkpoint (tests/tiny_models.py, classification) exported with the default variants
(seconds, and the fp32 graph's fused operators with model.json's attention_fusion); then a MiniLM-sized
random-weight classifier of the same family (6 layers, hidden 384, 12 heads, FFN 1536; MobileBERT in its own
shape) exported fp32, and one batch shape (8 x 64 tokens, padded rows) timed in both runtimes on the same threads,
interleaved: the median of `--runs` each.

    python -m benchmarks.family_speed [--families xlnet,ernie] [--threads 1] [--runs 30]
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import onnxruntime as ort
import torch
from transformers import AutoModelForSequenceClassification

from benchmarks.reports import write_report
from export.pipeline import export_checkpoint
from export.quiet import quiet_libraries
from tests.tiny_models import FAMILIES, write_tiny_checkpoint

MINILM = {"hidden_size": 384, "num_hidden_layers": 6, "num_attention_heads": 12, "intermediate_size": 1536}
# ELECTRA's narrower embeddings; MobileBERT's own shape (512 wide, 4 heads on a 128-wide bottleneck, FFN 512)
WIDER = {
    "electra": {"embedding_size": 128},
    "mobilebert": {
        "hidden_size": 512,
        "num_attention_heads": 4,
        "intermediate_size": 512,
        "embedding_size": 128,
        "intra_bottleneck_size": 128,
    },
}
ROWS, WIDTH = 8, 64


def feed(config: dict, pad_id: int, left: bool) -> dict[str, np.ndarray]:
    generator = np.random.default_rng(0)
    lengths = np.linspace(WIDTH // 4, WIDTH, ROWS).astype(int)
    ids = np.full((ROWS, WIDTH), pad_id, dtype=np.int64)
    mask = np.zeros((ROWS, WIDTH), dtype=np.int64)
    for row, n in enumerate(lengths):
        where = slice(WIDTH - n, WIDTH) if left else slice(0, n)
        ids[row, where] = generator.integers(10, 200, n)
        mask[row, where] = 1
    arrays = {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)}
    return {name: arrays[name] for name in config["inputs"]}


def speed(entry: Path, checkpoint: Path, threads: int, runs: int) -> dict[str, float]:
    config = json.loads((entry / "model.json").read_text())
    inputs = feed(config, config["tokenizer"]["pad_token_id"], config["tokenizer"]["padding_side"] == "left")
    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    session = ort.InferenceSession(str(entry / "model.fp32.onnx"), options, providers=["CPUExecutionProvider"])
    torch.set_num_threads(threads)
    model = AutoModelForSequenceClassification.from_pretrained(
        str(checkpoint), dtype=torch.float32, attn_implementation="eager"
    ).eval()
    tensors = {name: torch.from_numpy(array) for name, array in inputs.items()}
    onnx_ms, torch_ms = [], []
    with torch.no_grad():
        for run in range(runs + 3):  # three warm-up runs each, interleaved so that load hits both alike
            started = time.perf_counter()
            session.run(None, inputs)
            middle = time.perf_counter()
            model(**tensors)
            ended = time.perf_counter()
            if run >= 3:
                onnx_ms.append((middle - started) * 1000)
                torch_ms.append((ended - middle) * 1000)
    onnx, eager = statistics.median(onnx_ms), statistics.median(torch_ms)
    return {"onnxruntime_ms": round(onnx, 2), "pytorch_eager_ms": round(eager, 2), "speedup": round(eager / onnx, 2)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--families", default=",".join(FAMILIES))
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--runs", type=int, default=30)
    args = parser.parse_args()
    quiet_libraries()
    report: dict = {"shape": [ROWS, WIDTH], "threads": args.threads, "families": {}}
    with tempfile.TemporaryDirectory(prefix="family-speed-") as work:
        root = Path(work)
        for arch in args.families.split(","):
            tiny = write_tiny_checkpoint(root / f"tiny-{arch}", arch, "classification")
            started = time.perf_counter()
            tiny_config = export_checkpoint(str(tiny), f"tiny-{arch}", root / "models").config
            tiny_seconds = time.perf_counter() - started
            size = {**MINILM, **WIDER.get(arch, {})}
            checkpoint = write_tiny_checkpoint(root / f"minilm-{arch}", arch, "classification", **size)
            config = export_checkpoint(str(checkpoint), f"minilm-{arch}", root / "models", variants="fp32").config
            row = {
                "tiny_export_seconds": round(tiny_seconds, 2),
                "tiny_fused_operators": tiny_config["variants"]["fp32"]["fused_operators"],
                "tiny_int8_fused_operators": tiny_config["variants"]["int8"]["fused_operators"],
                "attention_fusion": config["attention_fusion"],
                "minilm_fused_operators": config["variants"]["fp32"]["fused_operators"],
                "minilm_fp32_max_abs_diff": config["variants"]["fp32"]["validation"]["max_abs_diff"],
                **speed(root / "models" / f"minilm-{arch}", checkpoint, args.threads, args.runs),
            }
            report["families"][arch] = row
            print(f"{arch}: {json.dumps(row)}", flush=True)
    write_report("family_speed", report)


if __name__ == "__main__":
    main()
