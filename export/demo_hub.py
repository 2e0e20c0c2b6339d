"""The demo from the Hugging Face hub: small public fine-tuned checkpoints, one per task, so the first answers are real.

`HUB_CHECKPOINTS` names them (the one place; `python -m export demo --checkpoints NAME=OWNER/REPO[@REVISION],...`
overrides entries). Each is fetched with huggingface_hub's `snapshot_download` into its cache (HF_HOME), only the
files an export reads (config, tokenizer files, one set of weights: safetensors where the repository has them),
then exported by `export.pipeline.export_checkpoint` like any checkpoint, its model.json's `source` saying
`"kind": "hub"`, the repository id, the commit and the URL. HF_ENDPOINT points it at another hub (the tests' stand-in).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bertcore.messages import one_line
from export.errors import ExportError
from export.pipeline import ExportResult, Progress, export_checkpoint
from export.variants import DEFAULT_VARIANTS

# entry name -> "owner/repo[@revision]": a DistilBERT SST-2 classifier (NEGATIVE/POSITIVE), a BERT-base CoNLL-2003
# NER model (PER, ORG, LOC, MISC), a DistilBERT SQuAD v1.1 reader: 268 + 433 + 261 MB of safetensors to fetch, once.
HUB_CHECKPOINTS: dict[str, str] = {
    "demo-sentiment": "distilbert/distilbert-base-uncased-finetuned-sst-2-english",
    "demo-ner": "dslim/bert-base-NER",
    "demo-qa": "distilbert/distilbert-base-cased-distilled-squad",
}
# The first call to the hub (the model info) gives up after this long: offline, `make run` falls back at once.
HUB_TIMEOUT_S = 5.0
CONFIG_FILES = ("config.json",)
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.txt",
    "vocab.json",
    "merges.txt",
    "spiece.model",
    "sentencepiece.bpe.model",
)
# A tokenizer needs one of these (the others only configure it).
VOCABULARY_FILES = ("tokenizer.json", "vocab.txt", "vocab.json", "spiece.model", "sentencepiece.bpe.model")
# In order of preference: the first set a repository has is fetched, and only it.
WEIGHT_SETS = (
    ("model.safetensors",),
    ("model.safetensors.index.json", "model-*.safetensors"),
    ("pytorch_model.bin",),
    ("pytorch_model.bin.index.json", "pytorch_model-*.bin"),
)


class HubUnavailable(Exception):
    """The demo checkpoints could not be fetched: offline, unreachable, or the hub refused. The message is the
    reason, one phrase."""


@dataclass(frozen=True)
class HubCheckpoint:
    name: str  # the repository entry
    repo_id: str
    revision: str | None  # a branch, tag or commit; None: the default branch


@dataclass(frozen=True)
class Snapshot:
    checkpoint: HubCheckpoint
    directory: Path
    commit: str
    files: tuple[str, ...]


def hub_checkpoints(overrides: str | None = None) -> list[HubCheckpoint]:
    """HUB_CHECKPOINTS with `NAME=OWNER/REPO[@REVISION],...` over it (a name not there adds an entry)."""
    specs = dict(HUB_CHECKPOINTS)
    for item in (overrides or "").split(","):
        if not item.strip():
            continue
        name, sep, spec = item.strip().partition("=")
        if not sep or not name.strip() or not spec.strip():
            raise ExportError(f"--checkpoints item {item.strip()!r} is not NAME=OWNER/REPO[@REVISION]")
        specs[name.strip()] = spec.strip()
    checkpoints = []
    for name, spec in specs.items():
        repo_id, _, revision = spec.partition("@")
        checkpoints.append(HubCheckpoint(name, repo_id, revision or None))
    return checkpoints


def offline_reason() -> str | None:
    """Why the hub is not to be asked at all (HF_HUB_OFFLINE or TRANSFORMERS_OFFLINE set), or None."""
    import os

    from huggingface_hub import constants

    if not constants.HF_HUB_OFFLINE:
        return None
    named = [name for name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE") if os.environ.get(name, "").strip()]
    return f"{' and '.join(named) or 'HF_HUB_OFFLINE'} {'are' if len(named) > 1 else 'is'} set"


def hub_endpoint() -> str:
    from huggingface_hub import constants

    return str(constants.ENDPOINT).rstrip("/")


def fetch(checkpoint: HubCheckpoint, progress: Progress = lambda _: None) -> Snapshot:
    """The checkpoint's files, fetched (or found in the cache) at the commit its revision names now."""
    from huggingface_hub import HfApi, snapshot_download

    where = f"{checkpoint.repo_id}" + (f"@{checkpoint.revision}" if checkpoint.revision else "")
    progress(f"asking {hub_endpoint()} for {where}")
    try:
        info = HfApi().model_info(checkpoint.repo_id, revision=checkpoint.revision, timeout=HUB_TIMEOUT_S)
    except Exception as exc:  # offline, DNS, refused, timed out, 404, gated, 5xx: all mean no hub demo
        raise HubUnavailable(_reason(where, exc)) from exc
    available = {sibling.rfilename for sibling in info.siblings or ()}
    if info.sha is None or not available:
        raise HubUnavailable(f"the hub listed no commit or no files for {where}")
    files = wanted_files(available)
    if "config.json" not in files or not files & set(VOCABULARY_FILES):
        raise HubUnavailable(f"{where} has no config.json or tokenizer files at {info.sha[:12]}")
    if not any(name.endswith((".safetensors", ".bin")) for name in files):
        raise HubUnavailable(f"{where} has no PyTorch weights (safetensors or bin) at {info.sha[:12]}")
    progress(f"fetching {len(files)} files of {checkpoint.repo_id} at {info.sha[:12]}")
    try:
        directory = snapshot_download(checkpoint.repo_id, revision=info.sha, allow_patterns=sorted(files))
    except Exception as exc:
        raise HubUnavailable(_reason(where, exc)) from exc
    return Snapshot(checkpoint, Path(directory), info.sha, tuple(sorted(files)))


