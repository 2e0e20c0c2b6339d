"""One wrapper around a model's ONNX Runtime session: provider and variant choice, padding, IO binding."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import onnxruntime as ort

from service.settings import Settings
from service.tasks.base import Row

log = logging.getLogger("service.runtime")
CUDA = "CUDAExecutionProvider"
CPU = "CPUExecutionProvider"


@dataclass(frozen=True)
class Placement:
    variant: str
    provider: str
    note: str | None = None  # why it is not what was asked for, when it is not


def cpu_variant_for(setting: str, variants: dict[str, Any]) -> str:
    """'auto': int8 where the export measured it within its accuracy budget, else fp32; a named variant the
    entry lacks (not made, or refused at export) falls back to fp32."""
    if setting == "auto":
        accuracy = variants.get("int8", {}).get("accuracy") or {}
        return "int8" if accuracy.get("measured") and accuracy.get("within_budget") else "fp32"
    return setting if setting in variants else "fp32"


def choose_placement(settings: Settings, variants: dict[str, Any], available: list[str]) -> Placement:
    """CUDA with fp16 where asked for (or 'auto') and possible; otherwise the CPU with the configured variant."""
    cpu_variant = cpu_variant_for(settings.cpu_variant, variants)
    if settings.device in ("cuda", "auto"):
        if CUDA in available:
            return Placement("fp16" if "fp16" in variants else "fp32", CUDA)
        if settings.device == "cuda":
            return Placement(cpu_variant, CPU, note="CUDA was requested but onnxruntime has no CUDA provider here")
    return Placement(cpu_variant, CPU)


class ModelRuntime:
    """Runs unpadded rows: pads them into one batch, runs the session, hands back each row's own outputs."""

    def __init__(self, entry: Path, config: dict[str, Any], settings: Settings) -> None:
        self.placement = choose_placement(settings, config["variants"], ort.get_available_providers())
        try:
            self.session = self._open(entry, config, settings)
            started = self.session.get_providers()[0] == self.placement.provider
        except Exception as exc:  # the CUDA provider can fail outright (no device, missing libraries)
            if self.placement.provider != CUDA:
                raise
            started, reason = False, str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__
        else:
            reason = "onnxruntime fell back to the CPU"
        if not started:  # onnxruntime-gpu lists CUDA even where no GPU can be used: run the CPU variant instead
            cpu = choose_placement(settings.model_copy(update={"device": "cpu"}), config["variants"], [CPU])
            self.placement = Placement(cpu.variant, CPU, note=f"{CUDA} could not start ({reason}); running on the CPU")
            log.warning("%s: %s", entry.name, self.placement.note)
            self.session = self._open(entry, config, settings)
        self.input_names = [i.name for i in self.session.get_inputs()]
        self.output_names = list(config["outputs"])
        self.per_token = config["task"] != "classification"
        self.pad_token_id = int(config["tokenizer"]["pad_token_id"] or 0)
        self.max_length = int(config["max_length"])

    def _open(self, entry: Path, config: dict[str, Any], settings: Settings) -> ort.InferenceSession:
        options = ort.SessionOptions()
        options.intra_op_num_threads = settings.session_threads
        options.inter_op_num_threads = 1
        options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        options.log_severity_level = 3
        # Spinning intra-op threads: measured on 2 cores, +7% for 16-input requests, -8% for 1-input ones.
        options.add_session_config_entry("session.intra_op.allow_spinning", "1" if settings.spin_threads else "0")
        path = entry / config["variants"][self.placement.variant]["file"]
        if self.placement.provider == CUDA:
            providers: list[Any] = [(CUDA, {"device_id": 0}), CPU]
        else:
            providers = [CPU]
        return ort.InferenceSession(str(path), options, providers=providers)

    @property
    def provider(self) -> str:
        return self.placement.provider

    @property
    def variant(self) -> str:
        return self.placement.variant

    def pad(self, rows: list[Row]) -> dict[str, np.ndarray]:
        width = max(len(row) for row in rows)
        ids = np.full((len(rows), width), self.pad_token_id, dtype=np.int64)
        mask = np.zeros((len(rows), width), dtype=np.int64)
        types = np.zeros((len(rows), width), dtype=np.int64)
        for i, row in enumerate(rows):
            n = len(row)
            ids[i, :n] = row.input_ids
            mask[i, :n] = 1
            types[i, :n] = row.token_type_ids
        feed = {"input_ids": ids, "attention_mask": mask, "token_type_ids": types}
        return {name: feed[name] for name in self.input_names}

    def run(self, rows: list[Row]) -> list[dict[str, np.ndarray]]:
        """Outputs per row: classification logits (labels,), or per-token arrays cut to the row's length."""
        feed = self.pad(rows)
        outputs = self._run_cuda(feed) if self.provider == CUDA else self.session.run(self.output_names, feed)
        results = []
        for i, row in enumerate(rows):
            n = len(row)
            per_row = zip(self.output_names, outputs, strict=True)
            results.append({name: (out[i, :n] if self.per_token else out[i]) for name, out in per_row})
        return results

    def _run_cuda(self, feed: dict[str, np.ndarray]) -> list[np.ndarray]:
        """IO binding: inputs copied to the device once, outputs allocated by ORT and copied back once."""
        binding = self.session.io_binding()
        for name, array in feed.items():
            binding.bind_cpu_input(name, array)
        for name in self.output_names:
            binding.bind_output(name, "cuda")
        self.session.run_with_iobinding(binding)
        return binding.copy_outputs_to_cpu()
