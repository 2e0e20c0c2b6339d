"""fp32 vs static int8 vs dynamic int8 on the real architecture x task cells (the twelve, and the five ported into
XLM-RoBERTa and ELECTRA), in one run.

Per cell: the export with `--eval` on the shared data (SST-2 dev accuracy, CoNLL-2003 test entity F1, SQuAD
v1.1 EM/F1, each with agreement with fp32), batch invariance (the largest |difference| of any output between
an input run alone and the same input in data-order batches of 16 with real neighbours), served CPU
throughput (`python -m service --cpu-variant V`, requests of 16 inputs, 4 for QA, through HTTP at
saturation; the three servers run side by side and the loads alternate, so that other work on shared cores hits
each alike: the best of `--rounds` rounds per variant, and the speed-up as the median of each round's own
int8 / fp32 ratio, the two loads of a round measured back to back), and the variant `--cpu-variant auto` picks
under the default 0.5-point budget: fp32 where int8 loses more, else what a server started with
`--cpu-variant auto` chose by timing both at load on this CPU (its /v1/models cpu_variant_trial).

    python -m benchmarks.variant_benchmark [--conll-limit 1000] [--squad-limit 500] [--seconds 6] [--rounds 3]
        [--cells bert-sst2] [--reuse-exports] [--server-args "--cpu-streams 2"]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

import numpy as np
import onnxruntime as ort
from transformers import AutoTokenizer

from benchmarks.loadclient import run_load
from benchmarks.realdata import ALL_CELLS, SHARED, Cell, checkpoint_for, encoded_batches, shared_available, texts_for
from benchmarks.reports import write_report
from export.evaluation import DEFAULT_MAX_LOSS
from export.pipeline import export_checkpoint
from export.quiet import quiet_libraries
from export.repository import read_config
from tests.harness.serving import start_service

VARIANTS = ("fp32", "int8", "int8-dynamic")
EVAL_FILES = {
    "sst2": "data/sst2/dev.tsv",
    "conll03": "data/conll2003/test.txt",
    "squad": "data/squad/dev-v1.1-eval-half.json",
}
ENDPOINTS = {"classification": "classify", "ner": "ner", "qa": "qa"}


def cpu_flags() -> str:
    flags = set()
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("flags"):
            flags.update(line.split(":", 1)[1].split())
    model = next(
        (
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("model name")
        ),
        "unknown CPU",
    )
    vnni = "avx512_vnni" in flags or "avx_vnni" in flags
    kind = (
        "AVX-512 VNNI"
        if "avx512_vnni" in flags
        else ("AVX-VNNI" if vnni else ("AVX2 only" if "avx2" in flags else "no AVX2"))
    )
    return f"{model}, {os.cpu_count()} cores, {kind}"


def batch_invariance(entry: Path, config: dict, task: str, rows: int = 64) -> dict[str, float]:
    """Per variant, max |output alone - output in a data-order batch of 16|, over real tokens."""
    tokenizer = AutoTokenizer.from_pretrained(str(entry))
    texts = texts_for(task, rows)
    batched = encoded_batches(tokenizer, task, texts, config["inputs"], 16)
    alone = encoded_batches(tokenizer, task, texts, config["inputs"], 1)
    per_token = task != "classification"
    result = {}
    for variant in VARIANTS:
        if variant not in config["variants"]:
            continue
        session = ort.InferenceSession(
            str(entry / config["variants"][variant]["file"]), providers=["CPUExecutionProvider"]
        )
        together = [session.run(config["outputs"], feed) for feed in batched]
        worst = 0.0
        for index, feed in enumerate(alone):
            single = session.run(config["outputs"], feed)
            length = feed["input_ids"].shape[1]
            for mine, theirs in zip(single, together[index // 16], strict=True):
                row = theirs[index % 16 : index % 16 + 1]
                row = row[:, :length] if per_token else row
                worst = max(worst, float(np.abs(mine - row).max()))
        result[variant] = worst
    return result


def served_throughput(
    repository: Path, cell: Cell, seconds: float, rounds: int, server_args: list[str]
) -> dict[str, dict]:
    """One server per variant, all up at once; loads alternate between them (shared cores). Per variant the best
    round, with every round's figure under 'rounds' (in order, so that round k of two variants can be paired)."""
    texts = texts_for(cell.task, 400)
    size = 4 if cell.task == "qa" else 16
    inputs = [{"question": q, "context": c} for q, c in texts] if cell.task == "qa" else [t for t, _ in texts]
    bodies = [{"inputs": inputs[i : i + size]} for i in range(0, len(inputs) - size + 1, size)]
    path = f"/v1/models/{cell.name}/{ENDPOINTS[cell.task]}"
    servers = {}
    try:
        for variant in VARIANTS:
            servers[variant] = start_service(
                repository,
                *("--log-level", "warning", "--access-log", "off"),  # else ~5,000 access lines a cell in the output
                *("--device", "cpu", "--cpu-variant", variant, "--models", cell.name),
                *server_args,
            )
            info = servers[variant].client().get(f"/v1/models/{cell.name}").json()
            assert info["variant"] == variant, info
            run_load(servers[variant].url, path, bodies, [size] * len(bodies), 4, 2.0)  # warm-up
        best: dict[str, dict] = {}
        every: dict[str, list[float]] = {variant: [] for variant in servers}
        for _ in range(rounds):
            for variant, server in servers.items():
                load = run_load(server.url, path, bodies, [size] * len(bodies), 4, seconds).summary()
                every[variant].append(load["sequences_per_s"])
                if variant not in best or load["sequences_per_s"] > best[variant]["sequences_per_s"]:
                    best[variant] = {"inputs_per_request": size, **load}
    finally:
        for server in servers.values():
            server.stop()
    return {variant: {**figures, "rounds": every[variant]} for variant, figures in best.items()}


