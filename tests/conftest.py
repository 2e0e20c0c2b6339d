"""Test-wide settings: offline, quiet libraries, and tiny real checkpoints built once per session."""

from __future__ import annotations

import os

# Offline whatever the caller's shell holds: both variables, since huggingface_hub reads either
# (tests/harness/environment.py)
os.environ["HF_HUB_OFFLINE"] = "1"
os.environ["TRANSFORMERS_OFFLINE"] = "1"
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import bertcore.no_telemetry  # noqa: F401  (tests load onnxruntime directly too: it calls home unless told not to)

SHARED = Path(__file__).resolve().parents[1].parent / "shared"


@pytest.fixture(scope="session")
def tiny_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Callable[..., Path]:
    """tiny_checkpoint(arch, task, **overrides) -> checkpoint directory, built once per argument set."""
    from tests.tiny_models import write_tiny_checkpoint

    cache: dict[str, Path] = {}

    def build(arch: str, task: str, **overrides: Any) -> Path:
        key = "-".join([arch, task, *(f"{k}={v}" for k, v in sorted(overrides.items()))])
        if key not in cache:
            directory = tmp_path_factory.mktemp("ckpt-" + "".join(c if c.isalnum() else "_" for c in key))
            cache[key] = write_tiny_checkpoint(directory, arch, task, **overrides)
        return cache[key]

    return build


@pytest.fixture(scope="session")
def family_repository(tiny_checkpoint, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, float]]:
    """Issue 31's encoder families, each x task exported once (default variants) as FAMILY-TASK, shared by the
    export checks (tests/export/test_families.py) and the served-parity tests; with each export's seconds."""
    import time

    from export.pipeline import export_checkpoint
    from tests.tiny_models import FAMILIES

    repository = tmp_path_factory.mktemp("family-repository")
    seconds = {}
    for arch in FAMILIES:
        for task in ("classification", "ner", "qa"):
            checkpoint = tiny_checkpoint(arch, task)
            started = time.perf_counter()
            export_checkpoint(str(checkpoint), f"{arch}-{task}", repository)
            seconds[f"{arch}-{task}"] = time.perf_counter() - started
    return repository, seconds
