"""Sentence embeddings beside Infinity (issue 38, item 4): the real all-MiniLM-L6-v2 checkpoint
(../shared/models/minilm-embed) served by bertserve and by Infinity (infinity-emb) on this machine in one run,
1-input and 16-input requests of the SST-2 dev sentences over OpenAI's embeddings API, a fixed number of
keep-alive connections:

1. the raw onnxruntime session (bertserve's exported fp32 model.fp32.onnx, the server's thread count) on the same
   sentences sorted by length in batches of 16 (the ceiling), and in data order;
2. bertserve fp32 and int8 (`python -m service`, POST /v1/embeddings), each with the recall@1 and @10 that the
   export's --eval measured on the shared SQuAD half (every question against its articles' paragraphs);
3. Infinity's torch engine (fp32) and its optimum engine (onnxruntime), POST /embeddings, started as
   ../shared/DESIGN.md section 8 says: `infinity_emb v2 --device cpu --no-compile --no-vector-disk-cache`; the
   optimum engine from inside a copy of the checkpoint's folder holding a `model.onnx` (the encoder's
   last_hidden_state, which Infinity pools itself), with `--model-id .` and `--no-model-warmup`.

Every server is started first (one after the other) and answers 16 sentences; its vectors' least cosine against
the raw fp32 session's is reported. A server that fails to start or to answer says so in its row (the error's one
line); the run goes on. Then --rounds rounds, each the raw session and, per request size, every server in turn
(idle servers wait beside the loaded one), and per figure the median over the rounds: on a shared machine, load
from elsewhere drifts, and a round puts every server under the same minute's drift. Servers listen on 127.0.0.1
only; every load ends after its --seconds (an answer may take 30 s more, no longer). The client and the servers
share this machine's cores: compare only the figures of one run.

    python -m benchmarks.embedding_benchmark [--infinity /path/to/infinity_emb] [--seconds 8] [--rounds 2]
        [--connections 4] [--warmup-seconds 2] [--engines torch,optimum] [--variants fp32,int8]
        [--eval-limit N] [--workdir /tmp/bertserve-embed-bench] [--json out.json]

Infinity is not a dependency of this project: install it in a venv of its own, e.g.
`python3 -m venv /tmp/infinity-venv && /tmp/infinity-venv/bin/pip install "torch==2.13.0"
"infinity-emb[server,torch,optimum]==0.0.78"`, and pass `--infinity /tmp/infinity-venv/bin/infinity_emb`.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from benchmarks.loadclient import LoadResult, run_load
from benchmarks.realdata import SHARED, sst2
from benchmarks.reports import write_report
from tests.harness.environment import offline_env
from tests.harness.serving import ServiceProcess, free_port, start_service

CHECKPOINT = SHARED / "models" / "minilm-embed"
SQUAD = SHARED / "data" / "squad" / "dev-v1.1-eval-half.json"
NAME = "minilm-embed"
BATCH = 16
CHECK_SENTENCES = 16
SIZES = {"1 input": 1, "16 inputs": 16}
ENGINES = ("torch", "optimum")
# Issue 38's targets: bertserve fp32 against Infinity's best engine, and against the raw sorted batch-16 session
TARGET_16, TARGET_1, TARGET_RAW = 2.0, 1.5, 0.85
SAME_VECTORS = 0.99  # the least cosine to the raw fp32 session's vectors for a server to count as serving the model
START_TIMEOUT_S = 300.0  # an Infinity engine may optimize its graph first; bertserve is ready in seconds
# `KeyError: 'x'`, `onnxruntime.capi.onnxruntime_pybind11_state.Fail: [ONNXRuntimeError] ...`: an exception's line
ERROR_LINE = re.compile(r"^(?:\w+\.)*\w*(?:Error|Exception|Fail|Failure|Exit)\b: ")


def error_line(log: str) -> str:
    """The line of a server's log that says what failed: the last exception line (`KeyError: '...'`), else its
    last line that is not empty."""
    lines = [line.strip() for line in log.splitlines() if line.strip()]
    errors = [line for line in lines if ERROR_LINE.match(line)]
    line = errors[-1] if errors else (lines[-1] if lines else "no output")
    return line[:300]


def cosines(vectors: np.ndarray, reference: np.ndarray) -> np.ndarray:
    a = vectors / np.maximum(np.linalg.norm(vectors, axis=1, keepdims=True), 1e-12)
    b = reference / np.maximum(np.linalg.norm(reference, axis=1, keepdims=True), 1e-12)
    return np.sum(a * b, axis=1)


def embedding_cases(sentences: list[str], model: str, connections: int) -> dict[str, tuple]:
    """label -> (bodies, sequences per body, connections): OpenAI embeddings bodies of 1 and 16 sentences, data
    order."""
    cases = {}
    for label, size in SIZES.items():
        bodies = [{"model": model, "input": sentences[i : i + size]} for i in range(0, len(sentences) - size + 1, size)]
        cases[label] = (bodies, [size] * len(bodies), connections)
    return cases


# --- the raw session -------------------------------------------------------------------------------------------


class RawSession:
    """bertserve's exported fp32 graph in a plain onnxruntime session (the server's session options), fed padded
    batches tokenized beforehand."""

    def __init__(self, entry: Path, variant_file: str, threads: int) -> None:
        import onnxruntime as ort
        from tokenizers import Tokenizer

        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        options.log_severity_level = 3
        self.session = ort.InferenceSession(str(entry / variant_file), options, providers=["CPUExecutionProvider"])
        self.names = [i.name for i in self.session.get_inputs()]
        config = json.loads((entry / "model.json").read_text())
        self.max_length = int(config["max_length"])
        self.pad_id = int(config["tokenizer"].get("pad_token_id") or 0)
        self.tokenizer = Tokenizer.from_file(str(entry / "tokenizer.json"))
        self.tokenizer.no_padding()
        self.tokenizer.enable_truncation(self.max_length)

    def token_ids(self, sentences: Sequence[str]) -> list[list[int]]:
        return [encoding.ids for encoding in self.tokenizer.encode_batch(list(sentences))]

    def feed(self, ids: list[list[int]]) -> dict[str, np.ndarray]:
        width = max(len(row) for row in ids)
        input_ids = np.full((len(ids), width), self.pad_id, dtype=np.int64)
        mask = np.zeros((len(ids), width), dtype=np.int64)
        for i, row in enumerate(ids):
            input_ids[i, : len(row)] = row
            mask[i, : len(row)] = 1
        arrays = {"input_ids": input_ids, "attention_mask": mask, "token_type_ids": np.zeros_like(input_ids)}
        return {name: arrays[name] for name in self.names}

    def embed(self, sentences: Sequence[str]) -> np.ndarray:
        (out,) = self.session.run(["sentence_embedding"], self.feed(self.token_ids(sentences)))
        return np.asarray(out, dtype=np.float32)

    def rate(self, batches: list[list[list[int]]], passes: int) -> float:
        """Embeddings per second over the batches (token ids), the median of `passes` passes after one warm-up."""
        feeds = [self.feed(batch) for batch in batches]
        rows = sum(len(batch) for batch in batches)
        self.session.run(None, feeds[0])
        rates = []
        for _ in range(passes):
            started = time.perf_counter()
            for feed in feeds:
                self.session.run(None, feed)
            rates.append(rows / (time.perf_counter() - started))
        return statistics.median(rates)

    def rates(self, sentences: list[str], passes: int) -> dict[str, float]:
        ids = self.token_ids(sentences)
        by_length = sorted(ids, key=len)
        return {
            "batch 16, sorted by length": round(
                self.rate([by_length[i : i + BATCH] for i in range(0, len(by_length), BATCH)], passes), 1
            ),
            "batch 16, data order": round(
                self.rate([ids[i : i + BATCH] for i in range(0, len(ids), BATCH)], passes), 1
            ),
        }


# --- the servers -----------------------------------------------------------------------------------------------


def vectors_of(url: str, path: str, model: str, sentences: list[str]) -> np.ndarray:
    """One request of `sentences` on OpenAI's embeddings schema; its vectors, in the sentences' order."""
    response = httpx.post(url + path, json={"model": model, "input": sentences}, timeout=120)
    if response.status_code != 200:
        raise RuntimeError(f"{path} answered {response.status_code}: {response.text.strip()[:300]}")
    data = sorted(response.json()["data"], key=lambda item: item["index"])
    if len(data) != len(sentences):
        raise RuntimeError(f"{path} answered {len(data)} vectors for {len(sentences)} sentences")
    return np.asarray([item["embedding"] for item in data], dtype=np.float32)


def wait_answering(server: ServiceProcess, path: str, model: str, timeout: float) -> None:
    """Until the server answers one embedding request with 200; its log's error line if it exits or cannot."""
    deadline = time.monotonic() + timeout
    last = "no answer"
    while time.monotonic() < deadline:
        if server.process.poll() is not None:
            raise RuntimeError(f"exited with {server.process.returncode}: {error_line(server.log())}")
        try:
            response = httpx.post(server.url + path, json={"model": model, "input": ["warm up"]}, timeout=30)
            if response.status_code == 200:
                return
            last = f"answered {response.status_code}: {response.text.strip()[:200]}"
            if response.status_code not in (404, 503):  # a server that is up and refuses will not change its mind
                break
        except httpx.TransportError as exc:
            last = f"{type(exc).__name__}"
        time.sleep(0.5)
    log_line = error_line(server.log())
    raise RuntimeError(f"{last}; log: {log_line}" if "no answer" not in last else f"not ready: {log_line}")


