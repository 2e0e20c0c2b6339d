"""One wrapper around a model's ONNX Runtime session: provider and variant choice, padding, buckets, CUDA graphs.

A batch goes through two steps so that the engine can prepare batch N+1 while batch N runs:
`prepare(rows)` pads the rows into host arrays (at the bucket's shape where shape buckets are on), and
`execute(prepared)` runs the session and hands back each row's own outputs.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort

from export.model_config import ModelConfig
from service.engine.buckets import ShapeGrid
from service.memory import IdleRelease, malloc_trim
from service.settings import Settings
from service.tasks.base import Row

log = logging.getLogger("service.engine.runtime")
CUDA = "CUDAExecutionProvider"
CPU = "CPUExecutionProvider"
GRAPH_WARM_UP_RUNS = 3
NUMPY_TYPES = {"tensor(int64)": np.int64, "tensor(int32)": np.int32, "tensor(float)": np.float32}
ARENA_SHRINK = "memory.enable_memory_arena_shrinkage"  # a run option: at the run's end, free the arena's idle regions


@dataclass(frozen=True)
class Placement:
    variant: str
    provider: str
    note: str | None = None  # why it is not what was asked for, when it is not


def cpu_variant_for(setting: str, variants: Mapping[str, Any]) -> str:
    """'auto': int8 where the export measured it within its accuracy budget, else fp32; a named variant the
    entry lacks (not made, or refused at export) falls back to fp32."""
    if setting == "auto":
        accuracy = variants.get("int8", {}).get("accuracy") or {}
        return "int8" if accuracy.get("measured") and accuracy.get("within_budget") else "fp32"
    return setting if setting in variants else "fp32"


def choose_placement(settings: Settings, variants: Mapping[str, Any], available: list[str]) -> Placement:
    """CUDA with fp16 where asked for (or 'auto') and possible; otherwise the CPU with the configured variant."""
    cpu_variant = cpu_variant_for(settings.cpu_variant, variants)
    if settings.device in ("cuda", "auto"):
        if CUDA in available:
            return Placement("fp16" if "fp16" in variants else "fp32", CUDA)
        if settings.device == "cuda":
            return Placement(cpu_variant, CPU, note="CUDA was requested but onnxruntime has no CUDA provider here")
    return Placement(cpu_variant, CPU)


@dataclass
class PreparedBatch:
    """Rows padded into the arrays the session takes; `lengths` are the real rows' lengths, in order."""

    feed: dict[str, np.ndarray]
    lengths: list[int]

    @property
    def shape(self) -> tuple[int, int]:
        rows, width = next(iter(self.feed.values())).shape
        return int(rows), int(width)


