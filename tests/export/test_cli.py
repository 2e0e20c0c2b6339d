"""The command line: a summary on success; on bad input one line, a non-zero exit, the repository untouched."""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import transformers

from export.cli import main
from tests.harness.environment import offline_env
from tests.tiny_models import make_config, make_tokenizer

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def repository(tiny_checkpoint, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A repository that already holds an entry named 'existing'."""
    repo = tmp_path_factory.mktemp("repo")
    assert (
        main(
            [
                str(tiny_checkpoint("bert", "classification")),
                "--name",
                "existing",
                "--repository",
                str(repo),
                "--variants",
                "fp32",
                "--quiet",
            ]
        )
        == 0
    )
    return repo


def snapshot(directory: Path) -> dict[str, str]:
    return {
        str(path.relative_to(directory)): hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else "dir"
        for path in sorted(directory.rglob("*"))
    }


def copy_checkpoint(source: Path, target: Path) -> Path:
    shutil.copytree(source, target)
    return target


def broken_checkpoints(tiny: Path, tmp_path: Path) -> dict[str, Path]:
    corrupt = copy_checkpoint(tiny, tmp_path / "corrupt")
    (corrupt / "model.safetensors").write_bytes(b"\x00garbage, not a safetensors header" * 10)
    truncated = copy_checkpoint(tiny, tmp_path / "truncated")
    text = (truncated / "tokenizer.json").read_text()
    (truncated / "tokenizer.json").write_text(text[: len(text) // 2])
    unsupported = tmp_path / "gpt2"
    unsupported.mkdir()
    (unsupported / "config.json").write_text(json.dumps({"model_type": "gpt2", "architectures": ["GPT2LMHeadModel"]}))
    base = tmp_path / "base"
    tokenizer = make_tokenizer("bert")
    transformers.BertModel(make_config("bert", "ner", tokenizer)).save_pretrained(str(base))
    tokenizer.save_pretrained(str(base))
    no_weights = copy_checkpoint(tiny, tmp_path / "no-weights")
    (no_weights / "model.safetensors").unlink()
    return {
        "corrupt": corrupt,
        "truncated": truncated,
        "unsupported": unsupported,
        "base": base,
        "no-weights": no_weights,
    }


CASES = [
    # (checkpoint key or literal path, extra args, expected message part)
    ("./no/such/checkpoint", [], "does not exist"),
    ("corrupt", [], "could not load the weights"),
    ("no-weights", [], "has no weights"),
    ("truncated", [], "could not load the tokenizer"),
    (
        "unsupported",
        [],
        "unsupported model_type 'gpt2' (GPT2LMHeadModel); supported: BERT, RoBERTa, ALBERT, DistilBERT, "
        "XLM-RoBERTa, CamemBERT, ELECTRA, ERNIE, MobileBERT, DeBERTa-v2/v3, ModernBERT, XLNet with a sequence",
    ),
    ("base", [], "a base model with no task head; export it as an embedding model with --task embedding"),
    ("tiny", ["--task", "ner"], "task mismatch: "),
    ("tiny", ["--task", "qa"], "(classification) but --task qa was given"),
    ("someone/unreachable-model", [], "could not be fetched from the hub"),
    ("tiny", ["--variants", "fp32,fp8"], "unknown variant(s) fp8"),
    ("tiny", ["--max-length", "100000"], "--max-length 100000 is out of range"),
    ("tiny", ["--opset", "9"], "--opset 9 is out of range"),
]


@pytest.mark.parametrize(("source", "extra", "message"), CASES, ids=[f"{c[0]}{''.join(c[1])}" for c in CASES])
def test_bad_input_is_one_line_and_leaves_repository_alone(
    tiny_checkpoint, repository: Path, tmp_path: Path, capsys, source: str, extra: list[str], message: str
) -> None:
    tiny = tiny_checkpoint("bert", "classification")
    paths = {"tiny": tiny, **broken_checkpoints(tiny, tmp_path)}
    before = snapshot(repository)
    target = str(paths.get(source, source))
    code = main([target, "--name", "existing", "--repository", str(repository), "--quiet", *extra])
    err = capsys.readouterr().err.strip()
    assert code == 1
    assert err.startswith("error: ") and "\n" not in err, err
    assert message in err
    assert snapshot(repository) == before


@pytest.mark.parametrize(
    ("name", "message"), [("Bad Name!", "is not a valid model name"), (None, "--name is required")]
)
def test_bad_name(tiny_checkpoint, tmp_path: Path, capsys, name: str | None, message: str) -> None:
    args = [str(tiny_checkpoint("bert", "qa")), "--repository", str(tmp_path / "repo")]
    code = main(args + (["--name", name] if name else []))
    assert code == 1 and message in capsys.readouterr().err
    assert not (tmp_path / "repo").exists()


def test_failure_during_writing_leaves_no_trace(tiny_checkpoint, repository: Path, monkeypatch, capsys) -> None:
    """A failure after the staging folder exists (here: in int8 quantization) removes it; the old entry stays."""
    import export.pipeline

    def explode(*_args, **_kwargs):
        raise RuntimeError("disk full")

    monkeypatch.setattr(export.pipeline, "write_int8_static", explode)
    before = snapshot(repository)
    code = main([str(tiny_checkpoint("roberta", "ner")), "--name", "existing", "--repository", str(repository)])
    assert code == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == "error: unexpected failure: RuntimeError: disk full"
    assert snapshot(repository) == before


def test_command_line_end_to_end(tiny_checkpoint, tmp_path: Path) -> None:
    env = offline_env()
    command = [
        sys.executable,
        "-m",
        "export",
        str(tiny_checkpoint("albert", "qa")),
        "--name",
        "albert-qa",
        "--repository",
        str(tmp_path / "models"),
    ]
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    out = done.stdout
    for expected in (
        "AlbertForQuestionAnswering",
        "input_ids, attention_mask, token_type_ids",
        "Attention 3",
        "fp32",
        "fp16",
        "int8",
        "max |diff|",
        " kB ",
        "done in",
    ):
        assert expected in out, out
    assert "Traceback" not in done.stderr

    corrupt = copy_checkpoint(tiny_checkpoint("albert", "qa"), tmp_path / "corrupt")
    (corrupt / "model.safetensors").write_bytes(b"junk")
    done = subprocess.run(
        [*command[:3], str(corrupt), *command[4:]], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 1
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert errors == [done.stderr.strip().splitlines()[-1]]  # progress lines, then one reason
    assert errors[0].startswith("error: could not load the weights") and "Traceback" not in done.stderr
    assert (tmp_path / "models" / "albert-qa" / "model.json").is_file()
