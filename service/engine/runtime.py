"""One wrapper around a model's ONNX Runtime session: provider and variant choice, padding, buckets, CUDA graphs.

A batch goes through two steps so that the engine can prepare batch N+1 while batch N runs:
`prepare(rows)` pads the rows into host arrays (at the bucket's shape where shape buckets are on), and
`execute(prepared)` runs the session and hands back each row's own outputs.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort

from bertcore.messages import one_line
from bertcore.model_config import ModelConfig
from bertcore.rows import Row
from service.engine.buckets import ShapeGrid
from service.errors import NonFiniteOutput
from service.settings import Settings
from service.system.memory import IdleRelease, malloc_trim

log = logging.getLogger("service.engine.runtime")
CUDA = "CUDAExecutionProvider"
CPU = "CPUExecutionProvider"
GRAPH_WARM_UP_RUNS = 3
# --cpu-lone-session: each batch's weight in the running share of batches that started beside another, and the share
# under which a batch that starts alone takes the lone session
OVERLAP_WEIGHT = 0.1
LONE_MAX_OVERLAP = 0.2
NUMPY_TYPES = {"tensor(int64)": np.int64, "tensor(int32)": np.int32, "tensor(float)": np.float32}
ARENA_SHRINK = "memory.enable_memory_arena_shrinkage"  # a run option: at the run's end, free the arena's idle regions
RECORD_ASSIGNMENT = "session.record_ep_graph_assignment_info"  # which provider runs each node (onnxruntime 1.31)
# --cpu-variant auto: int8 is served only where it runs a batch at least this much faster than fp32 on this CPU (it
# answers a little less accurately: measured on an AVX2-only CPU it was 0.96-1.01x of fp32, and no reason to serve it).
INT8_MIN_SPEED_UP = 1.05
TRIAL_ROWS, TRIAL_WIDTH = 16, 128  # the batch the variants are timed on (capped by --max-batch-size and max_length)
TRIAL_MIN_ROUNDS, TRIAL_MAX_ROUNDS = 3, 15

# Why a model runs where it runs: the `reason` of /v1/models' placement and of bertserve_model_placement.
REQUESTED = "requested"  # where --device asked (cpu; cuda; auto with a GPU that started)
NO_CUDA_PROVIDER = "no_cuda_provider"  # --device auto, and this onnxruntime has no CUDA provider (a CPU build)
CUDA_UNUSABLE = "cuda_unusable"  # --device auto, onnxruntime has the CUDA provider, and it could not start here


class PlacementError(RuntimeError):
    """The model cannot run where --device says it must: it fails with this reason (never moved to the CPU)."""


@dataclass(frozen=True)
class Placement:
    variant: str
    provider: str
    reason: str = REQUESTED
    why: str = ""  # the reason, in words
    note: str | None = None  # a warning for /v1/models: it is not where it was asked for


def available_providers() -> list[str]:
    """onnxruntime's providers (one of the two calls into onnxruntime that tests replace: no GPU exists there)."""
    return list(ort.get_available_providers())


def run_options(intra_op_threads: int, spin_threads: bool) -> ort.SessionOptions:
    """The options every served session runs with (`benchmarks.stream_threads` measures the same): `intra_op_threads`
    threads, one batch's operators in sequence.

    On CUDA too: one non-spinning intra-op thread was measured 8% slower per batch on an H100 (16 cores) and no faster
    end to end than one per core, so the CPU and CUDA sessions take the same thread settings. On the CPU the threads
    are shared out between the streams, which call one session at once. Spinning intra-op threads: measured on 2
    cores, +7% for 16-input requests, -8% for 1-input ones."""
    options = ort.SessionOptions()
    options.intra_op_num_threads = intra_op_threads
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.add_session_config_entry("session.intra_op.allow_spinning", "1" if spin_threads else "0")
    return options


def open_session(path: Path, options: ort.SessionOptions, providers: list[Any]) -> ort.InferenceSession:
    """The one place a session is opened (tests inject the CUDA provider's failures here)."""
    return ort.InferenceSession(str(path), options, providers=providers)


def cpu_variant_for(setting: str, variants: Mapping[str, Any]) -> str:
    """By accuracy alone: 'auto' is int8 where the export measured it within its accuracy budget, else fp32; a
    named variant the entry lacks (not made, or refused at export) falls back to fp32."""
    if setting == "auto":
        return "int8" if int8_within_budget(variants) else "fp32"
    return setting if setting in variants else "fp32"