def auto_choice(repository: Path, cell: Cell, server_args: list[str]) -> dict:
    """What `--cpu-variant auto` serves on this CPU: a server started with it, its model's variant and load trial."""
    server = start_service(
        repository,
        *("--log-level", "warning", "--access-log", "off", "--device", "cpu", "--cpu-variant", "auto"),
        *("--models", cell.name, *server_args),
    )
    try:
        info = server.client().get(f"/v1/models/{cell.name}").json()
    finally:
        server.stop()
    return {"variant": info["variant"], "trial": info.get("cpu_variant_trial")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/bertserve-variants"))
    parser.add_argument("--sst2-limit", type=int, default=None, help="SST-2 dev sentences (872 in all)")
    parser.add_argument("--conll-limit", type=int, default=1000, help="CoNLL-2003 test sentences (3,453 in all)")
    parser.add_argument("--squad-limit", type=int, default=500, help="SQuAD questions (5,609 in all)")
    parser.add_argument("--seconds", type=float, default=6.0, help="load per served variant and round")
    parser.add_argument(
        "--rounds",
        type=int,
        default=3,
        help="served loads per variant, alternating; the best kept (on shared cores one round can run 30%% slow)",
    )
    parser.add_argument("--cells", default="", help="comma-separated ARCH-DATASET (default: all seventeen)")
    parser.add_argument(
        "--reuse-exports",
        action="store_true",
        help="serve the entries already in WORKDIR/models as they are (their recorded accuracy, no new export)",
    )
    parser.add_argument("--server-args", default="", help="more settings for every server, e.g. '--cpu-streams 2'")
    args = parser.parse_args()
    if not shared_available():
        raise SystemExit("../shared is absent: the real checkpoints and data are needed")
    quiet_libraries()
    limits = {"sst2": args.sst2_limit, "conll03": args.conll_limit, "squad": args.squad_limit}
    wanted = set(filter(None, args.cells.split(",")))
    cpu = cpu_flags()
    print(f"CPU: {cpu}", flush=True)
    report: dict = {
        "cpu": cpu,
        "server_args": args.server_args,
        "limits": "as each entry was exported" if args.reuse_exports else limits,
        "budget_points": DEFAULT_MAX_LOSS,
        "cells": {},
    }
    repository = args.workdir / "models"
    for cell in ALL_CELLS:
        if wanted and f"{cell.arch}-{cell.dataset}" not in wanted:
            continue
        started = time.perf_counter()
        entry = repository / cell.name
        if args.reuse_exports and (entry / "model.json").is_file():
            config = read_config(entry)  # its accuracy figures are the ones measured when it was exported
        else:
            checkpoint = checkpoint_for(cell, args.workdir / "checkpoints")
            config = export_checkpoint(
                str(checkpoint),
                cell.name,
                repository,
                variants=",".join(VARIANTS),
                eval_path=SHARED / EVAL_FILES[cell.dataset],
                eval_limit=limits[cell.dataset],
                max_accuracy_loss=100.0,  # keep every variant to measure it; auto's choice is judged below at 0.5
            ).config
        accuracy = {v: config["variants"][v]["accuracy"] for v in VARIANTS}
        int8 = accuracy["int8"]
        auto = auto_choice(repository, cell, args.server_args.split())
        row = {
            "evaluated_examples": config["evaluation"]["examples"],
            "accuracy": accuracy,
            "batch_invariance": batch_invariance(entry, config, cell.task),
            "served": served_throughput(repository, cell, args.seconds, args.rounds, args.server_args.split()),
            "auto_picks": auto["variant"] if int8["loss_points"] <= DEFAULT_MAX_LOSS else "fp32",
            "auto_trial": auto["trial"],
            "seconds": round(time.perf_counter() - started, 1),
        }
        report["cells"][cell.name] = row
        print(f"{cell.name}: {json.dumps(row)}", flush=True)
    print_table(report)
    write_report("variant_benchmark", report)


def print_table(report: dict) -> None:
    print(f"\nCPU: {report['cpu']}; eval limits {report['limits']}")
    print(
        "\n| cell | metric | fp32 | int8 (static) | int8-dynamic | agreement int8 / dyn | alone vs batched int8 / dyn "
        "| served seq/s fp32 / int8 / dyn | int8 / fp32, median (range) of rounds | auto |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for name, row in report["cells"].items():
        acc, inv, served = row["accuracy"], row["batch_invariance"], row["served"]
        metric = f"{acc['fp32']['metric']} on {row['evaluated_examples']}"
        scores = " | ".join(_scores(acc[v]) for v in VARIANTS)
        rates = [served[v]["sequences_per_s"] for v in VARIANTS]
        ratios = paired_ratios(served["int8"]["rounds"], served["fp32"]["rounds"])
        print(
            f"| {name} | {metric} | {scores} | {100 * acc['int8']['agreement']:.2f}% / "
            f"{100 * acc['int8-dynamic']['agreement']:.2f}% | {inv['int8']:.1e} / {inv['int8-dynamic']:.1e} | "
            f"{rates[0]} / {rates[1]} / {rates[2]} | {statistics.median(ratios):.2f}x "
            f"({min(ratios):.2f}-{max(ratios):.2f}) | {row['auto_picks']} |"
        )


def paired_ratios(faster: list[float], base: list[float]) -> list[float]:
    """Round k's ratio of two variants' figures, each round's loads run back to back: a slow stretch of a shared
    machine hits both figures of a round, where a best-of-rounds ratio can pair a fast round with a slow one."""
    return [f / b for f, b in zip(faster, base, strict=True) if b > 0]


def _scores(record: dict) -> str:
    return "/".join(f"{value:.2f}" for key, value in record["scores"].items() if key != "precision" and key != "recall")


if __name__ == "__main__":
    main()
