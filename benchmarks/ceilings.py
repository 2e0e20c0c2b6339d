"""Raw ceilings: the model alone on its task's real inputs (the 872 SST-2 dev sentences; CoNLL-2003 test sentences
for NER; SQuAD questions for QA), tokenized ahead and sorted by length.

ONNX Runtime with the entry's variant for the device (fp16 on CUDA, fp32 on the CPU) with host IO (numpy feeds)
and, on CUDA, device-resident IO (IO binding to OrtValues already on the GPU); PyTorch eager (SDPA attention)
and torch.compile on the checkpoint. Each figure is also taken at a fixed width (--fixed-length). `gpu_benchmark`
runs this as one subprocess per engine: a crash or a CUDA library clash then costs one figure, and the GPU
memory is free again before the server starts.

    python -m benchmarks.ceilings ort --entry ENTRY --device cuda --batch 256 --fixed-length 128 --out F.json
    python -m benchmarks.ceilings torch --entry ENTRY --checkpoint DIR --device cuda --compile --out F.json
"""

from __future__ import annotations

import argparse
import json
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np

from benchmarks.realdata import encoded_batches, texts_for
from export.quiet import quiet_libraries
from export.repository import read_config

CUDA = "CUDAExecutionProvider"
CPU = "CPUExecutionProvider"
SQUAD_LIMIT = 2000  # SQuAD questions for the QA ceiling (and gpu_benchmark's served QA load)
HEADS = {"classification": "SequenceClassification", "ner": "TokenClassification", "qa": "QuestionAnswering"}


def tokenized(
    entry: Path,
    batch_size: int,
    fixed_length: int,
    input_names: list[str],
    task: str = "classification",
    limit: int | None = None,
) -> dict[str, list[dict]]:
    """'sorted': padded numpy feeds of `batch_size` rows in length order; 'fixed N': the same padded to N. The
    task's real inputs: SST-2 dev sentences, CoNLL-2003 test sentences, SQuAD (question, context) pairs (one
    window each, the context cut at 384 tokens)."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(entry))
    texts = texts_for(task, task_limit(task, limit))
    firsts = [first for first, _ in texts]
    seconds = [second for _, second in texts] if task == "qa" else None
    encoded = tokenizer(firsts, seconds, truncation="only_second" if task == "qa" else True, max_length=384)
    lengths = [len(ids) for ids in encoded["input_ids"]]
    ordered = [texts[i] for i in sorted(range(len(texts)), key=lengths.__getitem__)]
    sets = {"sorted": encoded_batches(tokenizer, task, ordered, input_names, batch_size)}
    if fixed_length:
        sets[f"fixed {fixed_length}"] = [pad_to(feed, fixed_length) for feed in sets["sorted"]]
    return sets


def task_limit(task: str, limit: int | None) -> int | None:
    """The inputs taken: `limit` where given (0: all), else all but SQuAD's SQUAD_LIMIT questions."""
    if limit is not None:
        return limit or None
    return SQUAD_LIMIT if task == "qa" else None


def pad_to(feed: dict[str, np.ndarray], width: int) -> dict[str, np.ndarray]:
    """Every input cut or zero-padded (pad id 0, mask 0) to `width` columns."""
    return {name: np.pad(a[:, :width], ((0, 0), (0, max(0, width - a.shape[1])))) for name, a in feed.items()}


def timed(step: Callable, items: list, rows: int, seconds: float, sync: Callable[[], object] = lambda: None) -> dict:
    """One warm pass over `items` (every shape seen once), then whole passes until `seconds` have gone by."""
    started = time.perf_counter()
    for item in items:
        step(item)
    sync()
    first = time.perf_counter() - started
    passes, started = 0, time.perf_counter()
    while True:
        for item in items:
            step(item)
        sync()
        passes += 1
        elapsed = time.perf_counter() - started
        if elapsed >= seconds:
            break
    return {"sequences_per_s": round(rows * passes / elapsed, 1), "passes": passes, "first_pass_s": round(first, 3)}


def rows_of(batches: list[dict]) -> int:
    return sum(len(next(iter(feed.values()))) for feed in batches)


