"""The work around the model (issue 37): a front-end's CPU per request and per sequence, beside the same inputs'
tokenizer-alone cost, and the engine's CPU per row outside the model, per task and request size.

For each task (classify: SST-2 dev sentences; ner: CoNLL-2003 test sentences; qa: SQuAD questions with their
contexts; rerank: a query and SST-2 sentences as its documents, POST /v1/rerank on a cross-encoder entry; and, only
when named in --tasks, qa-long: SQuAD questions with their article's paragraphs joined to ~600 words, a long
document in 3-4 windows, as benchmarks.request_shapes makes them; classify-long: SST-2 sentences joined four to a
text; ner-long: CoNLL-2003 sentences joined forty to a text, as benchmarks.request_shapes makes them. Long requests
are tokenized on the --tokenizer-threads pool, short ones on the event loop) and each
request size (--sizes, inputs per request), a real server in process mode with ONE front-end
(`python -m service --engine-mode process --frontends 1`) takes --connections closed-loop keep-alive connections
for --seconds, after --warmup-seconds of the same load. Measured over that window, from /proc
(benchmarks.process_cpu):

- front-end CPU (utime + stime of the front-end process) per answered request and per sequence (an input: a
  sentence, a question, a document);
- the same requests' inputs through the entry's own tokenizer.json alone (the `tokenizers` library, one thread,
  TOKENIZERS_PARALLELISM=false; CPU time, the median of at least 3 rounds of whole passes over the requests,
  measured once in this process and shared by both checkouts), per sequence, as the server tokenizes them:
  classify and rerank one untruncated `encode_batch` per request, NER each text in windows of the entry's
  max_length with the server's default stride, QA each question + context in the pipeline's windows (only_second
  truncation, max_seq_len and doc_stride as bertcore.tasks.qa derives them: 384 and 128 for MiniLM), one encoding
  per question; and the ratio front-end / tokenizer;
- the engine process's CPU per row (a sequence, or a window of one: NER and QA rows are windows), from
  bertserve_batch_size_sum. By default every model session in the engine process sleeps for as long as a GPU
  would compute (benchmarks.sleeping_session: --fixed-ms + --per-token-us per padded token,
  answering zeros; shape buckets on and one stream, as on a GPU), so that the model itself costs ~0 CPU and this is
  the engine's own work, and the front-end is the bottleneck. `--real-model` serves the real CPU sessions instead
  (then the engine's figure includes the model). The sleeping session answers zeros, but QA's start and end
  logits are noise (distinct scores, as a real model's): NER finds no entity, so its post-processing costs less
  than on real text; --real-model shows it.
- the served rate (requests/s, sequences/s) and every non-200 answer (errors), which must be none.

The sleeping sessions go into the engine process through a sitecustomize.py on its PYTHONPATH that only acts in
`python -m service.engine` (it wraps EngineCore.load as engine_benchmark's engine does); the server's log must
say it took effect, else the run stops.

`--base-source DIR` measures another checkout too (its server runs its own code: cwd DIR, PYTHONPATH DIR, this
checkout's Python), the same cells, and prints both and a side-by-side table of change / base per figure. Both
servers are up at once (the idle one costs ~nothing) and each cell is measured on the base first, then on this
checkout, back to back: CPU time varies from minute to minute on a shared machine (a busy neighbour on the same
core slows every instruction), so compare within one run. The checkout measured second in a cell has read up to
~20% dearer, whichever it was: `--rounds N` measures every cell N times, the base first in even rounds and this
checkout first in odd ones, and reports each figure's median over the rounds (an even N puts both orders in
every cell equally). By default the real checkpoints of ../shared
are exported once (fp32) into --workdir/models, with a cross-encoder made as benchmarks.rerank_benchmark makes
it (MiniLM SST-2's encoder and a fresh one-label head); `--repository` serves entries exported already (found by
model.json's task and rerank mark, or named with --entry TASK=NAME).

    python -m benchmarks.frontend_cost                                  # 4 tasks x 1 and 16 inputs, 8 s a cell
    python -m benchmarks.frontend_cost --base-source /tmp/base --seconds 4 --json /tmp/frontend_cost.json
    python -m benchmarks.frontend_cost --base-source /tmp/base --seconds 4 --rounds 2     # both orders, medians
    python -m benchmarks.frontend_cost --tasks classify,qa --sizes 1 --real-model
    python -m benchmarks.frontend_cost --base-source . --base-server-args '' \\
        --server-args '--otlp-endpoint http://127.0.0.1:4318/v1/traces --trace-sample-ratio 1'   # traces' cost
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import shlex
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks import request_shapes, sleeping_session
from benchmarks.loadclient import LoadResult, run_load
from benchmarks.process_cpu import OtherCpu, busy_warning
from benchmarks.realdata import SHARED, conll03, shared_available, squad, sst2
from benchmarks.reports import write_report
from benchmarks.scrape import delta, scrape
from bertcore.model_config import ModelConfig
from tests.harness.serving import ROOT, ServiceProcess, start_service

DEFAULT_TASKS = ("classify", "ner", "qa", "rerank")
LONG_TASKS = {"classify-long": "classify", "ner-long": "ner", "qa-long": "qa"}  # only where named: long inputs
# Only where named: sentence embeddings on the native route (floats in JSON), SST-2 sentences; c2fa199 had none
EMBED = "embed"
TASKS = (*DEFAULT_TASKS, *LONG_TASKS, EMBED)
# An input is one SST-2 sentence (rerank's: the query with one), a request's inputs one encode_batch
SENTENCE_TASKS = ("classify", "rerank", EMBED)


def base_task(task: str) -> str:
    """The task a long one is of (classify-long: classify), served by the same entry on the same route."""
    return LONG_TASKS.get(task, task)


_MODEL_TASK = {"classify": "classification", "ner": "ner", "qa": "qa", "rerank": "classification", EMBED: "embedding"}
MODEL_TASK = {task: _MODEL_TASK[base_task(task)] for task in TASKS}
ROUTE = {task: base_task(task) for task in TASKS if task != "rerank"}  # /v1/models/NAME/ROUTE
CLASSIFY_LONG_SENTENCES = 4  # SST-2 sentences a classify-long text joins
_SHARED_ENTRIES = {
    "classify": "minilm-bert-sst2",
    "ner": "minilm-bert-conll03",
    "qa": "minilm-bert-squad",
    "rerank": "minilm-cross-encoder",
    EMBED: "minilm-embed",
}
SHARED_ENTRIES = {task: _SHARED_ENTRIES[base_task(task)] for task in TASKS}
QUERIES = (  # rerank: the query of each request in turn, the documents SST-2 sentences
    "a funny and moving film",
    "the acting is terrible",
    "a thriller that keeps you guessing",
    "boring and far too long",
)
SLEEP_VARIABLE = "FRONTEND_COST_SLEEP"  # "fixed seconds,seconds per padded token" for the engine's sitecustomize
SLEEP_MARK = sleeping_session.MARK
# Imported by every Python process of the server (it is on their PYTHONPATH, benchmarks.sleeping_session copied
# beside it); acts only in the engine process of process mode.
SLEEPING_SITECUSTOMIZE = r'''
"""benchmarks.frontend_cost: the engine's model sessions sleep at GPU speed (in `python -m service.engine` only)."""
import os
import sys