def int8_within_budget(variants: Mapping[str, Any]) -> bool:
    accuracy = variants.get("int8", {}).get("accuracy") or {}
    return bool(accuracy.get("measured") and accuracy.get("within_budget"))


def cpu_candidates(settings: Settings, variants: Mapping[str, Any]) -> list[str]:
    """The CPU variants to time at load: fp32 and int8 where auto may serve either; else the one variant."""
    if settings.cpu_variant == "auto" and settings.cpu_variant_trial_s > 0 and int8_within_budget(variants):
        return ["fp32", "int8"]
    return [cpu_variant_for(settings.cpu_variant, variants)]


def choose_placement(settings: Settings, variants: Mapping[str, Any], available: list[str]) -> Placement:
    """CUDA with fp16 where asked for (or 'auto') and onnxruntime has the provider; the CPU where --device says so,
    or where auto finds no CUDA provider. --device cuda without the provider: PlacementError."""
    cpu_variant = cpu_variant_for(settings.cpu_variant, variants)
    kind = settings.device_kind
    if kind == "cpu":
        return Placement(cpu_variant, CPU, REQUESTED, "--device cpu")
    if CUDA in available:
        return Placement("fp16" if "fp16" in variants else "fp32", CUDA, REQUESTED, f"--device {settings.device}")
    if kind == "cuda":
        raise PlacementError(
            f"--device {settings.device}: this onnxruntime has no {CUDA} (providers: {', '.join(available)}); "
            "install onnxruntime-gpu (the gpu extra or image), or serve with --device auto or cpu"
        )
    return Placement(cpu_variant, CPU, NO_CUDA_PROVIDER, f"--device auto: this onnxruntime has no {CUDA}")


def choose_by_timing(ms_per_batch: Mapping[str, float], min_speed_up: float = INT8_MIN_SPEED_UP) -> tuple[str, str]:
    """fp32 or int8 from their measured milliseconds per batch: int8 only where it is `min_speed_up` times as fast
    (it answers a little less accurately). Returns the variant and why, in words."""
    speed_up = ms_per_batch["fp32"] / ms_per_batch["int8"]
    if speed_up >= min_speed_up:
        return "int8", f"int8 ran {speed_up:.2f}x as fast as fp32 on this CPU (>= {min_speed_up}x)"
    return "fp32", f"int8 ran {speed_up:.2f}x as fast as fp32 on this CPU (< {min_speed_up}x): not worth its accuracy"


def time_sessions(
    sessions: Mapping[str, ort.InferenceSession],
    feed: dict[str, np.ndarray],
    output_names: list[str],
    budget_s: float,
) -> tuple[dict[str, float], int]:
    """Median milliseconds per run of each session on `feed`, and the rounds run: one untimed run each, then rounds
    that run every session once, in turn (alternating which goes first, so that the machine's slow stretches fall on
    all alike), at least TRIAL_MIN_ROUNDS and at most TRIAL_MAX_ROUNDS, stopping once `budget_s` has passed."""
    for session in sessions.values():
        session.run(output_names, feed)
    names = list(sessions)
    times: dict[str, list[float]] = {name: [] for name in names}
    started = time.perf_counter()
    rounds = 0
    while rounds < TRIAL_MAX_ROUNDS and (rounds < TRIAL_MIN_ROUNDS or time.perf_counter() - started < budget_s):
        for name in names if rounds % 2 == 0 else names[::-1]:
            begun = time.perf_counter()
            sessions[name].run(output_names, feed)
            times[name].append(1000 * (time.perf_counter() - begun))
        rounds += 1
    return {name: float(np.median(values)) for name, values in times.items()}, rounds


def node_assignment(session: ort.InferenceSession) -> dict[str, list[str]]:
    """Each provider the session runs nodes on, with the op type of each of its nodes (the session must have been
    opened with RECORD_ASSIGNMENT)."""
    nodes: dict[str, list[str]] = {}
    for subgraph in session.get_provider_graph_assignment_info():
        nodes.setdefault(subgraph.ep_name, []).extend(node.op_type for node in subgraph.get_nodes())
    return nodes