def ort_ceilings(
    entry: Path, device: str, sets: dict[str, list[dict]], seconds: float, cuda_options: dict[str, str]
) -> Iterator[tuple[str, object]]:
    import onnxruntime as ort

    config = read_config(entry)
    variant = config["default_variant"]["cuda" if device == "cuda" else "cpu"]
    options = ort.SessionOptions()
    options.log_severity_level = 3
    if device == "cpu":
        options.intra_op_num_threads = os.cpu_count() or 1
    providers: list = [(CUDA, {"device_id": "0", **cuda_options}), CPU] if device == "cuda" else [CPU]
    path = entry / config["variants"][variant]["file"]
    session = ort.InferenceSession(str(path), options, providers=providers)
    provider = session.get_providers()[0]
    if device == "cuda" and provider != CUDA:
        raise SystemExit(f"the CUDA provider did not start (onnxruntime {ort.__version__} runs on {provider})")
    yield from {"engine": "onnxruntime", "version": ort.__version__, "variant": variant, "provider": provider}.items()
    if device == "cuda":
        yield "cuda_options", session.get_provider_options()[CUDA]
    outputs = [o.name for o in session.get_outputs()]
    for label, batches in sets.items():
        rows = rows_of(batches)
        yield f"{label}, host IO", timed(lambda feed: session.run(None, feed), batches, rows, seconds)
        if device == "cuda":
            bindings = []
            for feed in batches:
                binding = session.io_binding()
                for name, array in feed.items():
                    binding.bind_ortvalue_input(name, ort.OrtValue.ortvalue_from_numpy(array, "cuda", 0))
                for name in outputs:
                    binding.bind_output(name, "cuda")
                bindings.append(binding)
            yield f"{label}, device IO", timed(session.run_with_iobinding, bindings, rows, seconds)


def torch_ceilings(
    checkpoint: Path, device: str, sets: dict[str, list[dict]], seconds: float, compile: bool, task: str
) -> Iterator[tuple[str, object]]:
    import torch
    import transformers

    dtype = torch.float16 if device == "cuda" else torch.float32
    model = (
        getattr(transformers, f"AutoModelFor{HEADS[task]}")
        .from_pretrained(str(checkpoint), dtype=dtype, attn_implementation="sdpa")
        .to(device)
    )
    model.eval()
    yield from {"engine": "torch", "version": torch.__version__, "dtype": str(dtype).removeprefix("torch.")}.items()
    if device == "cuda":
        yield "gpu", torch.cuda.get_device_name()
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    on_device = {
        label: [{name: torch.from_numpy(a).to(device) for name, a in feed.items()} for feed in batches]
        for label, batches in sets.items()
    }
    runners = {"eager": model}
    if compile:
        runners["compiled"] = torch.compile(model)  # compiled on its first pass: see first_pass_s
    with torch.inference_mode():
        for kind, runner in runners.items():
            for label, batches in on_device.items():
                figure = timed(lambda feed, r=runner: r(**feed), batches, rows_of(sets[label]), seconds, sync)
                yield f"{label}, {kind}", figure


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("engine", choices=["ort", "torch"])
    parser.add_argument("--entry", type=Path, required=True, help="the model-repository entry (tokenizer, ONNX)")
    parser.add_argument("--checkpoint", type=Path, help="the PyTorch checkpoint (torch only)")
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--fixed-length", type=int, default=128, help="also at this fixed width; 0: not")
    parser.add_argument("--seconds", type=float, default=3.0, help="timed passes last at least this long")
    parser.add_argument("--compile", action="store_true", help="torch: torch.compile as well as eager")
    parser.add_argument("--cuda-options", default="", help="CUDA provider options, e.g. sdpa_kernel=1,k=v")
    parser.add_argument("--limit", type=int, help=f"the task's first N inputs (default all; QA {SQUAD_LIMIT})")
    parser.add_argument("--out", type=Path, required=True, help="JSON written here")
    args = parser.parse_args()
    quiet_libraries()
    config = read_config(args.entry)
    sets = tokenized(args.entry, args.batch, args.fixed_length, config["inputs"], config["task"], args.limit)
    if args.engine == "ort":
        options = dict(item.split("=", 1) for item in args.cuda_options.split(",") if item)
        figures = ort_ceilings(args.entry, args.device, sets, args.seconds, options)
    else:
        if args.checkpoint is None:
            parser.error("torch needs --checkpoint")
        figures = torch_ceilings(args.checkpoint, args.device, sets, args.seconds, args.compile, config["task"])
    results: dict = {"batch": args.batch}
    for key, figure in figures:  # written after each figure: a run stopped later keeps what it measured
        results[key] = figure
        if isinstance(figure, dict):
            print(f"  {args.engine} {key}: {figure}", flush=True)
        args.out.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
