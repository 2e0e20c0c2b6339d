"""Every setting: a typed field with a default, an environment variable (BERTSERVE_*) and a CLI flag."""

from __future__ import annotations

import difflib
import json
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

from pydantic import Field, ValidationInfo, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from bertcore.messages import cut, shown
from service.system.cpus import available_cpus

ENV_PREFIX = "BERTSERVE_"


# The most --max-inputs-per-request may be: the request schemas' lists end there too, checked before their items
# (100,000 invalid inputs took pydantic 1.3 s of the event loop to report, before the setting's own check)
MAX_INPUTS_CEILING = 10_000


class Settings(BaseSettings):
    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX,
        cli_prog_name="python -m service",
        cli_kebab_case=True,
        cli_implicit_flags=True,
        extra="forbid",
        hide_input_in_errors=True,  # an error about an API key must never print the key
        allow_inf_nan=False,  # "nan" was refused as "less than or equal to 3600", naming the wrong cause
    )

    repository: Path = Field(Path("models"), description="model repository: one folder per model")
    models: Annotated[list[str] | None, NoDecode] = Field(
        None, description="serve only these entries (comma-separated); default all"
    )
    host: str = Field("127.0.0.1", description="address to listen on (0.0.0.0 in a container)")
    port: int = Field(8000, ge=1, le=65535, description="port to listen on")
    probe_port: int = Field(
        0,
        ge=0,
        le=65535,
        description="a port where a process of its own answers /livez and /readyz, fast under any load (for "
        "orchestrator probes); 0: none (the probes are on --port as always)",
    )
    grpc_port: int = Field(
        0,
        ge=0,
        le=65535,
        description="a port for the Open Inference Protocol v2 over gRPC (KServe's GRPCInferenceService, as "
        "tritonclient.grpc calls it), served by every front-end beside HTTP; 0: no gRPC",
    )
    liveness_stall_s: float = Field(
        10.0,
        ge=0.5,  # the state is written every 0.2 s (probes.HEARTBEAT_S): under that, a server at rest fails it
        le=3600,
        description="probe port: /livez fails once the event loop has not run for this long; /livez fails, and "
        "process mode restarts the engine, once it has not run for this long or a batch has run this long past "
        "--request-timeout-s (a stuck device)",
    )
    device: str = Field(
        "auto",
        description="cuda (or cuda:N, device N): the CUDA provider with the fp16 variant, or the model fails with "
        "the reason (never the CPU); auto: CUDA where it starts, else the CPU, said in /v1/models and in "
        "bertserve_model_placement; cpu: the CPU",
    )
    devices: Annotated[list[int] | None, NoDecode] = Field(
        None,
        description="CUDA devices, comma-separated (0,1): one engine process per device, each serving every model, "
        "the front-ends shared out between them (process mode; --device cuda or auto); default: one device "
        "(--device cuda:N, else 0)",
    )
    cpu_variant: Literal["auto", "fp32", "int8", "int8-dynamic"] = Field(
        "auto",
        description="variant on the CPU provider; auto: of fp32 and int8 (static, batch-invariant) where the export "
        "measured int8 within its accuracy budget (--eval), the one faster on this CPU, timed at load "
        "(--cpu-variant-trial-s), else fp32; int8-dynamic answers may move with the batch make-up",
    )
    cpu_variant_trial_s: float = Field(
        2.0,
        ge=0,
        le=60,
        description="--cpu-variant auto: about this long per model timing fp32 against int8 on real batches at "
        "load, 3 rounds at least, which a slow CPU can take past it (int8 is served only where it is at least 1.05 "
        "times as fast); 0: no timing, int8 wherever it is within its accuracy budget",
    )
    threads: int = Field(
        0,
        ge=0,
        le=256,
        description="intra-op threads per session; 0: one per CPU this process may use (its CPU affinity, capped by "
        "its cgroup's CPU quota: docker run --cpus, a Kubernetes CPU limit)",
    )
    cpu_streams: int = Field(
        0,
        ge=0,
        le=64,
        description="CPU: batches of one model run at once, each on its own thread with threads / streams intra-op "
        "threads (one session): more sequences/s under load, a lone request on fewer threads; 0: 2 where there are "
        "2 threads or more, else 1 (1 for the lowest latency of lone requests)",
    )
    cpu_lone_session: Literal["on", "off"] = Field(
        "off",
        description="CPU with 2 streams or more: a second session of each model on all the threads, for a batch that "
        "starts while no other runs (a lone request on every thread, as with one stream); the model's weights "
        "twice in memory",
    )
    engine_mode: Literal["auto", "in-process", "process"] = Field(
        "auto",
        description="process: front-end processes (HTTP, tokenization) and one engine process (sessions, batching) "
        "per device; in-process: one process does all; auto: process where a GPU is used, in-process on the CPU",
    )
    frontends: int = Field(
        0,
        ge=0,
        le=64,
        description="front-end processes sharing the port in process mode (at most 64); 0: 3/4 of the CPUs this "
        "process may use (as for --threads), from 1 to 12",
    )
    engine_silence_s: float = Field(
        2.0,
        ge=1.0,
        le=3600,
        description="process mode: a front-end that has heard nothing from the engine for this long (it beats "
        "every 0.2 s, whatever its load) reports not ready and answers its requests in flight with the engine, and "
        "new ones at once, 503, until the engine speaks again or the launcher restarts it (--liveness-stall-s)",
    )
    shape_buckets: Literal["auto", "on", "off"] = Field(
        "auto",
        description="pad batches to a grid of shapes (rows to a power of two, width by --bucket-width-step), each "
        "warmed before ready; auto: on for CUDA, off on the CPU (exact-length batches)",
    )
    bucket_width_step: int = Field(
        8,
        ge=1,
        le=512,
        description="shape buckets: the finest width step; widths are multiples of it up to 8 steps, then the step "
        "doubles every 8 widths (8: ..., 64, 80, ..., 160, ...): padding under one step up to 8 steps, then under 25%",
    )
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
    max_wait_ms: float = Field(
        0.0,
        ge=0,
        le=1000,
        description="longest wait for more rows before a partial batch starts on an idle device (0: at once; rows "
        "that arrive while the device is busy gather into the next batch either way)",
    )
    max_queue_s: float = Field(
        2.0,
        gt=0,
        le=600,
        description="admission bound: new work gets 429 once the work admitted would take longer than this, "
        "judged from requests in flight at the rate the server has been answering them, and from each model's "
        "queued tokens at its measured cost per token",
    )
    max_queue_rows: int = Field(
        2048,
        ge=1,
        le=1_000_000,
        description="most rows queued per model (429 past it); unset: 2048 or 32 full batches (--max-batch-size), "
        "whichever is more",
    )
    request_timeout_s: float = Field(  # under 50 ms, a ready server answered every request 504
        30.0, ge=0.05, le=3600, description="per-request deadline; past it 504"
    )
    max_body_bytes: int = Field(
        2 * 1024 * 1024, ge=1024, le=256 * 1024 * 1024, description="largest request body (a gRPC message's too)"
    )
    max_inputs_per_request: int = Field(64, ge=1, le=MAX_INPUTS_CEILING, description="most inputs in one request")
    max_chars_per_input: int = Field(20_000, ge=1, le=10_000_000, description="longest text, in characters")
    token_overflow: Literal["truncate", "error"] = Field(
        "truncate",
        description="classification, rerank and embedding inputs longer than the model's window: truncate, or "
        "answer 422 (an embedding request's truncate overrides it)",
    )
    # Work and memory per request (issue 10: QA window amplification, memory held after large requests).
    max_qa_windows: int = Field(
        1536,
        ge=1,
        le=1_000_000,
        description="most QA windows (model rows) one request may need, counted from the token counts before any "
        "window is built (where the characters, a token each, could pass it); past it 422. 1536 = 64 inputs x 24: "
        "a 20,000-character English context needs 15-21 "
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
    model_control: Literal["none", "poll", "explicit"] = Field(
        "none",
        description="none: the repository is read once, at start; poll: it is scanned every --repository-poll-s "
        "(new entries load, changed ones reload, removed ones unload); explicit: models load and unload through "
        "POST /v2/repository/models/NAME/load|unload (needs --admin-api-key-file), --model names those loaded at start",
    )
    repository_poll_s: float = Field(
        5.0,
        ge=0.5,
        le=3600,
        description="poll: seconds between scans of the repository for new, changed and gone entries",
    )
    model: Annotated[list[str] | None, NoDecode] = Field(
        None,
        description="explicit: a model to load at start (repeatable, or comma-separated); the other entries stay "
        "unloaded until a load call",
    )
    admin_api_key_file: Path | None = Field(
        None,
        description="explicit: file of admin keys for the /v2/repository routes, one a line, # comments, not "
        "readable by other users, re-read when it changes; separate from the inference keys (--api-key-file)",
    )
    warmup: bool = Field(True, description="run each model once per batch shape class before reporting ready")
    tokenizer_threads: int = Field(
        1,
        ge=1,
        le=64,
        description="threads per front-end for long requests' tokenization and post-processing (short ones run on "
        "the event loop); more lets long classification and embedding requests tokenize side by side, but QA's "
        "and NER's work holds the GIL and costs more CPU per request on several threads (docs/serving.md)",
    )
    drain_timeout_s: float = Field(30.0, ge=0, le=3600, description="on SIGTERM, longest wait for work in flight")
    log_level: Literal["debug", "info", "warning", "error"] = Field("info", description="log level")

    # --- Security and HTTP hardening: API keys, CORS, docs, HTTP timeouts and limits, request logs ---------------
    api_keys: Annotated[list[str] | None, NoDecode] = Field(
        None,
        repr=False,
        description="API keys, comma-separated: every request but /livez and /readyz then needs "
        "`Authorization: Bearer KEY` with one of them (at least 16 characters of A-Z a-z 0-9 - . _ ~ + / and "
        "trailing =); prefer the environment or --api-key-file to the command line, which ps shows",
    )
    api_key_file: Path | None = Field(
        None,
        description="file of API keys, one a line, # comments, not readable by other users; re-read when it "
        "changes (checked at most once a second): keys rotate without a restart",
    )
    metrics_auth: Literal["key", "open"] = Field(
        "key", description="with API keys: /metrics needs a key, or is open (e.g. to a scraper inside a cluster)"
    )
    docs: Literal["on", "off"] = Field(
        "on", description="/docs (Swagger UI), /redoc and /openapi.json, from local files (no CDN); off: 404"
    )
    docs_auth: Literal["key", "open"] = Field(
        "key", description="with API keys: /docs, /redoc and /openapi.json need a key, or are open"
    )
    cors_allow_origins: Annotated[list[str] | None, NoDecode] = Field(
        None,
        description="origins allowed to call the API from a browser, comma-separated (https://app.example.com, "
        "or *); default none: CORS off",
    )
    header_timeout_s: float = Field(
        10.0,
        gt=0,
        le=300,
        description="a request's line and headers must arrive within this of their first byte (of the connection "
        "for its first request), and a body within --body-timeout-s after them; else the connection is closed",
    )
    body_timeout_s: float = Field(60.0, gt=0, le=3600, description="longest wait for a request's whole body")
    send_timeout_s: float = Field(
        60.0,
        gt=0,
        le=3600,
        description="longest an answer's write may wait on a client that reads none of it (the connection's send "
        "buffers full); past it the connection is closed",
    )
    keepalive_timeout_s: float = Field(5.0, gt=0, le=3600, description="idle keep-alive connections close after this")
    max_url_bytes: int = Field(8192, ge=256, le=1_048_576, description="longest request target; past it 414")
    max_header_bytes: int = Field(16384, ge=1024, le=1_048_576, description="largest request headers; past it 431")
    access_log: Literal["off", "text", "json"] = Field(
        "text",
        description="one line per request: text, JSON (ts, level, request_id, method, path, status, duration_ms, "
        "client, model) or off",
    )
    otlp_endpoint: str | None = Field(
        None,
        description="OpenTelemetry traces: the collector's OTLP URL (http://collector:4317 for gRPC, "
        "http://collector:4318/v1/traces for HTTP/protobuf; https for TLS); unset: no traces",
    )
    otlp_protocol: Literal["auto", "grpc", "http/protobuf"] = Field(
        "auto",
        description="OTLP over grpc or http/protobuf; auto: HTTP where the endpoint's path ends in /v1/traces or its "
        "port is 4318, else gRPC",
    )
    otlp_service_name: str = Field(
        "bertserve", min_length=1, max_length=256, description="the traces' service.name (the resource's)"
    )
    trace_sample_ratio: float = Field(
        1.0,
        ge=0,
        le=1,
        description="share of the traces that start here which are recorded (a client's sampled traceparent is "
        "always continued, an unsampled one never)",
    )
    otlp_timeout_s: float = Field(
        10.0, gt=0, le=300, description="longest wait for the collector per export (a thread's, never a request's)"
    )
    otlp_max_queue_spans: int = Field(
        2048,
        ge=64,
        le=1_000_000,
        description="spans waiting for export at most; past it spans are dropped and counted "
        "(bertserve_trace_spans_dropped_total)",
    )

    @field_validator("api_keys", "cors_allow_origins", "devices", "models", "model", mode="before")
    @classmethod
    def _comma_separated(cls, value: object) -> object:
        """KEY1,KEY2 from the environment or the command line; a JSON list as the launcher hands settings on."""
        if isinstance(value, str):
            text = value.strip()
            return json.loads(text) if text.startswith("[") else [part.strip() for part in text.split(",")]
        return value

    @field_validator("host", "repository", mode="before")
    @classmethod
    def _not_empty(cls, value: object, info: ValidationInfo) -> object:
        """An empty value (`BERTSERVE_HOST=` from a template left blank) is refused: uvicorn listens on every
        interface for "", and "" as a path is the current folder, served as a repository."""
        if isinstance(value, str) and not value.strip():
            what = "an address: 127.0.0.1, or 0.0.0.0 for every interface" if info.field_name == "host" else "a folder"
            raise ValueError(f"is empty: give {what}")
        return value

    @field_validator("*", mode="before")
    @classmethod
    def _whole_number(cls, value: object, info: ValidationInfo) -> object:
        """A whole number is written in digits: "18105.0" and "1_8105" were read as 18105 (Python's int() and
        float() take both), so a typo or a float from a template passed for a port or a count."""
        integer = cls.model_fields[info.field_name or ""].annotation is int
        if integer and isinstance(value, str) and not WHOLE_NUMBER.fullmatch(value.strip()):
            raise ValueError(f"{shown(value, 40)} is not a whole number (digits only)")
        return value

    @field_validator("otlp_endpoint")
    @classmethod
    def _otlp_endpoint(cls, endpoint: str | None) -> str | None:
        if endpoint is None or not endpoint.strip():
            return None
        endpoint = endpoint.strip()
        # A password in the URL is never echoed: "user:secret@host" is said as "...@host"
        said = shown(CREDENTIALS.sub(r"\1...@", endpoint), 202)
        if not OTLP_URL.fullmatch(endpoint):
            raise ValueError(f"{said} is not an OTLP URL: http(s)://host[:port][/path]")
        if CREDENTIALS.match(endpoint):
            # gRPC's exporter took "user:secret@host" as the host name: nothing exported, and the secret in every
            # failed export's log line; HTTP's sent it as Basic auth. The exporters' own variable takes it for both.
            raise ValueError(
                f"{said} holds credentials: give them as a header, OTEL_EXPORTER_OTLP_HEADERS="
                "'authorization=Basic%20BASE64' (read by both OTLP protocols), and the URL without them"
            )
        try:  # a port past 65535, an unclosed [IPv6 address: a traceback in the exporter, at start
            _ = urlsplit(endpoint).port
        except ValueError as error:
            raise ValueError(f"{said} is not an OTLP URL: {error}") from None
        return endpoint

    @field_validator("device")
    @classmethod
    def _device(cls, device: str) -> str:
        if not DEVICE.fullmatch(device):
            raise ValueError(f"{device!r} is not a device: 'cpu', 'cuda' or 'auto', or cuda:N for CUDA device N")
        if device.startswith("cuda:") and int(device[5:]) > MAX_DEVICE:
            raise ValueError(f"CUDA device numbers are 0-{MAX_DEVICE}: {device}")
        return device

    @field_validator("devices")
    @classmethod
    def _devices(cls, devices: list[int] | None) -> list[int] | None:
        if devices is None:
            return None
        if not devices:
            raise ValueError("set but lists no device (leave it unset for one device)")
        if any(d < 0 or d > MAX_DEVICE for d in devices):
            raise ValueError(f"CUDA device numbers are 0-{MAX_DEVICE}: {devices}")
        if len(set(devices)) != len(devices):
            raise ValueError(f"lists a device twice: {devices} (one engine per device)")
        return devices

    @field_validator("api_keys")
    @classmethod
    def _safe_keys(cls, keys: list[str] | None) -> list[str] | None:
        if keys is None:
            return None
        if not any(keys):
            raise ValueError("set but holds no key (leave it unset for no authentication)")
        for number, key in enumerate(keys, start=1):
            problem = api_key_problem(key)
            if problem:
                raise ValueError(f"key {number} of {len(keys)} {problem}")
        return keys

    @field_validator("cors_allow_origins")
    @classmethod
    def _origins(cls, origins: list[str] | None) -> list[str] | None:
        for origin in origins or []:
            if origin != "*" and not ORIGIN.fullmatch(origin):
                raise ValueError(f"{origin!r} is not an origin: scheme://host[:port] without a path, or *")
        return origins

    @model_validator(mode="after")
    def _coherent(self) -> Settings:
        if self.max_batch_tokens < self.max_batch_size:
            raise ValueError(
                f"max_batch_tokens ({self.max_batch_tokens}) is below max_batch_size ({self.max_batch_size}): "
                "no batch could ever be full"
            )
        if self.cpu_stream_count > self.session_threads:
            raise ValueError(
                f"cpu_streams ({self.cpu_streams}) is more than the intra-op threads ({self.session_threads}, "
                "--threads or one per core): each stream needs a thread of its own"
            )
        if self.devices is not None:
            if self.device_kind == "cpu":
                raise ValueError("devices lists CUDA devices: it needs --device cuda or auto, not cpu")
            if self.device.startswith("cuda:"):
                raise ValueError(f"device {self.device} names one device and devices lists {self.devices}: give one")
            if len(self.devices) > 1 and self.engine_mode == "in-process":
                raise ValueError(
                    f"devices {self.devices}: one engine per device needs process mode, not --engine-mode in-process"
                )
        if self.cuda_graphs == "on" and self.shape_buckets == "off":
            raise ValueError("cuda_graphs on needs shape buckets (a graph is captured per shape)")
        if self.probe_port and self.probe_port == self.port:
            raise ValueError(
                f"probe_port ({self.probe_port}) must differ from port: the probes need a port of their own"
            )
        if self.grpc_port and self.grpc_port in (self.port, self.probe_port):
            raise ValueError(
                f"grpc_port ({self.grpc_port}) must differ from port and probe_port: gRPC needs a port of its own"
            )
        if self.model_control == "explicit":
            if self.admin_api_key_file is None:
                raise ValueError(
                    "model_control explicit needs admin_api_key_file: the load and unload routes must not be open"
                )
            if self.models is not None:
                raise ValueError("with model_control explicit, name the models to load at start with --model")
        elif self.model is not None or self.admin_api_key_file is not None:
            given = "--model" if self.model is not None else "--admin-api-key-file"
            raise ValueError(
                f"{given} is for --model-control explicit only (models loaded and unloaded through the API); "
                "to serve only some of the repository's models, name them with --models"
            )
        if self.request_timeout_s * 1000 <= self.max_wait_ms:
            raise ValueError("request_timeout_s must be longer than max_wait_ms, or every request times out")
        if "max_queue_rows" not in self.model_fields_set:
            # A hard cap behind the bound in time: at 256-row batches on an H100 (~40k rows/s), 2,048 rows were 50 ms
            # of work, and 192 connections sending 16 inputs each got 429s the bound would have admitted.
            self._derive("max_queue_rows", max(2048, 32 * self.max_batch_size, self.max_inputs_per_request))
        if self.max_queue_rows < self.max_inputs_per_request:  # such a request was a 422 that /v1/models denies
            raise ValueError(
                f"max_queue_rows ({self.max_queue_rows}) is below max_inputs_per_request "
                f"({self.max_inputs_per_request}): a request of the most inputs it takes could never be queued"
            )
        if self.max_queue_s >= self.request_timeout_s and "max_queue_s" not in self.model_fields_set:
            self._derive("max_queue_s", self.request_timeout_s / 2)  # a short deadline given alone: keep it coherent
        if self.max_queue_s >= self.request_timeout_s:
            raise ValueError(
                f"max_queue_s ({self.max_queue_s:g}) must be below request_timeout_s ({self.request_timeout_s:g}): "
                "work admitted to wait that long would time out"
            )
        return self

    def _derive(self, name: str, value: Any) -> None:
        """A default that follows other settings: set, but not counted as given (`to_env` hands on only those given,
        and a child derives it again)."""
        setattr(self, name, value)
        self.model_fields_set.discard(name)

    @property
    def device_kind(self) -> Literal["cpu", "cuda", "auto"]:
        """cpu, cuda or auto: --device without its device number."""
        kind = self.device.split(":", 1)[0]
        return "cuda" if kind == "cuda" else ("cpu" if kind == "cpu" else "auto")

    @property
    def cuda_device_id(self) -> int:
        """The CUDA device this process's sessions use: cuda:N's N, else the first of --devices (the launcher hands
        each engine its own), else 0."""
        if ":" in self.device:
            return int(self.device.split(":", 1)[1])
        return self.devices[0] if self.devices else 0

    @property
    def session_threads(self) -> int:
        return self.threads or available_cpus()

    @property
    def cpu_stream_count(self) -> int:
        # measured on 2 cores, MiniLM, fp32 / int8: 2 streams +1-9% / +9-33% sequences/s under load, lone requests
        # 8 -> 11 ms (SST-2 fp32), 19 -> 31 ms (SQuAD fp32)
        return self.cpu_streams or (2 if self.session_threads >= 2 else 1)

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

    def ineffective(self, engine_mode: str, gpu: bool) -> list[str]:
        """Warnings for settings given that do nothing beside the others (the server starts, as asked, and says
        so): an operator had believed them in force. `engine_mode` as resolved; `gpu`: whether CUDA is used."""
        given = self.model_fields_set
        found = []
        if "frontends" in given and engine_mode == "in-process":
            found.append("--frontends has no effect in-process (one process serves): it is for --engine-mode process")
        if "repository_poll_s" in given and self.model_control != "poll":
            found.append(f"--repository-poll-s has no effect with --model-control {self.model_control}: it is poll's")
        if self.cuda_graphs == "on" and not gpu:
            found.append("--cuda-graphs on has no effect on the CPU: graphs are captured on CUDA only")
        cpu_only = [flag_of(name) for name in ("cpu_streams", "cpu_lone_session") if name in given]
        if cpu_only and gpu and self.device_kind == "cuda":
            verb = "has" if len(cpu_only) == 1 else "have"
            found.append(f"{' and '.join(cpu_only)} {verb} no effect with --device cuda: they are for the CPU")
        elif self.cpu_lone_session == "on" and self.cpu_stream_count < 2 and not gpu:
            found.append("--cpu-lone-session on has no effect with one CPU stream: it is for 2 streams or more")
        return found

    def child_env(self, environ: Mapping[str, str]) -> dict[str, str]:
        """A child process's environment: `environ` without any variable of a setting (in any case), then the
        settings given (`to_env`). A setting the command line unset (`--otlp-endpoint ''`, `--models null`) has no
        variable in `to_env`, and the parent's own BERTSERVE_OTLP_ENDPOINT would otherwise be the child's: process
        mode sent traces, or served fewer models, where the same command in-process did not."""
        kept = {name: value for name, value in environ.items() if name.upper() not in SETTING_VARIABLES}
        return {**kept, **self.to_env()}

    def configure_logging(self) -> None:
        """One log format for every process of the server (launcher, engine, front-ends): each line carries the
        id of the request it was logged for (`service.logs`), and the access log is set up as chosen."""
        from service.logs import configure_logging

        configure_logging(self.log_level, self.access_log, traced=self.otlp_endpoint is not None)

    @property
    def admission_cold_requests(self) -> int:
        """Requests admitted at once where no rate is measured yet, whatever they cost: one full batch of them."""
        return max(8, self.max_batch_size)

    @property
    def admission_floor_tokens(self) -> int:
        """Tokens admitted at once where no rate is measured yet (a cold or idle server): one full batch."""
        return self.max_batch_tokens

    @property
    def frontend_count(self) -> int:
        # measured on 16 cores (H100): 12 front-ends 6.5k 1-input requests/s, 8 front-ends 5.5k
        return self.frontends or max(1, min(12, available_cpus() * 3 // 4))


for _name, _field in Settings.model_fields.items():
    _field.description = f"{_field.description} [env {ENV_PREFIX}{_name.upper()}]"
Settings.model_rebuild(force=True)


KEY_CHARS = re.compile(r"[A-Za-z0-9\-._~+/]+=*")  # RFC 6750's b64token: what a Bearer header carries
MIN_KEY_CHARS = 16
MAX_KEY_CHARS = 4096
NEW_KEY_COMMAND = "python -c 'import secrets; print(secrets.token_urlsafe(32))'"
ORIGIN = re.compile(r"https?://[^/\s,]+")
OTLP_URL = re.compile(r"https?://[^/\s?#]+(/[^\s?#]*)?")
CREDENTIALS = re.compile(r"([a-zA-Z][a-zA-Z0-9+.-]*://)[^/\s?#]*@")  # user[:password]@ before the host
DEVICE = re.compile(r"cpu|cuda|auto|cuda:\d{1,2}")
MAX_DEVICE = 63
WHOLE_NUMBER = re.compile(r"[+-]?\d+")


def api_key_problem(key: str) -> str | None:
    """Why `key` is not a safe API key, or None; never says what the key is."""
    if len(key) < MIN_KEY_CHARS:
        return f"is {len(key)} characters: at least {MIN_KEY_CHARS} needed (e.g. {NEW_KEY_COMMAND})"
    if len(key) > MAX_KEY_CHARS:
        return f"is {len(key)} characters: at most {MAX_KEY_CHARS}"
    if not KEY_CHARS.fullmatch(key):
        return "has characters a Bearer token cannot carry: only A-Z a-z 0-9 - . _ ~ + / and trailing ="
    return None


# Every setting's environment variable
SETTING_VARIABLES = frozenset(f"{ENV_PREFIX}{name.upper()}" for name in Settings.model_fields)


def flag_of(setting: str) -> str:
    """A setting's command-line flag: max_batch_size -> --max-batch-size."""
    return f"--{setting.replace('_', '-')}"


def unknown_flag(arguments: list[str]) -> str | None:
    """A refusal for the first `--flag` that is no setting's: argparse printed its 45-line usage before the error, and
    suggested nothing."""
    flags = {"--help"}
    for name, field in Settings.model_fields.items():
        flags.add(flag_of(name))
        if field.annotation is bool:
            flags.add(f"--no-{flag_of(name)[2:]}")
    for argument in arguments:
        flag = argument.split("=", 1)[0]
        if not flag.startswith("--") or flag == "--" or flag in flags:
            continue
        close = difflib.get_close_matches(flag, sorted(flags), n=1, cutoff=TYPO_SIMILARITY)
        hint = f"; did you mean {close[0]}?" if close else ""
        return f"{cut(flag, 60)} is not a flag{hint} (python -m service --help lists them)"
    return None


def settings_from_cli(argv: list[str]) -> Settings:
    """Defaults < environment < command line."""
    return Settings(_cli_parse_args=argv)


# BERTSERVE_* names this project uses that are no setting of the server: docker-compose.yml's own (interpolated
# there, never handed to the server), the load tester's key, the test suite's switches
OTHER_VARIABLES = frozenset(
    {
        "BERTSERVE_MODELS_DIR",
        "BERTSERVE_PUBLISH",
        "BERTSERVE_JAEGER_PUBLISH",
        "BERTSERVE_LOADTEST_API_KEY",
        "BERTSERVE_REQUIRE_GPU",
        "BERTSERVE_SHARED",
    }
)
# What the kubelet sets for a Service whose name starts with "bertserve" where a pod keeps its service links
SERVICE_LINK = re.compile(r"BERTSERVE_\w*(SERVICE_HOST|SERVICE_PORT\w*|PORT_\d+_(TCP|UDP|SCTP)\w*)")
SERVICE_ADDRESS = re.compile(r"(tcp|udp|sctp)://.*")  # the value of a link's NAME_PORT
TYPO_SIMILARITY = 0.85  # BERTSERVE_API_KEY against BERTSERVE_API_KEYS: 0.97; BERTSERVE_MAX_QUEUE_SECONDS: 0.88


def unknown_variables(environ: Mapping[str, str]) -> tuple[str | None, list[str]]:
    """BERTSERVE_* variables that set nothing, which pydantic-settings passes over in silence: (a refusal, for one
    that looks like a misspelt setting, BERTSERVE_API_KEY for BERTSERVE_API_KEYS would serve with no key; warnings,
    for the others). Names in any case, as pydantic-settings reads them (bertserve_api_keys is a setting)."""
    names = sorted(SETTING_VARIABLES)
    unknown = sorted(
        name
        for name in environ
        if name.upper().startswith(ENV_PREFIX)
        and name.upper() not in names
        and name.upper() not in OTHER_VARIABLES
        and not SERVICE_LINK.fullmatch(name)
        and not (name.endswith("_PORT") and SERVICE_ADDRESS.fullmatch(environ[name]))
    )
    warnings = []
    for name in unknown:
        close = difflib.get_close_matches(name.upper(), names, n=1, cutoff=TYPO_SIMILARITY)
        if close:
            return f"{name} is not a setting; did you mean {close[0]}? (unset it or correct its name)", []
        warnings.append(f"{name[:100]} is not a setting and is ignored (python -m service --help lists them)")
    return None, warnings