@dataclass
class PreparedBatch:
    """Rows padded into the arrays the session takes; `lengths` are the real rows' lengths, in order."""

    feed: dict[str, np.ndarray]
    lengths: list[int]

    @property
    def shape(self) -> tuple[int, int]:
        rows, width = next(iter(self.feed.values())).shape
        return int(rows), int(width)


def check_labels(session: ort.InferenceSession, config: ModelConfig) -> None:
    """ValueError where model.json's labels are not the model's: a list of 3 for a 2-logit head served every answer
    a label of the wrong class (the self-test passed), and other counts an IndexError per request."""
    if config.task not in ("classification", "ner"):
        return
    for output in session.get_outputs():
        width = output.shape[-1] if output.name == "logits" and output.shape else None
        if isinstance(width, int) and width != len(config.labels):
            raise ValueError(
                f"model.json lists {len(config.labels)} labels but the model's logits have {width}: the entry's "
                "files come from different exports (export the checkpoint again)"
            )


class ModelRuntime:
    """Runs unpadded rows: pads them into one batch, runs the session, hands back each row's own outputs."""

    def __init__(self, entry: Path, config: ModelConfig, settings: Settings) -> None:
        self.settings = settings
        self.entry, self.config = entry, config
        self.max_length = config.max_length
        self.output_names = list(config.outputs)
        self.per_token = config.per_token
        self.pad_token_id = config.tokenizer.pad_token_id
        self.left_padded = config.tokenizer.padding_side == "left"  # XLNet: each row ends at the batch's last column
        self.variant_trial: dict[str, Any] | None = None  # --cpu-variant auto: the timings and the choice
        self.graphs_note: str | None = None  # why CUDA graphs were asked for and are not used
        self.placement = choose_placement(settings, config.variants, available_providers())
        self.grid = self._grid(settings)
        self._graphs_on = False  # the session was opened with enable_cuda_graph
        self.session = self._open_cuda() if self.provider == CUDA else self._open_cpu()
        self.input_names = [i.name for i in self.session.get_inputs()]
        check_labels(self.session, config)
        self.nodes = node_assignment(self.session)
        self._report_nodes()
        self.graphs: CudaGraphs | None = None
        if self._graphs_on:
            self.graphs = CudaGraphs(self.session, self.output_names, settings.cuda_device_id)
        # --cpu-lone-session: a batch that starts while no other runs takes a session of its own on every thread;
        # the others take the streams' shared session, threads / streams each
        self.lone_session: ort.InferenceSession | None = None
        if self.provider == CPU and self.streams > 1 and settings.cpu_lone_session == "on":
            self.lone_session = self._open(self.variant, use_cuda_graphs=False, threads=settings.session_threads)
        self._running = 0  # batches in `execute` now, on any thread (counted only where there is a lone session)
        self._overlap = 0.0  # running share of the batches that started while another ran
        self._running_lock = threading.Lock()
        # The CPU arena keeps what the largest batch needed: give it back once large batches are over (CPU only).
        idle_s = settings.release_memory_idle_s if self.provider == CPU else 0.0
        self.memory = IdleRelease(entry.name, idle_s, self.release_memory)

    def _open_cuda(self) -> ort.InferenceSession:
        """A session on CUDA, checked to run there. Graphs that fail to start are dropped, never CUDA for them; CUDA
        that fails is the model's failure with --device cuda, and the CPU (said why) with --device auto."""
        if self._wants_cuda_graphs():
            try:
                session = self._open(self.variant, use_cuda_graphs=True)
                self._require_cuda(session)
                self._graphs_on = True
                return session
            except Exception as exc:
                self.graphs_note = f"CUDA graphs could not start ({self._reason(exc)}); serving on CUDA without them"
                log.warning("%s: %s", self.entry.name, self.graphs_note)
        try:
            session = self._open(self.variant, use_cuda_graphs=False)
            self._require_cuda(session)
            return session
        except Exception as exc:
            reason = self._reason(exc)
        self.graphs_note = None  # not the graphs: CUDA itself
        if self.settings.device_kind == "cuda":
            raise PlacementError(
                f"--device {self.settings.device}: {CUDA} could not start ({reason}); not served on the CPU"
            )
        cpu_variant = cpu_variant_for(self.settings.cpu_variant, self.config.variants)
        self.placement = Placement(
            cpu_variant,
            CPU,
            CUDA_UNUSABLE,
            f"--device auto: {CUDA} could not start ({reason})",
            note=f"{CUDA} could not start ({reason}); running on the CPU",
        )
        log.warning("%s: %s", self.entry.name, self.placement.note)
        self.grid = self._grid(self.settings)
        return self._open_cpu()

    def _require_cuda(self, session: ort.InferenceSession) -> None:
        """onnxruntime-gpu opens a session on the CPU alone, with a log line, where CUDA cannot start: refuse it.
        Every provider the session uses counts, not the first listed: CUDA must be one, and run nodes."""
        providers = session.get_providers()
        if CUDA not in providers:
            raise RuntimeError(f"onnxruntime opened the session on {', '.join(providers)} alone")
        if not node_assignment(session).get(CUDA):
            raise RuntimeError(f"onnxruntime placed no node of the graph on {CUDA}")

    def _open_cpu(self) -> ort.InferenceSession:
        """The CPU variant's session; with --cpu-variant auto and int8 within its accuracy budget, fp32 and int8
        are both opened and timed on the same batches (--cpu-variant-trial-s), and the faster one kept."""
        candidates = cpu_candidates(self.settings, self.config.variants)
        if len(candidates) == 1:
            self.placement = replace(self.placement, variant=candidates[0])
            return self._open(candidates[0], use_cuda_graphs=False)
        sessions = {variant: self._open(variant, use_cuda_graphs=False) for variant in candidates}
        rows, width = min(TRIAL_ROWS, self.settings.max_batch_size), min(TRIAL_WIDTH, self.max_length)
        feed = self._trial_feed(rows, width, sessions[candidates[0]])
        started = time.perf_counter()
        ms, rounds = time_sessions(sessions, feed, self.output_names, self.settings.cpu_variant_trial_s)
        chosen, why = choose_by_timing(ms)
        self.variant_trial = {
            "candidates": candidates,
            "ms_per_batch": {variant: round(value, 3) for variant, value in ms.items()},
            "batch": [rows, width],
            "rounds": rounds,
            "seconds": round(time.perf_counter() - started, 2),
            "chosen": chosen,
            "why": why,
        }
        log.info(
            "%s: --cpu-variant auto timed %s on %d batches of %dx%d in %.1f s: %s; serving %s",
            self.entry.name,
            ", ".join(f"{variant} {value:.2f} ms" for variant, value in ms.items()),
            rounds,
            rows,
            width,
            self.variant_trial["seconds"],
            why,
            chosen,
        )
        self.placement = replace(self.placement, variant=chosen)
        return sessions[chosen]

    def _trial_feed(self, rows: int, width: int, session: ort.InferenceSession) -> dict[str, np.ndarray]:
        """A full batch of token ids drawn from the model's vocabulary (the same for every variant)."""
        vocabulary = self.config.vocab_size or 100
        ids = np.random.default_rng(0).integers(min(5, vocabulary - 1), vocabulary, (rows, width)).astype(np.int64)
        feed = {"input_ids": ids, "attention_mask": np.ones_like(ids), "token_type_ids": np.zeros_like(ids)}
        return {i.name: feed[i.name] for i in session.get_inputs()}

    def _report_nodes(self) -> None:
        """Nodes of a CUDA session that onnxruntime placed on the CPU (onnxruntime puts some shape computations
        there on purpose; anything heavier costs copies between the devices each batch): logged at load and shown
        in /v1/models."""
        on_cpu = self.nodes.get(CPU, [])
        if self.provider != CUDA or not on_cpu:
            return
        total = sum(len(ops) for ops in self.nodes.values())
        counts = ", ".join(f"{op} x{n}" for op, n in sorted(Counter(on_cpu).items()))
        log.warning("%s: %d of %d nodes run on the CPU, not CUDA: %s", self.entry.name, len(on_cpu), total, counts)

    def placement_report(self) -> dict[str, Any]:
        """Where the model runs and why, for /v1/models (plain data: it crosses the process boundary)."""
        report: dict[str, Any] = {
            "requested": self.settings.device,
            "provider": self.provider,
            "reason": self.placement.reason,
            "why": self.placement.why,
            "nodes": {provider: len(ops) for provider, ops in self.nodes.items()},
        }
        if self.lone_session is not None:
            report["lone_session_threads"] = self.settings.session_threads
        if self.provider == CUDA:
            report["device_id"] = self.settings.cuda_device_id
            report["cpu_nodes"] = dict(sorted(Counter(self.nodes.get(CPU, [])).items()))
            report["cuda_graphs"] = self.graphs is not None
            if self.graphs_note:
                report["cuda_graphs_note"] = self.graphs_note
        return report

    def _reason(self, exc: BaseException) -> str:
        return one_line(exc, limit=200, hide=self.settings.repository)

    def _grid(self, settings: Settings) -> ShapeGrid | None:
        wanted = settings.shape_buckets == "on" or (settings.shape_buckets == "auto" and self.provider == CUDA)
        if not wanted:
            return None
        return ShapeGrid(
            max_rows=settings.max_batch_size,
            max_width=self.max_length,
            max_tokens=max(settings.max_batch_tokens, self.max_length),
            width_step=settings.bucket_width_step,
        )

    def _wants_cuda_graphs(self) -> bool:
        return self.placement.provider == CUDA and self.grid is not None and self.settings.cuda_graphs == "on"

    def _open(self, variant: str, *, use_cuda_graphs: bool, threads: int | None = None) -> ort.InferenceSession:
        """A session of the variant on this runtime's provider: each stream's share of the threads, or `threads`."""
        settings = self.settings
        options = run_options(threads or self.intra_op_threads, settings.spin_threads)
        # Warnings on CUDA: onnxruntime says there when it places nodes on the CPU or cannot start the provider.
        options.log_severity_level = 2 if self.provider == CUDA else 3
        options.add_session_config_entry(RECORD_ASSIGNMENT, "1")
        path = self.entry / self.config.variant_file(variant)
        if self.placement.provider == CUDA:
            cuda_options = {"device_id": str(settings.cuda_device_id)}
            if use_cuda_graphs:
                cuda_options["enable_cuda_graph"] = "1"
            providers: list[Any] = [(CUDA, cuda_options), CPU]
        else:
            providers = [CPU]
        return open_session(path, options, providers)

    @property
    def provider(self) -> str:
        return self.placement.provider

    @property
    def streams(self) -> int:
        """Batches run at once on this session: --cpu-streams on the CPU; one on CUDA (one device, one stream)."""
        return self.settings.cpu_stream_count if self.provider == CPU else 1

    @property
    def intra_op_threads(self) -> int:
        """Each stream's share of --threads (by default the CPUs this process may use, service.system.cpus)."""
        return max(1, self.settings.session_threads // self.streams)

    @property
    def variant(self) -> str:
        return self.placement.variant

    def prepare(self, rows: list[Row]) -> PreparedBatch:
        """Pad the rows into host arrays: to the longest row, or up to the bucket's shape with shape buckets.

        Whole-array operations, not a loop over rows: this runs for every batch in the engine process, whose one
        interpreter lock also serves every request's frames."""
        lengths = [len(row.input_ids) for row in rows]  # not len(row): a Python call a row
        count, width = len(rows), max(lengths)
        if self.grid is not None:
            count, width = self.grid.bucket(count, width)
        columns, ends = np.arange(width), np.asarray(lengths)[:, None]
        # (rows, width): True over each row's own tokens, at its start (right padding) or its end (left padding)
        real = columns >= width - ends if self.left_padded else columns < ends
        ids = np.full((count, width), self.pad_token_id, dtype=np.int64)
        mask = np.zeros((count, width), dtype=np.int64)
        types = np.zeros((count, width), dtype=np.int64)
        ids[: len(rows)][real] = np.concatenate([row.input_ids for row in rows])
        types[: len(rows)][real] = np.concatenate([row.token_type_ids for row in rows])
        mask[: len(rows)] = real
        mask[len(rows) :, -1 if self.left_padded else 0] = 1  # filler rows attend to one token: none all-masked
        feed = {"input_ids": ids, "attention_mask": mask, "token_type_ids": types}
        return PreparedBatch({name: feed[name] for name in self.input_names}, lengths)

    def execute(self, batch: PreparedBatch) -> list[Any]:
        """Outputs per row: classification logits (labels,), or per-token arrays cut to the row's length; or, for a
        row the model answered NaN or an infinity for, the `NonFiniteOutput` that fails its request. A batch that
        starts while no other runs takes the lone session where there is one (every thread)."""
        if self.lone_session is None:  # the default, and CUDA: no count of the batches running is needed
            return self._execute(batch, self.session)
        with self._running_lock:
            beside = self._running
            self._running += 1
            # Under load the streams' batches overlap, and a lone batch's threads would contend with the next one's:
            # the lone session only while batches have been starting alone
            self._overlap += OVERLAP_WEIGHT * ((beside > 0) - self._overlap)
            alone = beside == 0 and self._overlap < LONE_MAX_OVERLAP
        try:
            return self._execute(batch, self.lone_session if alone else self.session)
        finally:
            with self._running_lock:
                self._running -= 1

    def _execute(self, batch: PreparedBatch, session: ort.InferenceSession) -> list[Any]:
        self.memory.begin()
        try:
            if self.graphs is not None:
                outputs = self.graphs.run(batch.feed)
            else:
                # On CUDA too: one call copies the inputs in, runs and copies the outputs back while the interpreter
                # lock is let go once. IO binding (bind each input, run, copy out) took it back after every step,
                # and each time waited for the engine's busy event loop to let go of it.
                outputs = session.run(self.output_names, batch.feed)
        finally:
            rows, width = batch.shape
            self.memory.end(large=rows * width >= self.settings.release_memory_min_tokens)
        return self._per_row(outputs, batch.lengths, batch.shape[1])

    def _per_row(self, outputs: list[np.ndarray], lengths: list[int], width: int) -> list[Any]:
        """Each real row's views of the outputs (filler rows of a bucket left out). Iterating an array yields its
        rows' views in C: this runs on the device thread, under the interpreter lock, before the next batch can
        start, and an index and a dict per row and output cost ~5x as much at 256 rows.

        A row whose own values (its tokens', for per-token outputs) hold NaN or an infinity gets a `NonFiniteOutput`
        in their place, which fails its request alone. One pass over each whole output finds them (1-5 µs a batch of
        32, ~100 at 256 x 512 x 9); only where it finds one are the rows looked at one by one."""
        count = len(lengths)
        per_output: list[Any] = [out[:count] for out in outputs]
        if self.per_token:
            if self.left_padded:
                per_output = [[row[width - n :] for row, n in zip(out, lengths, strict=True)] for out in per_output]
            else:
                per_output = [[row[:n] for row, n in zip(out, lengths, strict=True)] for out in per_output]
        names = self.output_names
        if len(names) == 1:
            only = names[0]
            rows: list[Any] = [{only: row} for row in per_output[0]]
        else:
            rows = [dict(zip(names, row, strict=True)) for row in zip(*per_output, strict=True)]
        if not all(np.isfinite(out).all() for out in outputs):
            rows = [_finite_or_refused(row) for row in rows]
        return rows

    def run(self, rows: list[Row]) -> list[Any]:
        return self.execute(self.prepare(rows))

    def release_memory(self) -> None:
        """A one-token run with arena shrinkage (onnxruntime frees the arena's unused regions at its end), then
        glibc's free heap back to the system. Safe while another batch runs: the arena frees only idle regions."""
        feed = {
            "input_ids": np.full((1, 1), self.pad_token_id, dtype=np.int64),
            "attention_mask": np.ones((1, 1), dtype=np.int64),
            "token_type_ids": np.zeros((1, 1), dtype=np.int64),
        }
        options = ort.RunOptions()
        options.add_run_config_entry(ARENA_SHRINK, "cpu:0")
        for session in self.sessions:
            session.run(self.output_names, {name: feed[name] for name in self.input_names}, options)
        malloc_trim()

    @property
    def sessions(self) -> list[ort.InferenceSession]:
        """The streams' session, and the lone session where there is one."""
        return [self.session] if self.lone_session is None else [self.session, self.lone_session]

    def warm_up_shapes(self) -> list[tuple[int, int]]:
        """The batch shapes warm-up runs: every bucket with shape buckets; else a short and a full-length batch."""
        if self.grid is not None:
            return list(self.grid.shapes)
        rows = min(2, self.settings.max_batch_size)
        return [(rows, length) for length in sorted({min(8, self.max_length), self.max_length})]

    def warm_up(self) -> int:
        """Run every warm-up shape (call it on the thread that will run the batches). Returns the shape count.

        With CUDA graphs each shape runs a few times: ORT runs a graph's first calls normally and captures after."""
        try:
            return self._warm_up_shapes()
        except Exception as exc:
            if self.graphs is None:
                raise
            self.drop_graphs(exc)
            return self._warm_up_shapes()

    def _warm_up_shapes(self) -> int:
        shapes = self.warm_up_shapes()
        runs = GRAPH_WARM_UP_RUNS if self.graphs is not None else 1
        for rows, width in shapes:
            filler = Row(np.full(width, 1, dtype=np.int64), np.zeros(width, dtype=np.int64))
            batch = self.prepare([filler] * rows)
            for session in self.sessions:  # both, where a lone batch has a session of its own
                for _ in range(runs):
                    self._execute(batch, session)
        return len(shapes)

    def drop_graphs(self, exc: BaseException) -> None:
        """A graph that failed to capture: CUDA again, in a session without graphs (not the CPU); where that one
        cannot start either, the model fails."""
        self.graphs_note = f"CUDA graph capture failed ({self._reason(exc)}); serving on CUDA without graphs"
        log.warning("%s: %s", self.entry.name, self.graphs_note)
        self.graphs = None
        self._graphs_on = False
        session = self._open(self.variant, use_cuda_graphs=False)
        self._require_cuda(session)
        self.session = session
        self.nodes = node_assignment(session)


class CudaGraphs:
    """One CUDA graph per bucket shape: inputs and outputs bound to fixed device buffers, inputs copied in place.

    ORT captures the graph on the first run with a new `gpu_graph_id` and replays it after; a replay launches the
    whole model at once instead of hundreds of kernels, which is what small batches are made of.
    """

    def __init__(self, session: ort.InferenceSession, output_names: list[str], device_id: int = 0) -> None:
        self.session = session
        self.device_id = device_id
        self.output_names = output_names
        self._inputs = {i.name: i for i in session.get_inputs()}
        self._outputs = {o.name: o for o in session.get_outputs()}
        self._bound: dict[tuple[int, int], _BoundShape] = {}

    def run(self, feed: dict[str, np.ndarray]) -> list[np.ndarray]:
        shape = next(iter(feed.values())).shape
        bound = self._bound.get(shape)
        if bound is None:
            bound = self._bind(shape, graph_id=len(self._bound))
            self._bound[shape] = bound
        for name, array in feed.items():
            bound.inputs[name].update_inplace(np.ascontiguousarray(array, dtype=bound.input_types[name]))
        self.session.run_with_iobinding(bound.binding, bound.run_options)
        return [bound.outputs[name].numpy() for name in self.output_names]

    def _bind(self, shape: tuple[int, int], graph_id: int) -> _BoundShape:
        rows, width = shape
        binding = self.session.io_binding()
        inputs, types = {}, {}
        for name, info in self._inputs.items():
            types[name] = NUMPY_TYPES[info.type]
            inputs[name] = ort.OrtValue.ortvalue_from_shape_and_type(shape, types[name], "cuda", self.device_id)
            binding.bind_ortvalue_input(name, inputs[name])
        outputs = {}
        for name in self.output_names:
            info = self._outputs[name]
            dims = output_shape(info.shape, rows, width)
            outputs[name] = ort.OrtValue.ortvalue_from_shape_and_type(
                dims, NUMPY_TYPES[info.type], "cuda", self.device_id
            )
            binding.bind_ortvalue_output(name, outputs[name])
        run_options = ort.RunOptions()
        run_options.add_run_config_entry("gpu_graph_id", str(graph_id))
        return _BoundShape(binding, inputs, types, outputs, run_options)


@dataclass
class _BoundShape:
    binding: Any
    inputs: dict[str, Any]
    input_types: dict[str, Any]
    outputs: dict[str, Any]
    run_options: Any


def output_shape(dims: list[Any], rows: int, width: int) -> tuple[int, ...]:
    """An output's declared shape with its symbolic axes filled in: the first is the batch, the second the width."""
    symbolic = iter((rows, width))
    return tuple(dim if isinstance(dim, int) else next(symbolic) for dim in dims)


def _finite_or_refused(row: dict[str, np.ndarray]) -> dict[str, np.ndarray] | NonFiniteOutput:
    if all(np.isfinite(values).all() for values in row.values()):
        return row
    return NonFiniteOutput(NonFiniteOutput.MESSAGE)