class ModelRuntime:
    """Runs unpadded rows: pads them into one batch, runs the session, hands back each row's own outputs."""

    def __init__(self, entry: Path, config: ModelConfig, settings: Settings) -> None:
        self.placement = choose_placement(settings, config.variants, ort.get_available_providers())
        self.settings = settings
        self.entry, self.config = entry, config
        self.max_length = config.max_length
        self.grid = self._grid(settings)
        try:
            self.session = self._open(use_cuda_graphs=self._wants_cuda_graphs())
            started = self.session.get_providers()[0] == self.placement.provider
        except Exception as exc:  # the CUDA provider can fail outright (no device, missing libraries)
            if self.placement.provider != CUDA:
                raise
            started, reason = False, str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__
        else:
            reason = "onnxruntime fell back to the CPU"
        if not started:  # onnxruntime-gpu lists CUDA even where no GPU can be used: run the CPU variant instead
            cpu = choose_placement(settings.model_copy(update={"device": "cpu"}), config.variants, [CPU])
            self.placement = Placement(cpu.variant, CPU, note=f"{CUDA} could not start ({reason}); running on the CPU")
            log.warning("%s: %s", entry.name, self.placement.note)
            self.grid = self._grid(settings)
            self.session = self._open(use_cuda_graphs=False)
        self.input_names = [i.name for i in self.session.get_inputs()]
        self.output_names = list(config.outputs)
        self.per_token = config.per_token
        self.pad_token_id = config.tokenizer.pad_token_id
        self.left_padded = config.tokenizer.padding_side == "left"  # XLNet: each row ends at the batch's last column
        self.graphs: CudaGraphs | None = None
        if self.provider == CUDA and self._wants_cuda_graphs():
            self.graphs = CudaGraphs(self.session, self.output_names)
        # The CPU arena keeps what the largest batch needed: give it back once large batches are over (CPU only).
        idle_s = settings.release_memory_idle_s if self.provider == CPU else 0.0
        self.memory = IdleRelease(entry.name, idle_s, self.release_memory)

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

    def _open(self, *, use_cuda_graphs: bool) -> ort.InferenceSession:
        settings = self.settings
        options = ort.SessionOptions()
        # On CUDA too: one non-spinning intra-op thread was measured 8% slower per batch on an H100 (16 cores) and
        # no faster end to end than one per core, so the CPU and CUDA sessions take the same thread settings. On the
        # CPU the threads are shared out between the streams, which call this one session at once.
        options.intra_op_num_threads = self.intra_op_threads
        options.inter_op_num_threads = 1
        options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        options.log_severity_level = 3
        # Spinning intra-op threads: measured on 2 cores, +7% for 16-input requests, -8% for 1-input ones.
        options.add_session_config_entry("session.intra_op.allow_spinning", "1" if settings.spin_threads else "0")
        path = self.entry / self.config.variant_file(self.placement.variant)
        if self.placement.provider == CUDA:
            cuda_options = {"device_id": "0"}
            if use_cuda_graphs:
                cuda_options["enable_cuda_graph"] = "1"
            providers: list[Any] = [(CUDA, cuda_options), CPU]
        else:
            providers = [CPU]
        return ort.InferenceSession(str(path), options, providers=providers)

    @property
    def provider(self) -> str:
        return self.placement.provider

    @property
    def streams(self) -> int:
        """Batches run at once on this session: --cpu-streams on the CPU; one on CUDA (one device, one stream)."""
        return self.settings.cpu_stream_count if self.provider == CPU else 1

    @property
    def intra_op_threads(self) -> int:
        """Each stream's share of --threads (by default the CPUs this process may use, service.cpus)."""
        return max(1, self.settings.session_threads // self.streams)

    @property
    def variant(self) -> str:
        return self.placement.variant

    def prepare(self, rows: list[Row]) -> PreparedBatch:
        """Pad the rows into host arrays: to the longest row, or up to the bucket's shape with shape buckets.

        Whole-array operations, not a loop over rows: this runs for every batch in the engine process, whose one
        interpreter lock also serves every request's frames."""
        lengths = [len(row) for row in rows]
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

    def execute(self, batch: PreparedBatch) -> list[dict[str, np.ndarray]]:
        """Outputs per row: classification logits (labels,), or per-token arrays cut to the row's length."""
        self.memory.begin()
        try:
            if self.graphs is not None:
                outputs = self.graphs.run(batch.feed)
            else:
                # On CUDA too: one call copies the inputs in, runs and copies the outputs back while the interpreter
                # lock is let go once. IO binding (bind each input, run, copy out) took it back after every step,
                # and each time waited for the engine's busy event loop to let go of it.
                outputs = self.session.run(self.output_names, batch.feed)
        finally:
            rows, width = batch.shape
            self.memory.end(large=rows * width >= self.settings.release_memory_min_tokens)
        results = []
        width = batch.shape[1]
        for i, n in enumerate(batch.lengths):
            own = slice(width - n, width) if self.left_padded else slice(0, n)
            per_row = zip(self.output_names, outputs, strict=True)
            results.append({name: (out[i, own] if self.per_token else out[i]) for name, out in per_row})
        return results

    def run(self, rows: list[Row]) -> list[dict[str, np.ndarray]]:
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
        self.session.run(self.output_names, {name: feed[name] for name in self.input_names}, options)
        malloc_trim()

    def warm_up_shapes(self) -> list[tuple[int, int]]:
        """The batch shapes warm-up runs: every bucket with shape buckets; else a short and a full-length batch."""
        if self.grid is not None:
            return list(self.grid.shapes)
        rows = min(2, self.settings.max_batch_size)
        return [(rows, length) for length in sorted({min(8, self.max_length), self.max_length})]

    def warm_up(self) -> int:
        """Run every warm-up shape (call it on the thread that will run the batches). Returns the shape count.

        With CUDA graphs each shape runs a few times: ORT runs a graph's first calls normally and captures after."""
        shapes = self.warm_up_shapes()
        runs = GRAPH_WARM_UP_RUNS if self.graphs is not None else 1
        for rows, width in shapes:
            filler = Row(np.full(width, 1, dtype=np.int64), np.zeros(width, dtype=np.int64))
            for _ in range(runs):
                self.run([filler] * rows)
        return len(shapes)


class CudaGraphs:
    """One CUDA graph per bucket shape: inputs and outputs bound to fixed device buffers, inputs copied in place.

    ORT captures the graph on the first run with a new `gpu_graph_id` and replays it after; a replay launches the
    whole model at once instead of hundreds of kernels, which is what small batches are made of.
    """

    def __init__(self, session: ort.InferenceSession, output_names: list[str]) -> None:
        self.session = session
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
            inputs[name] = ort.OrtValue.ortvalue_from_shape_and_type(shape, types[name], "cuda", 0)
            binding.bind_ortvalue_input(name, inputs[name])
        outputs = {}
        for name in self.output_names:
            info = self._outputs[name]
            dims = _concrete(info.shape, rows, width)
            outputs[name] = ort.OrtValue.ortvalue_from_shape_and_type(dims, NUMPY_TYPES[info.type], "cuda", 0)
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


def _concrete(dims: list[Any], rows: int, width: int) -> tuple[int, ...]:
    """An output's declared shape with its symbolic axes filled in: the first is the batch, the second the width."""
    symbolic = iter((rows, width))
    return tuple(dim if isinstance(dim, int) else next(symbolic) for dim in dims)