def load_row(load: LoadResult, connections: int) -> dict[str, Any]:
    summary = load.summary()
    return {
        "connections": connections,
        "embeddings_per_s": summary["sequences_per_s"],
        "requests_per_s": round(load.statuses.get(200, 0) / load.seconds, 1),
        "p50_ms": summary["p50_ms"],
        "p99_ms": summary["p99_ms"],
        "statuses": {str(status): count for status, count in sorted(summary["statuses"].items())},
    }


def median_row(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """Per figure, the median over the rounds; the statuses summed."""
    merged: dict[str, Any] = {
        key: round(statistics.median(row[key] for row in rows), 1)
        for key in ("embeddings_per_s", "requests_per_s", "p50_ms", "p99_ms")
    }
    statuses: dict[str, int] = {}
    for row in rows:
        for status, count in row["statuses"].items():
            statuses[status] = statuses.get(status, 0) + count
    return {"connections": rows[0]["connections"], **merged, "statuses": statuses, "rounds": rows}


@dataclass
class Running:
    """A server that started and answered: where its embeddings route is."""

    server: ServiceProcess
    path: str


def start_all(starts: dict[str, tuple[Callable[[], ServiceProcess], str]], report: dict[str, Any]) -> dict:
    """Start every server, one after the other; one that fails gets its row's error (one line), the rest go on."""
    running: dict[str, Running] = {}
    for label, (start, path) in starts.items():
        print(f"{label}: starting", flush=True)
        try:
            running[label] = Running(start(), path)
        except Exception as exc:  # a failing server is a row of the table, not the end of the run
            message = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            print(f"    failed: {message}", flush=True)
            report["servers"][label] = {"error": message[:400]}
    return running


def measure_all(
    running: dict[str, Running],
    raw: RawSession,
    sentences: list[str],
    reference: np.ndarray,
    args: argparse.Namespace,
    report: dict[str, Any],
) -> None:
    """Each server's vectors against the raw session's; then --rounds rounds, each the raw session and, per
    request size, every server in turn (a warm-up in the first round): figures of one moment side by side, the
    medians over the rounds reported."""
    loads: dict[str, dict[str, list[dict[str, Any]]]] = {label: {size: [] for size in SIZES} for label in running}
    for label, serving in list(running.items()):
        try:
            vectors = vectors_of(serving.server.url, serving.path, NAME, sentences[:CHECK_SENTENCES])
        except Exception as exc:  # answered at start, not now: its row says so
            report["servers"][label] = {"error": str(exc).splitlines()[0][:400]}
            serving.server.stop()
            del running[label], loads[label]
            continue
        report["servers"][label] = {"min_cosine": round(float(cosines(vectors, reference).min()), 6)}
    cases = embedding_cases(sentences, NAME, args.connections)
    raw_rates: list[dict[str, float]] = []
    for number in range(1, args.rounds + 1):
        raw_rates.append(raw.rates(sentences, args.raw_passes))
        print(f"round {number}: raw onnxruntime session (embeddings/s): {raw_rates[-1]}", flush=True)
        for size, (bodies, sizes, connections) in cases.items():
            for label, serving in running.items():
                url = serving.server.url
                if number == 1 and args.warmup_seconds > 0:
                    run_load(url, serving.path, bodies, sizes, connections, args.warmup_seconds)
                row = load_row(run_load(url, serving.path, bodies, sizes, connections, args.seconds), connections)
                loads[label][size].append(row)
                print(f"round {number}: {label}, {size}: {json.dumps(row)}", flush=True)
    report["raw"] = {key: round(statistics.median(r[key] for r in raw_rates), 1) for key in raw_rates[0]}
    report["raw_rounds"] = raw_rates
    for label, sizes_rows in loads.items():
        report["servers"][label].update({size: median_row(rows) for size, rows in sizes_rows.items()})


# --- bertserve -------------------------------------------------------------------------------------------------


def export_entry(repository: Path, variants: list[str], eval_path: Path | None, eval_limit: int | None) -> Path:
    """minilm-embed exported as its users export it (fp32 and int8, --eval on the SQuAD retrieval file), or the
    entry already there."""
    from export.pipeline import export_checkpoint

    entry = repository / NAME
    config_path = entry / "model.json"
    if config_path.is_file():
        config = json.loads(config_path.read_text())
        have = set(config["variants"]) | set(config.get("refused_variants", {}))
        if set(variants) <= have:
            print(f"export: reusing {entry}", flush=True)
            return entry
    print(f"export: {CHECKPOINT} -> {entry} ({','.join(variants)}, --eval {eval_path})", flush=True)
    started = time.perf_counter()
    export_checkpoint(
        str(CHECKPOINT),
        NAME,
        repository,
        variants=",".join(variants),
        eval_path=eval_path,
        eval_limit=eval_limit,
        progress=lambda line: print(f"    {line}", flush=True),
    )
    print(f"export: {time.perf_counter() - started:.0f} s", flush=True)
    return entry


def retrieval_file(workdir: Path) -> Path:
    from export.retrieval_data import from_squad

    path = workdir / "squad-retrieval.json"
    if not path.is_file():
        data = from_squad(json.loads(SQUAD.read_text(encoding="utf-8")))
        path.write_text(json.dumps(data, ensure_ascii=False) + "\n", encoding="utf-8")
    return path


def variant_record(config: dict[str, Any], variant: str) -> dict[str, Any]:
    """What the export says of a variant: its recall (where --eval measured it), or why it was refused."""
    entry = config["variants"].get(variant)
    if entry is None:
        refused = config.get("refused_variants", {}).get(variant)
        reason = refused["reason"] if refused else "not exported"
        record: dict[str, Any] = {"served": False, "reason": reason}
        accuracy = (refused or {}).get("accuracy", {})
    else:
        record = {"served": True, "file": entry["file"]}
        accuracy = entry.get("accuracy", {})
    if accuracy.get("measured"):
        scores = accuracy["scores"]
        record["recall@1"], record["recall@10"] = scores.get("recall@1"), scores.get("recall@10")
    return record


def bertserve_start(repository: Path, variant: str, threads: int, workdir: Path) -> Callable[[], ServiceProcess]:
    def start() -> ServiceProcess:
        server = start_service(
            repository,
            "--log-level",
            "warning",
            "--cpu-variant",
            variant,
            "--threads",
            str(threads),
            # capacity, not shedding, is measured: a queue bound the closed loops never reach
            "--max-queue-s",
            "20",
            log_path=workdir / f"bertserve-{variant}.log",
            wait=False,
        )
        try:
            server.wait_ready(timeout=START_TIMEOUT_S)
        except RuntimeError as exc:
            raise RuntimeError(error_line(str(exc))) from None
        return server

    return start


# --- Infinity --------------------------------------------------------------------------------------------------


def write_hidden_state_onnx(checkpoint: Path, path: Path) -> None:
    """The checkpoint's encoder (no pooling) as ONNX with the output Infinity's optimum engine reads,
    last_hidden_state; dynamic batch and sequence axes."""
    import torch
    from transformers import AutoModel, AutoTokenizer

    from export.graph import PositionalOutputs

    # float32 throughout: the checkpoint's weights may be stored in half precision
    model = AutoModel.from_pretrained(str(checkpoint), dtype=torch.float32).float().eval()
    tokenizer = AutoTokenizer.from_pretrained(str(checkpoint))
    example = tokenizer(["a short one", "a somewhat longer second sentence"], padding=True, return_tensors="pt")
    names = [name for name in ("input_ids", "attention_mask", "token_type_ids") if name in example]
    axes = {name: {0: "batch", 1: "sequence"} for name in names}
    axes["last_hidden_state"] = {0: "batch", 1: "sequence"}
    with torch.no_grad():
        torch.onnx.export(
            PositionalOutputs(model, names, ["last_hidden_state"]),
            tuple(example[name] for name in names),
            str(path),
            input_names=names,
            output_names=["last_hidden_state"],
            dynamic_axes=axes,
            opset_version=17,
            do_constant_folding=True,
            dynamo=False,
        )


def checkpoint_pooling() -> str:
    """The checkpoint's pooling as Infinity names it: mean, or cls."""
    config = json.loads((CHECKPOINT / "1_Pooling" / "config.json").read_text())
    return "mean" if config.get("pooling_mode_mean_tokens") else "cls"


def optimum_folder(workdir: Path) -> Path:
    """A copy of the checkpoint's folder with a model.onnx in it, where Infinity's optimum engine looks."""
    folder = workdir / "infinity-optimum-model"
    if not (folder / "model.onnx").is_file():
        shutil.rmtree(folder, ignore_errors=True)
        shutil.copytree(CHECKPOINT, folder, copy_function=shutil.copyfile)
        for path in folder.rglob("*"):  # the shared copy is read-only, and so would the copy's modes be
            path.chmod(0o755 if path.is_dir() else 0o644)
        folder.chmod(0o755)
        write_hidden_state_onnx(CHECKPOINT, folder / "model.onnx")
    return folder


def infinity_start(executable: Path, engine: str, workdir: Path) -> Callable[[], ServiceProcess]:
    def start() -> ServiceProcess:
        port = free_port()
        if engine == "optimum":
            cwd, model_id = optimum_folder(workdir), "."
        else:
            cwd, model_id = workdir, str(CHECKPOINT)
        command = [str(executable), "v2", "--model-id", model_id, "--served-model-name", NAME, "--engine", engine]
        command += ["--device", "cpu", "--no-compile", "--no-vector-disk-cache", "--host", "127.0.0.1"]
        command += ["--port", str(port), "--log-level", "warning"]
        if engine == "optimum":
            # its optimum engine pools the CLS token unless told the model's pooling (its default, auto, is not
            # read from 1_Pooling there); its warm-up feeds 514 tokens to a pipeline that does not truncate
            command += ["--pooling-method", checkpoint_pooling(), "--no-model-warmup"]
        # its own hub cache: the optimum engine keeps its optimized graph there, found again by the model id ('.')
        cache = workdir / f"infinity-cache-{engine}"
        shutil.rmtree(cache, ignore_errors=True)
        env = offline_env({"HF_HUB_CACHE": str(cache), "DO_NOT_TRACK": "1", "INFINITY_ANONYMOUS_USAGE_STATS": "0"})
        log_path = workdir / f"infinity-{engine}.log"
        print(f"    {' '.join(command)}  (in {cwd})", flush=True)
        with log_path.open("w") as log:
            process = subprocess.Popen(command, cwd=cwd, env=env, stdout=log, stderr=subprocess.STDOUT)
        server = ServiceProcess(f"http://127.0.0.1:{port}", process, log_path)
        try:
            wait_answering(server, "/embeddings", NAME, START_TIMEOUT_S)
        except Exception:
            server.stop()
            raise
        return server

    return start


# --- the report ------------------------------------------------------------------------------------------------

COLUMNS = "| server | 1 input: emb/s | p50 ms | p99 ms | 16 inputs: emb/s | p50 ms | p99 ms | cosine | recall@1 / @10 |"


def table(report: dict[str, Any]) -> list[str]:
    """The markdown table: one row per server, and the raw session's."""
    lines = [COLUMNS, "|---|---|---|---|---|---|---|---|---|"]
    for label, row in report["servers"].items():
        recall = f"{row['recall@1']} / {row['recall@10']}" if row.get("recall@1") is not None else "-"
        if "error" in row or "not_run" in row:
            what = f"not run: {row['not_run']}" if "not_run" in row else f"failed: {row['error']}"
            lines.append(f"| {label} | {what} | | | | | | | {recall} |")
            continue
        cells = []
        for size in SIZES:
            figures = row[size]
            errors = sum(count for status, count in figures["statuses"].items() if status != "200")
            rate = f"{figures['embeddings_per_s']}" + (f" ({errors} not 200)" if errors else "")
            cells += [rate, str(figures["p50_ms"]), str(figures["p99_ms"])]
        lines.append(f"| {label} | {' | '.join(cells)} | {row['min_cosine']} | {recall} |")
    raw = report.get("raw", {})
    if raw:
        sorted_rate = raw["batch 16, sorted by length"]
        lines.append(f"| raw onnxruntime session, fp32, batch 16 sorted by length | | | | {sorted_rate} | | | 1.0 | |")
    return lines


def verdicts(report: dict[str, Any]) -> list[str]:
    """bertserve fp32 against Infinity's best engine and against the raw session, beside issue 38's targets."""
    servers = report["servers"]
    ours = servers.get("bertserve fp32", {})
    if "error" in ours or "not_run" in ours or not ours:
        return ["bertserve fp32 was not measured: no comparison"]
    lines = []
    for size, target in (("16 inputs", TARGET_16), ("1 input", TARGET_1)):
        # an engine whose vectors are not the model's (cosine below SAME_VECTORS) is no comparison
        theirs = {
            label: row[size]["embeddings_per_s"]
            for label, row in servers.items()
            if label.startswith("Infinity")
            and size in row
            and row[size]["embeddings_per_s"] > 0
            and row["min_cosine"] >= SAME_VECTORS
        }
        if not theirs:
            lines.append(f"{size}: no Infinity engine was measured (target >= {target:g}x its best)")
            continue
        best = max(theirs, key=lambda label: theirs[label])
        ratio = ours[size]["embeddings_per_s"] / theirs[best]
        met = "met" if ratio >= target else "not met"
        lines.append(f"{size}: bertserve fp32 / {best} = {ratio:.2f}x (target >= {target:g}x: {met})")
    raw = report.get("raw", {}).get("batch 16, sorted by length")
    if raw:
        share = ours["16 inputs"]["embeddings_per_s"] / raw
        met = "met" if share >= TARGET_RAW else "not met"
        lines.append(
            f"16 inputs: bertserve fp32 / raw sorted batch-16 session = {share:.1%} "
            f"(target >= {TARGET_RAW:.0%}: {met}); raw in data order: {report['raw']['batch 16, data order']}/s"
        )
    return lines


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--infinity", type=Path, default=None, help="the infinity_emb executable (its own venv)")
    parser.add_argument("--seconds", type=float, default=8.0, help="each timed load, after its warm-up")
    parser.add_argument("--warmup-seconds", type=float, default=2.0, help="each load's warm-up, not counted")
    parser.add_argument("--connections", type=int, default=4, help="keep-alive connections of every load")
    parser.add_argument("--engines", default=",".join(ENGINES), help="Infinity's engines to run: torch,optimum")
    parser.add_argument("--variants", default="fp32,int8", help="bertserve's variants to serve (fp32 always)")
    parser.add_argument(
        "--threads", type=int, default=len(os.sched_getaffinity(0)), help="bertserve's and the raw session's"
    )
    parser.add_argument("--rounds", type=int, default=2, help="rounds of every load in turn; medians reported")
    parser.add_argument("--raw-passes", type=int, default=3, help="passes over the sentences; the median is reported")
    parser.add_argument("--sentences", type=int, default=None, help="only the first N SST-2 dev sentences")
    parser.add_argument("--eval-limit", type=int, default=None, help="the export's --eval-limit (SQuAD queries)")
    parser.add_argument("--no-eval", action="store_true", help="export without --eval (no recall)")
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/bertserve-embed-bench"))
    parser.add_argument("--json", type=Path, default=None, help="where the report goes (default reports/)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    from export.quiet import quiet_libraries

    if not (CHECKPOINT / "modules.json").is_file() or not (SHARED / "data" / "sst2" / "dev.tsv").is_file():
        raise SystemExit(f"{CHECKPOINT} or the SST-2 dev sentences are absent: the real checkpoint and data are needed")
    os.environ["HF_HUB_OFFLINE"] = "1"
    quiet_libraries()
    args.workdir.mkdir(parents=True, exist_ok=True)
    variants = ["fp32", *(v for v in args.variants.split(",") if v.strip() and v.strip() != "fp32")]
    engines = [e.strip() for e in args.engines.split(",") if e.strip()]
    unknown = sorted(set(engines) - set(ENGINES))
    if unknown:
        raise SystemExit(f"--engines: unknown {', '.join(unknown)}; choose from {', '.join(ENGINES)}")
    if args.infinity is not None and not os.access(args.infinity, os.X_OK):
        raise SystemExit(f"--infinity {args.infinity}: not an executable")

    repository = args.workdir / "models"
    eval_path = None if args.no_eval else retrieval_file(args.workdir)
    entry = export_entry(repository, variants, eval_path, args.eval_limit)
    config = json.loads((entry / "model.json").read_text())
    sentences = [sentence for sentence, _ in sst2(args.sentences)]
    report: dict[str, Any] = {
        "cores": len(os.sched_getaffinity(0)),
        "sentences": len(sentences),
        "seconds": args.seconds,
        "connections": args.connections,
        "threads": args.threads,
        "evaluation": config.get("evaluation"),
        "servers": {},
    }

    raw = RawSession(entry, config["variants"]["fp32"]["file"], args.threads)
    reference = raw.embed(sentences[:CHECK_SENTENCES])
    starts: dict[str, tuple[Callable[[], ServiceProcess], str]] = {}
    recalls: dict[str, dict[str, Any]] = {}
    for variant in variants:
        label = f"bertserve {variant}"
        record = variant_record(config, variant)
        recalls[label] = {key: value for key, value in record.items() if key.startswith("recall")}
        if record["served"]:
            starts[label] = (bertserve_start(repository, variant, args.threads, args.workdir), "/v1/embeddings")
        else:
            report["servers"][label] = {"error": record["reason"]}
    for engine in engines:
        label = f"Infinity {engine}" + (" (fp32)" if engine == "torch" else " (onnxruntime)")
        if args.infinity is None:
            report["servers"][label] = {"not_run": "--infinity not given"}
        else:
            starts[label] = (infinity_start(args.infinity, engine, args.workdir), "/embeddings")
    running = start_all(starts, report)
    try:
        measure_all(running, raw, sentences, reference, args, report)
    finally:
        for serving in running.values():
            serving.server.stop()
    order = [*(f"bertserve {v}" for v in variants), *(label for label in starts if label.startswith("Infinity"))]
    order += [label for label in report["servers"] if label not in order]
    report["servers"] = {label: {**report["servers"][label], **recalls.get(label, {})} for label in order}

    print(
        f"\n{report['cores']} cores, {len(sentences)} SST-2 dev sentences, {args.connections} connections, "
        f"{args.seconds:g} s a load; cosine: the least against the raw fp32 session on {CHECK_SENTENCES} sentences"
    )
    report["table"] = table(report)
    report["verdicts"] = verdicts(report)
    print("\n".join(["", *report["table"], "", *report["verdicts"]]))
    write_report("embedding_benchmark", report, args.json)
    return report


if __name__ == "__main__":
    main()
