"""Every setting: a typed field with a default, an environment variable (BERTSERVE_*) and a CLI flag."""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Literal

from pydantic import Field, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

ENV_PREFIX = "BERTSERVE_"


class Settings(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX,
        cli_prog_name="python -m service",
        cli_kebab_case=True,
        cli_implicit_flags=True,
        extra="forbid",
    )

    repository: Path = Field(Path("models"), description="model repository: one folder per model")
    models: list[str] | None = Field(None, description="serve only these entries (comma-separated); default all")
    host: str = Field("127.0.0.1", description="address to listen on (0.0.0.0 in a container)")
    port: int = Field(8000, ge=1, le=65535, description="port to listen on")
    device: Literal["cpu", "cuda", "auto"] = Field(
        "auto", description="cuda: CUDA provider with the fp16 variant (CPU fallback if absent); auto: cuda if present"
    )
    cpu_variant: Literal["auto", "fp32", "int8", "int8-dynamic"] = Field(
        "auto",
        description="variant on the CPU provider; auto: int8 (static, batch-invariant) where the export measured it "
        "within its accuracy budget (--eval), else fp32; int8-dynamic answers may move with the batch make-up",
    )
    threads: int = Field(0, ge=0, le=256, description="intra-op threads per session; 0: one per core")
    engine_mode: Literal["auto", "in-process", "process"] = Field(
        "auto",
        description="process: front-end processes (HTTP, tokenization) and one engine process (sessions, batching) "
        "per device; in-process: one process does all; auto: process where a GPU is used, in-process on the CPU",
    )
    frontends: int = Field(
        0, ge=0, le=64, description="front-end processes sharing the port in process mode; 0: 3/4 of the cores, 1-12"
    )
    shape_buckets: Literal["auto", "on", "off"] = Field(
        "auto",
        description="pad batches to a grid of shapes (rows to a power of two, width to --bucket-width-step), each "
        "warmed before ready; auto: on for CUDA, off on the CPU (exact-length batches)",
    )
    bucket_width_step: int = Field(16, ge=1, le=512, description="shape buckets: widths are multiples of this")
    cuda_graphs: Literal["on", "off"] = Field(
        "off",
        description="capture one CUDA graph per shape bucket (CUDA only, needs shape buckets); off by default: "
        "measured no faster when served under load",
    )
    spin_threads: bool = Field(
        True, description="let idle onnxruntime threads spin (more batch throughput; off can suit many small requests)"
    )
    max_batch_size: int = Field(32, ge=1, le=1024, description="most rows (sequences or windows) in one batch")
    max_batch_tokens: int = Field(
        8192, ge=64, le=1_048_576, description="most padded tokens (longest row x rows) in one batch"
    )
    max_padding_ratio: float = Field(
        1.1,
        ge=1.0,
        le=100.0,
        description="most padded / real tokens in a batch (rows of like length batch together); with shape "
        "buckets (CUDA) no cap unless set",
    )
    max_wait_ms: float = Field(2.0, ge=0, le=1000, description="longest wait for more work before a partial batch")
    max_queue_rows: int = Field(2048, ge=1, le=1_000_000, description="rows queued per model before 429")
    request_timeout_s: float = Field(30.0, gt=0, le=3600, description="per-request deadline; past it 504")
    max_body_bytes: int = Field(2 * 1024 * 1024, ge=1024, le=256 * 1024 * 1024, description="largest request body")
    max_inputs_per_request: int = Field(64, ge=1, le=10_000, description="most inputs in one request")
    max_chars_per_input: int = Field(20_000, ge=1, le=10_000_000, description="longest text, in characters")
    token_overflow: Literal["truncate", "error"] = Field(
        "truncate", description="classification inputs longer than the model's window: truncate, or answer 422"
    )
    # Work and memory per request (issue 10: QA window amplification, memory held after large requests).
    max_qa_windows: int = Field(
        1536,
        ge=1,
        le=1_000_000,
        description="most QA windows (model rows) one request may need, counted from the token counts before any "
        "window is built; past it 422. 1536 = 64 inputs x 24: a 20,000-character English context needs 15-21 "
        "windows at the default max_seq_len 384 and doc_stride 128",
    )
    release_memory_idle_s: float = Field(
        1.0,
        ge=0,
        le=3600,
        description="once large work is over and nothing has run for this long, give its memory back: "
        "onnxruntime's CPU arena (which keeps the largest batch's) and glibc's heap; 0: never",
    )
    release_memory_min_tokens: int = Field(
        2048,
        ge=1,
        le=1_048_576,
        description="large work, for --release-memory-idle-s: a batch or a request of at least this many tokens",
    )
    load_failure: Literal["skip", "fail"] = Field(
        "skip", description="a model that fails to load: serve the others and report it, or refuse to start"
    )
    warmup: bool = Field(True, description="run each model once per batch shape class before reporting ready")
    tokenizer_threads: int = Field(2, ge=1, le=64, description="threads for tokenization and post-processing")
    drain_timeout_s: float = Field(30.0, ge=0, le=3600, description="on SIGTERM, longest wait for work in flight")
    log_level: Literal["debug", "info", "warning", "error"] = Field("info", description="log level")

    @model_validator(mode="after")
    def _coherent(self) -> Settings:
        if self.max_batch_tokens < self.max_batch_size:
            raise ValueError(
                f"max_batch_tokens ({self.max_batch_tokens}) is below max_batch_size ({self.max_batch_size}): "
                "no batch could ever be full"
            )
        if self.cuda_graphs == "on" and self.shape_buckets == "off":
            raise ValueError("cuda_graphs on needs shape buckets (a graph is captured per shape)")
        if self.request_timeout_s * 1000 <= self.max_wait_ms:
            raise ValueError("request_timeout_s must be longer than max_wait_ms, or every request times out")
        return self

    @property
    def session_threads(self) -> int:
        return self.threads or (os.cpu_count() or 1)

    def to_env(self) -> dict[str, str]:
        """The settings given (not the defaults) as BERTSERVE_* variables: how the launcher hands them on, so
        that a child sees the same settings and knows which were chosen."""
        env = {}
        for name, value in self.model_dump(mode="json", exclude_unset=True).items():
            if value is None:
                continue
            if isinstance(value, list | dict):
                text = json.dumps(value)
            elif isinstance(value, bool):
                text = "true" if value else "false"
            else:
                text = str(value)
            env[f"{ENV_PREFIX}{name.upper()}"] = text
        return env

    def configure_logging(self) -> None:
        """One log format for every process of the server (launcher, engine, front-ends)."""
        logging.basicConfig(level=self.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")

    @property
    def frontend_count(self) -> int:
        # measured on 16 cores (H100): 12 front-ends 6.5k 1-input requests/s, 8 front-ends 5.5k
        return self.frontends or max(1, min(12, (os.cpu_count() or 1) * 3 // 4))


for _name, _field in Settings.model_fields.items():
    _field.description = f"{_field.description} [env {ENV_PREFIX}{_name.upper()}]"
Settings.model_rebuild(force=True)


def settings_from_cli(argv: list[str]) -> Settings:
    """Defaults < environment < command line."""
    return Settings(_cli_parse_args=argv)