def _reason(where: str, exc: Exception) -> str:
    """The reason: `hub unreachable (...)` where no answer came, what the hub answered otherwise."""
    try:
        status = getattr(getattr(exc, "response", None), "status_code", None)
    except RuntimeError:  # an httpx error without a response
        status = None
    if isinstance(status, int):
        return f"the hub answered {status} for {where} ({one_line(exc)})"
    return f"hub unreachable ({one_line(exc)})"


def wanted_files(available: set[str]) -> set[str]:
    """Config, tokenizer files and the first weight set of WEIGHT_SETS the repository has (no other formats)."""
    import fnmatch

    files = {name for name in (*CONFIG_FILES, *TOKENIZER_FILES) if name in available}
    for weight_set in WEIGHT_SETS:
        if weight_set[0] in available:
            files |= {name for name in available if any(fnmatch.fnmatchcase(name, pattern) for pattern in weight_set)}
            break
    return files


def source_info(snapshot: Snapshot) -> dict[str, Any]:
    repo_id, commit = snapshot.checkpoint.repo_id, snapshot.commit
    return {
        "kind": "hub",
        "checkpoint": repo_id,
        "revision": commit,
        "requested_revision": snapshot.checkpoint.revision,
        "url": f"{hub_endpoint()}/{repo_id}/tree/{commit}",
        "files": list(snapshot.files),
    }


def build_hub_demo(
    repository: Path,
    checkpoints: list[HubCheckpoint],
    variants: str | Iterable[str] = DEFAULT_VARIANTS,
    progress: Progress = lambda _: None,
) -> list[ExportResult]:
    """Fetch every checkpoint first (HubUnavailable if any cannot be, before an entry is written), then export each."""
    if reason := offline_reason():
        raise HubUnavailable(reason)
    snapshots = [fetch(checkpoint, progress) for checkpoint in checkpoints]
    return [
        export_checkpoint(
            str(snapshot.directory),
            snapshot.checkpoint.name,
            repository,
            variants=variants,
            progress=progress,
            source_info=source_info(snapshot),
        )
        for snapshot in snapshots
    ]
