"""Export the twelve real architecture x task cells and report what the closing note of the export needs.

Per cell: export time, fused operators, fp32 and int8 max |diff| against PyTorch (the export's validation
shapes), and int8 agreement with fp32 on the shared evaluation data (SST-2 dev labels, CoNLL-2003 test token
tags, SQuAD answer spans), plus SST-2 accuracy of both. Prints a Markdown table; writes reports/export_report.json.

    python -m benchmarks.export_report [--squad-limit 1000] [--workdir /tmp/bertserve-report]
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np
import onnxruntime as ort
from transformers import AutoTokenizer

from benchmarks.realdata import CELLS, checkpoint_for, encoded_batches, shared_available, sst2, texts_for
from benchmarks.reports import write_report
from export.pipeline import export_checkpoint
from export.quiet import quiet_libraries
from export.validation import agreement


def evaluate_int8(entry: Path, config: dict, task: str, limit: int | None) -> dict:
    tokenizer = AutoTokenizer.from_pretrained(str(entry))
    texts = texts_for(task, limit)
    batches = encoded_batches(tokenizer, task, texts, config["inputs"], 16)
    sessions = {
        v: ort.InferenceSession(str(entry / f"model.{v}.onnx"), providers=["CPUExecutionProvider"])
        for v in ("fp32", "int8")
    }
    same, total, labels = 0, 0, {"fp32": [], "int8": []}
    for feed in batches:
        outs = {
            v: dict(zip(config["outputs"], s.run(config["outputs"], feed), strict=True)) for v, s in sessions.items()
        }
        mask = feed["attention_mask"].astype(bool)
        agree, count, unit = agreement(task, config["problem_type"], outs["fp32"], outs["int8"], mask)
        same, total = same + agree, total + count
        if task == "classification":
            for v in labels:
                labels[v].extend(outs[v]["logits"].argmax(-1).tolist())
    result = {"inputs": len(texts), "agreement": same / total, "of": unit, "units": total}
    if task == "classification":
        gold = np.array([label for _, label in sst2(limit)])
        result["accuracy"] = {v: float((np.array(p) == gold).mean()) for v, p in labels.items()}
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/bertserve-report"))
    parser.add_argument("--squad-limit", type=int, default=1000, help="SQuAD questions to compare (5,609 in all)")
    args = parser.parse_args()
    if not shared_available():
        raise SystemExit("../shared is absent: the real checkpoints and data are needed")
    quiet_libraries()
    rows = []
    for cell in CELLS:
        started = time.perf_counter()
        checkpoint = checkpoint_for(cell, args.workdir / "checkpoints")
        ported = time.perf_counter() - started
        result = export_checkpoint(str(checkpoint), cell.name, args.workdir / "models")
        config = result.config
        limit = args.squad_limit if cell.task == "qa" else None
        evaluation = evaluate_int8(result.entry, config, cell.task, limit)
        variants = config["variants"]
        rows.append(
            {
                "cell": cell.name,
                "task": cell.task,
                "port_seconds": round(ported, 1),
                "export_seconds": round(result.seconds, 1),
                "fused_operators": variants["fp32"]["fused_operators"],
                "layers": config["encoder"]["layers"],
                "fp32_max_abs_diff": variants["fp32"]["validation"]["max_abs_diff"],
                "int8_max_abs_diff": variants["int8"]["validation"]["max_abs_diff"],
                "fp16": variants["fp16"]["validation"],
                "sizes_mb": {v: round(e["size_bytes"] / 1e6, 1) for v, e in variants.items()},
                "int8_on_eval_data": evaluation,
            }
        )
        print(f"{cell.name}: done ({result.seconds:.1f} s)", flush=True)
    print()
    print("| cell | export s | fused (fp32) | fp32 max abs diff | int8 max abs diff | int8 agreement on eval data |")
    print("|---|---|---|---|---|---|")
    for row in rows:
        fused = row["fused_operators"]
        ops = f"Attention {fused.get('Attention', 0)}/{row['layers']}, " + ", ".join(
            f"{k} {v}" for k, v in fused.items() if k != "Attention"
        )
        ev = row["int8_on_eval_data"]
        agree = f"{100 * ev['agreement']:.2f}% of {ev['units']} {ev['of']} ({ev['inputs']} inputs)"
        if "accuracy" in ev:
            agree += f"; SST-2 acc fp32 {ev['accuracy']['fp32']:.4f}, int8 {ev['accuracy']['int8']:.4f}"
        print(
            f"| {row['cell']} | {row['export_seconds']} | {ops} | {row['fp32_max_abs_diff']:.1e} | "
            f"{row['int8_max_abs_diff']:.1e} | {agree} |"
        )
    write_report("export_report", rows)


if __name__ == "__main__":
    main()