def _install():
    spec = os.environ.get("FRONTEND_COST_SLEEP")
    try:
        with open("/proc/self/cmdline", "rb") as stream:
            command = stream.read()
    except OSError:
        return
    if not spec or b"\0-m\0service.engine\0" not in command:
        return
    fixed_s, per_token_s = (float(part) for part in spec.split(","))

    def patch(core):
        from bertserve_sleeping_session import sleep_on_load

        sleep_on_load(core.EngineCore, fixed_s, per_token_s, announce=True)

    import importlib.machinery

    class Finder:
        @classmethod
        def find_spec(cls, name, path=None, target=None):
            if name != "service.engine.core":
                return None
            sys.meta_path.remove(cls)
            spec = importlib.machinery.PathFinder.find_spec(name, path)
            if spec is None or spec.loader is None:
                return spec
            execute = spec.loader.exec_module

            def exec_module(module):
                execute(module)
                patch(module)

            spec.loader.exec_module = exec_module
            return spec

    sys.meta_path.insert(0, Finder)


_install()
'''


@dataclass(frozen=True)
class Cell:
    task: str
    size: int

    @property
    def key(self) -> str:
        return f"{self.task} x{self.size}"


@dataclass
class Workload:
    """A cell's requests: (body, sequences) in the order sent, the path, and each request's tokenizer inputs."""

    path: str
    requests: list[tuple[dict, int]]
    items: list[list[Any]]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", default=",".join(DEFAULT_TASKS), help=f"comma-separated of {','.join(TASKS)}")
    parser.add_argument("--sizes", default="1,16", help="inputs per request, comma-separated")
    parser.add_argument("--seconds", type=float, default=8.0, help="measured load per cell")
    parser.add_argument("--warmup-seconds", type=float, default=2.0, help="the same load before each measured one")
    parser.add_argument("--connections", type=int, default=8, help="closed-loop keep-alive connections")
    parser.add_argument("--inputs", type=int, default=1024, help="the first N sentences / questions of each task")
    parser.add_argument("--tokenizer-seconds", type=float, default=1.0, help="least time of each tokenizer figure")
    parser.add_argument("--real-model", action="store_true", help="the real CPU sessions, not sleeping ones")
    parser.add_argument("--fixed-ms", type=float, default=1.2, help="the sleeping device: milliseconds per batch")
    parser.add_argument("--per-token-us", type=float, default=0.375, help="... plus microseconds per padded token")
    parser.add_argument("--device", default="cpu", help="the server's --device")
    parser.add_argument("--server-args", default="", help="more settings for python -m service (shell-split)")
    parser.add_argument("--repository", type=Path, help="entries exported already (default: ../shared's, exported)")
    parser.add_argument(
        "--entry", action="append", default=[], help="TASK=NAME: the entry that serves a task (repeatable)"
    )
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/bertserve-frontend-cost"), help="exports, logs")
    parser.add_argument("--base-source", type=Path, help="another checkout, measured too (order: --rounds)")
    parser.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="measure every cell this many times, the checkouts' order swapped each round; medians are reported",
    )
    parser.add_argument(
        "--base-server-args",
        help="the base's own settings instead of --server-args (say, this checkout as its own base with traces off "
        "and on: --base-source . --base-server-args '' --server-args '--otlp-endpoint URL')",
    )
    parser.add_argument("--ready-timeout", type=float, default=300.0, help="longest wait for a server's /readyz")
    parser.add_argument("--json", type=Path, help="write the figures here (default reports/frontend_cost.json)")
    args = parser.parse_args(argv)
    args.tasks = [t.strip() for t in args.tasks.split(",") if t.strip()]
    if unknown := sorted(set(args.tasks) - set(TASKS)):
        parser.error(f"unknown task(s): {', '.join(unknown)}; choose from {', '.join(TASKS)}")
    try:
        args.sizes = [int(s) for s in args.sizes.split(",") if s.strip()]
    except ValueError:
        parser.error(f"--sizes must be integers: {args.sizes!r}")
    if not args.sizes or min(args.sizes) < 1:
        parser.error("--sizes: at least one size, each >= 1")
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    try:
        args.entries = dict(item.split("=", 1) for item in args.entry)
    except ValueError:
        parser.error(f"--entry takes TASK=NAME: {args.entry}")
    if unknown := sorted(set(args.entries) - set(TASKS)):
        parser.error(f"--entry for unknown task(s): {', '.join(unknown)}")
    return args


# --- the models and the inputs ---------------------------------------------------------------------------------


def export_shared(workdir: Path, tasks: list[str]) -> Path:
    """../shared's checkpoints for `tasks` as fp32 entries in workdir/models, exported once and then reused."""
    if not shared_available():
        raise SystemExit("../shared is absent: pass --repository (entries exported already)")
    from export.pipeline import export_checkpoint
    from export.quiet import quiet_libraries

    quiet_libraries()
    repository = workdir / "models"
    for task in tasks:
        name = SHARED_ENTRIES[task]
        if (repository / name / "model.json").is_file():
            continue
        started = time.monotonic()
        if task == "rerank":
            from benchmarks.rerank_benchmark import make_cross_encoder

            checkpoint = make_cross_encoder(workdir / "cross-encoder-checkpoint")
        else:
            checkpoint = SHARED / "models" / name
        export_checkpoint(str(checkpoint), name, repository, variants="fp32")
        print(f"exported {name} into {repository} ({time.monotonic() - started:.0f} s)", flush=True)
    return repository


def find_entries(repository: Path, tasks: list[str], named: dict[str, str]) -> dict[str, str]:
    """task -> entry name: --entry's, else the one entry of the task in the repository (../shared's name first)."""
    configs = {}
    for entry in sorted(repository.iterdir()):
        if (entry / "model.json").is_file():
            try:
                configs[entry.name] = ModelConfig.read(entry)
            except (OSError, ValueError) as exc:
                print(f"  skipped entry {entry.name}: {exc}", flush=True)
    found = {}
    for task in tasks:
        if task in named:
            if named[task] not in configs:
                raise SystemExit(f"--entry {task}={named[task]}: no such entry in {repository}")
            found[task] = named[task]
            continue
        fits = [
            name
            for name, config in configs.items()
            if config.task == MODEL_TASK[task]
            and (base_task(task) != "classify" or not config.rerank)
            and (task != "rerank" or config.rerank)
        ]
        if SHARED_ENTRIES[task] in fits:
            fits = [SHARED_ENTRIES[task]]
        if len(fits) != 1:
            what = f"several ({', '.join(fits)})" if fits else "none"
            raise SystemExit(f"{task}: {what} of the entries in {repository} fit; name one with --entry {task}=NAME")
        found[task] = fits[0]
    return found


def task_texts(task: str, limit: int) -> tuple[list[Any], str]:
    """The inputs of a task (texts, or (question, context) pairs) and where they come from."""
    if shared_available():
        if task in SENTENCE_TASKS:
            return [sentence for sentence, _ in sst2(limit)], "SST-2 dev"
        if task == "classify-long":
            sentences = [sentence for sentence, _ in sst2()]
            joined = CLASSIFY_LONG_SENTENCES
            texts = [" ".join(sentences[i : i + joined]) for i in range(0, len(sentences) - joined + 1, joined)]
            return texts[:limit], f"SST-2 dev, {joined} sentences a text"
        if task == "ner-long":
            bodies = request_shapes.BODIES["ner-long"](limit)
            return [
                body["inputs"][0] for body in bodies
            ], f"CoNLL-2003 test, {request_shapes.NER_SENTENCES} sentences a text"
        if task == "ner":
            return [" ".join(words) for words, _ in conll03(limit)], "CoNLL-2003 test"
        if task == "qa-long":
            bodies = request_shapes.BODIES["qa-long"](limit)
            pairs = [(pair["question"], pair["context"]) for body in bodies for pair in body["inputs"]]
            return pairs, f"SQuAD v1.1 dev (eval half), contexts of {request_shapes.QA_CONTEXT_WORDS} words"
        return [(question, context) for question, context, _ in squad(limit)], "SQuAD v1.1 dev (eval half)"
    from export.sample_text import CONTEXT, QUESTIONS, SENTENCES

    if task in ("qa", "qa-long"):
        return [(question, CONTEXT) for question in QUESTIONS], "export.sample_text (no ../shared)"
    return list(SENTENCES), "export.sample_text (no ../shared)"


def workload(task: str, entry: str, texts: list[Any], size: int) -> Workload:
    """Requests of `size` inputs each, in data order (the texts repeated where fewer than `size`)."""
    while len(texts) < size:
        texts = texts * 2
    groups = [texts[i : i + size] for i in range(0, len(texts) - size + 1, size)]
    if task == "rerank":
        bodies = [
            {"model": entry, "query": QUERIES[n % len(QUERIES)], "documents": group} for n, group in enumerate(groups)
        ]
        items = [[(body["query"], document) for document in body["documents"]] for body in bodies]
        return Workload("/v1/rerank", [(body, size) for body in bodies], items)
    if MODEL_TASK[task] == "qa":
        bodies = [{"inputs": [{"question": q, "context": c} for q, c in group]} for group in groups]
    else:
        bodies = [{"inputs": group} for group in groups]
    return Workload(f"/v1/models/{entry}/{ROUTE[task]}", [(body, size) for body in bodies], [list(g) for g in groups])


def tokenizer_alone(entry: Path, task: str, items: list[list[Any]], min_seconds: float) -> float:
    """CPU microseconds per sequence of the entry's tokenizer.json alone on the requests' inputs, one thread, as the
    server tokenizes them (classify, rerank: one encode_batch a request; NER: windows; QA: the pipeline's windows)."""
    os.environ["TOKENIZERS_PARALLELISM"] = "false"  # read by the library when it first runs a batch
    from tokenizers import Tokenizer

    from bertcore.tasks import ner
    from bertcore.tasks.qa import QaParams
    from bertcore.tokenization import TextTokenizer

    config = ModelConfig.read(entry)
    path = entry / config.tokenizer.file
    tokenizer = Tokenizer.from_file(str(path))
    tokenizer.no_padding()
    tokenizer.no_truncation()
    encode: Callable[[list[Any]], object]
    if base_task(task) in SENTENCE_TASKS:
        encode = tokenizer.encode_batch
    elif base_task(task) == "ner":
        text_tokenizer = TextTokenizer.load(path, config.tokenizer.pad_token_id, config.tokenizer.padding_side)
        stride = ner.default_stride(text_tokenizer, config.max_length)
        tokenizer.enable_truncation(config.max_length, stride=stride, strategy="longest_first")

        def encode(texts: list[Any]) -> object:
            return [tokenizer.encode(text) for text in texts]
    else:
        max_seq_len, doc_stride = QaParams().window(config.max_length)
        tokenizer.enable_truncation(max_seq_len, stride=doc_stride, strategy="only_second")

        def encode(pairs: list[Any]) -> object:
            return [tokenizer.encode(question, context) for question, context in pairs]

    sequences = sum(len(request) for request in items)
    for request in items[:8]:  # first calls set up caches
        encode(request)
    # Rounds of whole passes, until --tokenizer-seconds and at least 3 rounds; the median round: a neighbour's
    # burst on a shared machine moves one round, not the figure.
    rounds: list[float] = []
    started = time.process_time()
    while len(rounds) < 3 or time.process_time() - started < min_seconds:
        passes, begun = 0, time.process_time()
        while passes == 0 or time.process_time() - begun < 0.05:
            for request in items:
                encode(request)
            passes += 1
        rounds.append(1e6 * (time.process_time() - begun) / (passes * sequences))
    return statistics.median(rounds)


# --- the server and the load -----------------------------------------------------------------------------------


def checkout_label(source: Path) -> str:
    """The checkout's commit, and whether its tracked files have changes."""
    try:
        commit = subprocess.run(
            ["git", "-C", str(source), "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "-C", str(source), "status", "--porcelain", "--untracked-files=no"], capture_output=True, text=True
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "not a git checkout"
    return f"{commit}{' + uncommitted changes' if dirty else ''}"


def server_args(args: argparse.Namespace, entries: list[str], base: bool = False) -> list[str]:
    """The server's settings; the base's own (--base-server-args) where given for it."""
    extra = ["--engine-mode", "process", "--frontends", "1", "--device", args.device, "--models", ",".join(entries)]
    if not args.real_model:
        extra += ["--shape-buckets", "on", "--cpu-streams", "1"]  # the engine as it runs on a GPU
    more = args.base_server_args if base and args.base_server_args is not None else args.server_args
    return [*extra, *shlex.split(more)]


def start_server(
    source: Path, repository: Path, entries: list[str], args: argparse.Namespace, log: Path, base: bool = False
) -> ServiceProcess:
    """`python -m service` from `source` (its code: cwd and PYTHONPATH), with sleeping sessions unless
    --real-model; ready, and the sleeping sessions checked in its log."""
    paths = [str(source)]
    env = {"TOKENIZERS_PARALLELISM": "false"}
    if not args.real_model:
        site = args.workdir / "sleeping-site"
        site.mkdir(parents=True, exist_ok=True)
        (site / "sitecustomize.py").write_text(SLEEPING_SITECUSTOMIZE)
        sleeping_session.copy_beside(site)
        paths.insert(0, str(site))
        env[SLEEP_VARIABLE] = f"{args.fixed_ms / 1000!r},{args.per_token_us / 1e6!r}"
    env["PYTHONPATH"] = os.pathsep.join(paths)
    extra = server_args(args, entries, base)
    print(f"  python -m service --repository {repository} {shlex.join(extra)}   (cwd {source})", flush=True)
    started = time.monotonic()
    server = start_service(repository, *extra, log_path=log, wait=False, env=env, source=source)
    try:
        server.wait_ready(timeout=args.ready_timeout)
        if not args.real_model and SLEEP_MARK not in server.log():
            raise RuntimeError(f"the engine did not take the sleeping sessions (no {SLEEP_MARK!r} in {log})")
    except BaseException:
        server.stop()
        raise
    print(f"  ready in {time.monotonic() - started:.1f} s; log {log}", flush=True)
    return server


def measure_cell(server: ServiceProcess, work: Workload, args: argparse.Namespace, tokenizer_us: float) -> dict:
    bodies = [body for body, _ in work.requests]
    sizes = [size for _, size in work.requests]
    if args.warmup_seconds > 0:
        run_load(server.url, work.path, bodies, sizes, args.connections, args.warmup_seconds)
    before = metrics(server.url)
    with OtherCpu(server.process.pid) as cpu:
        load = run_load(server.url, work.path, bodies, sizes, args.connections, args.seconds)
    rows = delta(before, metrics(server.url), "bertserve_batch_size_sum")
    return figures(load, cpu.seconds() or {}, rows, tokenizer_us, cpu.cores())


def metrics(url: str) -> dict[str, float]:
    return {name: float(value) for name, value in scrape(url).items()}


def figures(
    load: LoadResult, cpu: dict[str, float], rows: float | None, tokenizer_us: float, other_cores: float | None = None
) -> dict:
    """The cell's figures from its load, the CPU seconds by role over the window and the rows the engine ran; and
    the cores the rest of the machine used meanwhile (`OtherCpu`: well above zero, the cell measured that too)."""
    answered = load.statuses.get(200, 0)
    sequences = load.sequences
    frontend, engine = cpu.get("front-ends"), cpu.get("engine")
    rows = rows if rows else None

    def per(seconds: float | None, count: float | None) -> float | None:
        return round(1e6 * seconds / count, 1) if seconds is not None and count else None

    per_sequence = per(frontend, sequences)
    return {
        "requests": load.requests,
        "answered": answered,
        "sequences": sequences,
        "rows": rows,
        "errors": {str(status): n for status, n in sorted(load.statuses.items()) if status != 200},
        "requests_per_s": round(answered / load.seconds, 1),
        "sequences_per_s": round(sequences / load.seconds, 1),
        "p50_ms": round(load.percentile_ms(0.5), 2),
        "p99_ms": round(load.percentile_ms(0.99), 2),
        "frontend_us_per_request": per(frontend, answered),
        "frontend_us_per_sequence": per_sequence,
        "tokenizer_us_per_sequence": round(tokenizer_us, 1),
        "frontend_per_tokenizer": round(per_sequence / tokenizer_us, 1) if per_sequence and tokenizer_us else None,
        "engine_us_per_row": per(engine, rows),
        "rows_per_sequence": round(rows / sequences, 3) if rows and sequences else None,
        "cores": {role: round(seconds / load.seconds, 2) for role, seconds in sorted(cpu.items())},
        "other_cores": None if other_cores is None else round(other_cores, 2),
        "seconds": round(load.seconds, 2),
    }


def measure_sources(
    sources: list[tuple[str, Path]],
    repository: Path,
    entries: dict[str, str],
    works: dict[Cell, Workload],
    tokenizer: dict[Cell, float],
    args: argparse.Namespace,
) -> dict[str, dict]:
    """A server from each checkout, all started first (an idle one costs ~nothing); then cell by cell, each
    checkout in turn (`measuring_order`), so that a drift of the shared machine's speed falls on both alike; each
    cell's figures are the medians of its rounds (`median_figures`)."""
    runs: dict[str, dict[str, Any]] = {
        label: {"source": str(source), "checkout": checkout_label(source), "cells": {}} for label, source in sources
    }
    servers: dict[str, ServiceProcess] = {}
    try:
        for label, source in sources:
            print(f"\n{label}: {source} ({runs[label]['checkout']})", flush=True)
            log = args.workdir / "logs" / f"server-{label}.log"
            log.parent.mkdir(parents=True, exist_ok=True)
            entries_served = sorted(set(entries.values()))
            servers[label] = start_server(source, repository, entries_served, args, log, base=label == "base")
        print(flush=True)
        measured: dict[str, dict[str, list[dict]]] = {label: {} for label in servers}
        for round_index in range(args.rounds):
            for cell, work in works.items():
                for label in measuring_order(list(servers), round_index):
                    row = measure_cell(servers[label], work, args, tokenizer[cell])
                    measured[label].setdefault(cell.key, []).append(row)
                    print(f"  {label} {cell.key} (round {round_index + 1}): {json.dumps(row)}", flush=True)
        for label, cells in measured.items():
            runs[label]["cells"] = {key: median_figures(rows) for key, rows in cells.items()}
    finally:
        for server in servers.values():
            server.stop()
    return runs


def measuring_order(labels: list[str], round_index: int) -> list[str]:
    """The checkouts in the order a round measures each cell: as given (the base first) in even rounds, reversed
    in odd ones."""
    return labels if round_index % 2 == 0 else labels[::-1]


def median_figures(rows: list[dict]) -> dict:
    """One cell's figures over its rounds: each number's median (a figure missing in any round is None), the
    non-200 answers of every round added up, each role's cores its median."""
    if len(rows) == 1:
        return rows[0]
    combined: dict[str, Any] = {}
    for key, first in rows[0].items():
        values = [row[key] for row in rows]
        if key == "errors":
            errors: dict[str, int] = {}
            for counts in values:
                for status, count in counts.items():
                    errors[status] = errors.get(status, 0) + count
            combined[key] = dict(sorted(errors.items()))
        elif isinstance(first, dict):
            names = sorted({name for value in values for name in value})
            combined[key] = {name: statistics.median(v[name] for v in values if name in v) for name in names}
        elif any(value is None for value in values):
            combined[key] = None
        else:
            combined[key] = statistics.median(values)
    combined["rounds"] = len(rows)
    return combined


def busy_cells(runs: dict[str, dict]) -> list[str]:
    """A warning for each cell measured while the rest of the machine was busy (`busy_warning`, on the median over
    the rounds): the front-end's figures then hold that work's share of the cores and caches too."""
    warnings = {
        f"{label} {key}": busy_warning(row.get("other_cores"))
        for label, run in runs.items()
        for key, row in run["cells"].items()
    }
    return [f"{cell}: {warning}" for cell, warning in warnings.items() if warning]


# --- the tables ------------------------------------------------------------------------------------------------

COLUMNS = (  # (heading, key, format)
    ("requests/s", "requests_per_s", "{:,.0f}"),
    ("sequences/s", "sequences_per_s", "{:,.0f}"),
    ("front-end µs/request", "frontend_us_per_request", "{:,.0f}"),
    ("front-end µs/sequence", "frontend_us_per_sequence", "{:,.0f}"),
    ("tokenizer alone µs/sequence", "tokenizer_us_per_sequence", "{:,.1f}"),
    ("front-end / tokenizer", "frontend_per_tokenizer", "{:,.1f}x"),
    ("engine µs/row", "engine_us_per_row", "{:,.0f}"),
)
COMPARED = (
    "requests_per_s",
    "sequences_per_s",
    "frontend_us_per_request",
    "frontend_us_per_sequence",
    "engine_us_per_row",
)


def _format(value: Any, pattern: str) -> str:
    return "n/a" if value is None or (isinstance(value, float) and not math.isfinite(value)) else pattern.format(value)


def table(run: dict) -> list[str]:
    lines = [
        "| task | inputs | " + " | ".join(heading for heading, _, _ in COLUMNS) + " | errors |",
        "|---|---|" + "---|" * len(COLUMNS) + "---|",
    ]
    for key, row in run["cells"].items():
        task, size = key.split(" x")
        values = " | ".join(_format(row[k], pattern) for _, k, pattern in COLUMNS)
        lines.append(f"| {task} | {size} | {values} | {json.dumps(row['errors']) if row['errors'] else 'none'} |")
    return lines


def comparison(base: dict, change: dict) -> list[str]:
    """change / base per figure, cell by cell."""
    headings = [heading for heading, key, _ in COLUMNS if key in COMPARED]
    lines = [
        "| task | inputs | " + " | ".join(f"{h}: base → change (change/base)" for h in headings) + " |",
        "|---|---|" + "---|" * len(headings),
    ]
    for key, after in change["cells"].items():
        before = base["cells"].get(key)
        if before is None:
            continue
        task, size = key.split(" x")
        parts = []
        for _, k, pattern in COLUMNS:
            if k not in COMPARED:
                continue
            ratio = after[k] / before[k] if after[k] is not None and before[k] else None
            parts.append(f"{_format(before[k], pattern)} → {_format(after[k], pattern)} ({_format(ratio, '{:.2f}')})")
        lines.append(f"| {task} | {size} | " + " | ".join(parts) + " |")
    return lines


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    args.workdir.mkdir(parents=True, exist_ok=True)
    repository = args.repository.resolve() if args.repository else export_shared(args.workdir, args.tasks)
    entries = find_entries(repository, args.tasks, args.entries)
    works, tokenizer, inputs = {}, {}, {}
    for task in args.tasks:
        texts, where = task_texts(task, args.inputs)
        inputs[task] = f"{len(texts)} from {where}"
        for size in args.sizes:
            cell = Cell(task, size)
            works[cell] = workload(task, entries[task], texts, size)
            tokenizer[cell] = tokenizer_alone(
                repository / entries[task], task, works[cell].items, args.tokenizer_seconds
            )
    print(f"entries: {json.dumps(entries)}; inputs: {json.dumps(inputs)}", flush=True)
    print(f"tokenizer alone, µs per sequence: { {c.key: round(v, 1) for c, v in tokenizer.items()} }", flush=True)
    report: dict = {
        "command": [sys.executable, "-m", "benchmarks.frontend_cost", *(sys.argv[1:] if argv is None else argv)],
        "environment": {"cores": os.cpu_count(), "python": platform.python_version(), "machine": platform.node()},
        "settings": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "model": "real CPU sessions"
        if args.real_model
        else f"sleeping: {args.fixed_ms} ms + {args.per_token_us} us/token",
        "server_args": server_args(args, sorted(set(entries.values()))),
        "base_server_args": server_args(args, sorted(set(entries.values())), base=True),
        "repository": str(repository),
        "entries": entries,
        "inputs": inputs,
        "runs": {},
    }
    sources = [("base", args.base_source.resolve())] if args.base_source else []
    report["runs"] = measure_sources([*sources, ("change", ROOT)], repository, entries, works, tokenizer, args)
    print(
        f"\n## frontend_cost: process mode, 1 front-end, {args.connections} connections, {args.seconds:g} s a cell; "
        f"model: {report['model']}; {os.cpu_count()} cores",
        flush=True,
    )
    for label, run in report["runs"].items():
        print(f"\n{label}: {run['source']} ({run['checkout']})")
        print("\n".join(table(run)))
    if "base" in report["runs"]:
        print("\nchange / base:")
        print("\n".join(comparison(report["runs"]["base"], report["runs"]["change"])))
    for line in busy_cells(report["runs"]):
        print(line)
    write_report("frontend_cost", report, args.json)
    errors = {
        f"{label} {key}": row["errors"]
        for label, run in report["runs"].items()
        for key, row in run["cells"].items()
        if row["errors"]
    }
    if errors:
        print(f"\nERRORS (non-200 answers): {json.dumps(errors)}", flush=True)
        raise SystemExit(1)
    return report


if __name__ == "__main__":
    main()
