"""The command line: a summary on success; on bad input one line, a non-zero exit, the repository untouched."""

from __future__ import annotations

import hashlib
import io
import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import transformers

from export.cli import main
from tests.harness.environment import offline_env
from tests.harness.serving import sigint_by_default
from tests.tiny_models import make_config, make_tokenizer, with_bert_specials

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
    no_tokenizer = copy_checkpoint(tiny, tmp_path / "no-tokenizer")
    (no_tokenizer / "tokenizer.json").unlink()
    (no_tokenizer / "tokenizer_config.json").unlink()
    config_only = copy_checkpoint(tiny, tmp_path / "tokenizer-config-only")
    (config_only / "tokenizer.json").unlink()
    specials_only = copy_checkpoint(tiny, tmp_path / "specials-only")
    _specials_only_tokenizer().save_pretrained(str(specials_only))
    multiple_choice = copy_checkpoint(tiny, tmp_path / "multiple-choice")
    _edit_config(multiple_choice, lambda config: config.update(architectures=["BertForMultipleChoice"]))
    masked_lm = copy_checkpoint(tiny, tmp_path / "masked-lm")
    _edit_config(masked_lm, lambda config: config.update(architectures=["BertForMaskedLM"]))
    duplicate_labels = copy_checkpoint(tiny, tmp_path / "duplicate-labels")
    _edit_config(duplicate_labels, lambda config: config.update(id2label={"0": "pos", "1": "pos", "2": "neg"}))
    empty_label = copy_checkpoint(tiny, tmp_path / "empty-label")
    _edit_config(empty_label, lambda config: config.update(id2label={"0": "pos", "1": " ", "2": "neg"}))
    two_labels = copy_checkpoint(tiny, tmp_path / "two-labels")  # no id2label: 2 labels, for a 3-label head
    _edit_config(two_labels, lambda config: [config.pop("id2label"), config.pop("label2id")])
    positions = copy_checkpoint(tiny, tmp_path / "positions")
    _edit_config(positions, lambda config: config.update(max_position_embeddings=512))
    fewer_layers = copy_checkpoint(tiny, tmp_path / "fewer-layers")  # exported without the last, validated, at chance
    _edit_config(fewer_layers, lambda config: config.update(num_hidden_layers=config["num_hidden_layers"] - 1))
    another_head = copy_checkpoint(tiny, tmp_path / "another-head")
    _edit_config(another_head, lambda config: config.update(architectures=["BertForQuestionAnswering"]))
    no_architectures = copy_checkpoint(tiny, tmp_path / "no-architectures")  # a classifier's weights
    _edit_config(no_architectures, lambda config: config.pop("architectures"))
    (tmp_path / "calibration.txt").write_text("")
    return {
        "no-architectures": no_architectures,
        "multiple-choice": multiple_choice,
        "masked-lm": masked_lm,
        "duplicate-labels": duplicate_labels,
        "empty-label": empty_label,
        "two-labels": two_labels,
        "positions": positions,
        "fewer-layers": fewer_layers,
        "another-head": another_head,
        "corrupt": corrupt,
        "truncated": truncated,
        "unsupported": unsupported,
        "base": base,
        "no-weights": no_weights,
        "no-tokenizer": no_tokenizer,
        "tokenizer-config-only": config_only,
        "specials-only": specials_only,
    }


def _edit_config(checkpoint: Path, edit) -> None:
    config = json.loads((checkpoint / "config.json").read_text())
    edit(config)
    (checkpoint / "config.json").write_text(json.dumps(config))


def _specials_only_tokenizer() -> transformers.PreTrainedTokenizerFast:
    """A tokenizer.json that loads but knows nothing but its special tokens, as transformers 5 builds one from a
    folder with no vocabulary."""
    from tokenizers import Tokenizer, models

    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    tokenizer = Tokenizer(models.WordPiece({token: i for i, token in enumerate(specials)}, unk_token="[UNK]"))
    return with_bert_specials(tokenizer)


CASES = [
    # (checkpoint key or literal path, extra args, expected message part)
    ("./no/such/checkpoint", [], "does not exist"),
    ("corrupt", [], "could not load the weights"),
    ("no-weights", [], "has no weights"),
    ("truncated", [], "could not load the tokenizer"),
    ("no-tokenizer", [], "no tokenizer in "),
    ("tokenizer-config-only", [], "expected tokenizer.json (or the family's vocabulary files, e.g. vocab.txt)"),
    ("specials-only", [], "no tokenizer in "),
    ("multiple-choice", [], "is a BertForMultipleChoice: its head (MultipleChoice) is not one this server serves;"),
    ("masked-lm", [], "is a BertForMaskedLM: its head (MaskedLM) is not one this server serves; export a"),
    ("duplicate-labels", [], "id2label names label 'pos' more than once (ids 0, 1): labels must differ"),
    ("empty-label", [], "id2label gives label 1 an empty name"),
    ("two-labels", [], "does not match its weights: classifier.bias is [3] in the weights but [2] by config.json;"),
    ("positions", [], "bert.embeddings.position_embeddings.weight is [64, 32] in the weights but [512, 32] by"),
    (
        "unsupported",
        [],
        "unsupported model_type 'gpt2' (GPT2LMHeadModel); supported: BERT, RoBERTa, ALBERT, DistilBERT, "
        "XLM-RoBERTa, CamemBERT, ELECTRA, ERNIE, MobileBERT, DeBERTa-v2/v3, ModernBERT, XLNet with a sequence",
    ),
    ("base", [], "a base model with no task head; export it as an embedding model with --task embedding"),
    ("no-architectures", [], "names no architectures, so which head its weights hold is not known: give --task"),
    ("no-architectures", ["--task", "qa"], "lacks trained weights for part of the qa model (qa_outputs.bias"),
    ("tiny", ["--task", "ner"], "task mismatch: "),
    ("tiny", ["--task", "qa"], "(classification) but --task qa was given"),
    ("someone/unreachable-model", [], "could not be fetched from the hub"),
    ("tiny", ["--variants", "fp32,fp8"], "unknown variant(s) fp8"),
    ("tiny", ["--max-length", "100000"], "--max-length 100000 is out of range"),
    ("tiny", ["--opset", "9"], "--opset 9 is out of range"),
    ("tiny", ["--opset", "0"], "--opset 0 is out of range: 14 to 20 are supported"),
    ("tiny", ["--eval-limit", "-2"], "--eval-limit -2 is out of range: give the number of examples to use, 1 or more"),
    ("tiny", ["--eval-limit", "0"], "--eval-limit 0 is out of range"),
    ("fewer-layers", [], "does not match its weights: they hold trained layers its model does not use (bert.encoder"),
    (
        "another-head",
        [],
        "lacks trained weights for part of the qa model (qa_outputs.bias, qa_outputs.weight): export a checkpoint "
        "fine-tuned for this task; its weights hold parts this model has not (classifier.bias, classifier.weight, "
        "bert.pooler.dense.bias (and 1 more tensors)): config.json",
    ),
    ("tiny", ["--eval-limit", "5"], "--eval-limit limits the examples of --eval: give --eval too"),
    ("tiny", ["--variants", "fp32", "--calibration", "CALIBRATION"], "--variants fp32 has no int8"),
]


@pytest.mark.parametrize(("source", "extra", "message"), CASES, ids=[f"{c[0]}{''.join(c[1])}" for c in CASES])
def test_bad_input_is_one_line_and_leaves_repository_alone(
    tiny_checkpoint, repository: Path, tmp_path: Path, capsys, source: str, extra: list[str], message: str
) -> None:
    tiny = tiny_checkpoint("bert", "classification")
    paths = {"tiny": tiny, **broken_checkpoints(tiny, tmp_path)}
    before = snapshot(repository)
    target = str(paths.get(source, source))
    extra = [str(tmp_path / "calibration.txt") if arg == "CALIBRATION" else arg for arg in extra]
    code = main([target, "--name", "existing", "--repository", str(repository), "--quiet", *extra])
    err = capsys.readouterr().err.strip()
    assert code == 1
    assert err.startswith("error: ") and "\n" not in err, err
    assert message in err
    assert snapshot(repository) == before


def test_a_repository_path_that_is_a_file_is_refused_before_any_work(tiny_checkpoint, tmp_path: Path, capsys) -> None:
    """It failed at the write, after the whole export, with "File exists"."""
    afile = tmp_path / "afile"
    afile.write_text("not a folder")
    source = str(tiny_checkpoint("electra", "ner"))
    for repository in (afile, afile / "models"):
        assert main([source, "--name", "m", "--repository", str(repository), "--quiet"]) == 1
        err = capsys.readouterr().err.strip()
        assert err == f"error: cannot write to the model repository {repository}: {afile} is not a folder", err
    assert main([source, "--name", "m", "--repository", str(tmp_path / "repo"), "--task", "qa", "--quiet"]) == 1
    assert "is an ElectraForTokenClassification (ner) but --task qa was given" in capsys.readouterr().err


def test_a_config_that_names_no_architectures_exports_with_its_task_given(
    tiny_checkpoint, tmp_path: Path, capsys
) -> None:
    """config.json without `architectures` (some training frameworks write none): --task says the head, and the
    entry names the class that loaded it; it was refused as 'a base model with no task head' whatever --task said."""
    checkpoint = broken_checkpoints(tiny_checkpoint("bert", "classification"), tmp_path)["no-architectures"]
    repository = tmp_path / "repo"
    args = [str(checkpoint), "--name", "headless", "--repository", str(repository), "--quiet"]
    assert main(args) == 1 and "names no architectures" in capsys.readouterr().err
    assert main([*args, "--task", "classification"]) == 0, capsys.readouterr().err
    config = json.loads((repository / "headless" / "model.json").read_text())
    assert config["task"] == "classification" and config["architecture"] == "BertForSequenceClassification"
    assert config["variants"]["fp32"]["validation"]["passed"]


@pytest.mark.parametrize(
    ("family", "task", "architectures", "extra", "message"),
    [
        # a sequence classifier's classifier fits a token classifier's shape: DistilBERT's pre_classifier tells
        ("distilbert", "classification", None, ["--task", "ner"], "hold a head that a model of task ner has not"),
        ("bert", "classification", None, ["--task", "embedding", "--pooling", "mean"], "of task embedding has not"),
        # AutoModelForQuestionAnswering loads XLNet's Simple class over it: "lacks trained weights", it said
        ("xlnet", "qa", ["XLNetForQuestionAnswering"], [], "its head (start and end found by beam search"),
    ],
)
def test_another_tasks_head_is_refused_where_its_weights_tell(
    tiny_checkpoint,
    tmp_path: Path,
    capsys,
    family: str,
    task: str,
    architectures: list | None,
    extra: list,
    message: str,
) -> None:
    """Exported and served as asked: a DistilBERT sentiment classifier as a tagger, a classifier as an embedder."""
    checkpoint = tmp_path / "checkpoint"
    shutil.copytree(tiny_checkpoint(family, task), checkpoint)
    config = json.loads((checkpoint / "config.json").read_text())
    config["architectures"] = architectures
    (checkpoint / "config.json").write_text(json.dumps(config))
    repository = tmp_path / "repo"
    args = [str(checkpoint), "--name", "other", "--repository", str(repository), "--quiet", *extra]
    assert main(args) == 1
    err = capsys.readouterr().err
    assert message in err and "\n" not in err.strip(), err
    assert not (repository / "other").exists()


def _sentencepiece_only(checkpoint: Path, file: str, tokenizer_class: str, **training: Any) -> Path:
    """The checkpoint with a trained SentencePiece vocabulary in place of its tokenizer.json, as a checkpoint saved
    with a slow tokenizer has it."""
    import sentencepiece

    from tests.tiny_models import CORPUS

    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        (checkpoint / name).unlink(missing_ok=True)
    trained = io.BytesIO()
    sentencepiece.SentencePieceTrainer.train(
        sentence_iterator=iter(CORPUS), model_writer=trained, vocab_size=120, hard_vocab_limit=False, **training
    )
    (checkpoint / file).write_bytes(trained.getvalue())
    (checkpoint / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": tokenizer_class}))
    return checkpoint


def test_a_sentencepiece_vocabulary_alone_is_read(tiny_checkpoint, tmp_path: Path, capsys) -> None:
    """A checkpoint saved with a slow tokenizer has sentencepiece.bpe.model and no tokenizer.json. transformers
    converts it with sentencepiece's model_pb2, which sentencepiece 0.2.3 generated for protobuf 7 (the lock holds
    6): the export failed, blaming tiktoken."""
    checkpoint = tmp_path / "spm-only"
    shutil.copytree(tiny_checkpoint("xlm-roberta", "classification"), checkpoint)
    _sentencepiece_only(checkpoint, "sentencepiece.bpe.model", "XLMRobertaTokenizer")
    repository = tmp_path / "repo"
    args = [str(checkpoint), "--name", "spm", "--repository", str(repository), "--variants", "fp32", "--quiet"]
    assert main(args) == 0, capsys.readouterr().err
    assert (repository / "spm" / "tokenizer.json").is_file()


def test_an_albert_vocabulary_without_its_special_tokens_says_so(tiny_checkpoint, tmp_path: Path, capsys) -> None:
    """ALBERT's tokenizer puts [CLS] and [SEP] around each text. A spiece.model that lacks them had failed inside
    transformers with "TypeError: Expected Union[Tuple[str, int], Tuple[int, str], dict] while processing
    'special_tokens'", which names no cause; with them, the same vocabulary exports."""
    repository = tmp_path / "repo"
    for name, training in (("without", {}), ("with", {"user_defined_symbols": ["[CLS]", "[SEP]", "[MASK]"]})):
        checkpoint = tmp_path / name
        shutil.copytree(tiny_checkpoint("albert", "classification"), checkpoint)
        _sentencepiece_only(checkpoint, "spiece.model", "AlbertTokenizer", **training)
        args = [str(checkpoint), "--name", name, "--repository", str(repository), "--variants", "fp32", "--quiet"]
        code = main(args)
        err = capsys.readouterr().err.strip()
        if name == "with":
            assert code == 0, err
        else:
            assert code == 1 and "\n" not in err, err
            assert err.startswith(f"error: could not load the tokenizer of {checkpoint}: its vocabulary has no ")
            assert "[CLS]" in err and "[SEP]" in err and not (repository / name).exists()


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


def test_sigterm_mid_export_leaves_the_repository_as_it_was(tiny_checkpoint, tmp_path: Path) -> None:
    """docker stop, a pod deleted: SIGTERM while the staging folder is being written removes it, as Ctrl-C does."""
    import signal
    import time

    checkpoint = tiny_checkpoint("bert", "classification", hidden_size=256, num_hidden_layers=6, intermediate_size=1024)
    repository = tmp_path / "models"
    (repository / "m").mkdir(parents=True)
    (repository / "m" / "model.json").write_text("{}")
    before = snapshot(repository)
    command = [sys.executable, "-m", "export", str(checkpoint), "--name", "m", "--repository", str(repository)]
    process = subprocess.Popen(
        [*command, "--variants", "fp32,int8"], cwd=ROOT, env=offline_env(), stderr=subprocess.PIPE, text=True
    )
    deadline = time.monotonic() + 120
    while not list(repository.glob(".m.staging-*")) and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    assert process.poll() is None, "the export ended before its staging folder was seen"
    process.send_signal(signal.SIGTERM)
    _, err = process.communicate(timeout=120)
    assert process.returncode == 143, (err, snapshot(repository))
    assert err.strip().splitlines()[-1] == "error: terminated (SIGTERM); the repository was left as it was"
    assert "Traceback" not in err
    assert snapshot(repository) == before, err


@pytest.mark.parametrize("points", ["nan", "inf", "-inf", "NaN"])
def test_max_accuracy_loss_must_be_finite(tiny_checkpoint, tmp_path: Path, capsys, points: str) -> None:
    """NaN would refuse every variant (and model.json would hold a bare NaN, which is not JSON); inf is no budget."""
    args = [str(tiny_checkpoint("bert", "classification")), "--name", "m", "--repository", str(tmp_path / "models")]
    with pytest.raises(SystemExit) as exited:
        main([*args, f"--max-accuracy-loss={points}"])
    assert exited.value.code == 2  # as argparse refuses any other bad flag
    assert f"argument --max-accuracy-loss: {points!r} is not a finite number of points" in capsys.readouterr().err
    assert not (tmp_path / "models").exists()
    from export.errors import ExportError
    from export.pipeline import export_checkpoint

    with pytest.raises(ExportError, match="is not a finite number of points"):
        export_checkpoint(args[0], "m", tmp_path / "models", max_accuracy_loss=float(points))
    assert not (tmp_path / "models").exists()


def test_ctrl_c_mid_demo_says_which_entries_it_kept(tmp_path: Path) -> None:
    """The demo builds its three entries in turn: a Ctrl-C after the first said "the repository was left as it
    was" with demo-sentiment written in it."""
    import signal
    import time

    repository = tmp_path / "models"
    command = [sys.executable, "-m", "export", "demo", "--repository", str(repository), "--source", "random"]
    process = subprocess.Popen(
        command, cwd=ROOT, env=offline_env(), stderr=subprocess.PIPE, text=True, preexec_fn=sigint_by_default
    )  # SIGINT as a terminal's job has it (a background runner's children inherit it ignored)
    deadline = time.monotonic() + 180
    while not (repository / "demo-sentiment" / "model.json").is_file() and time.monotonic() < deadline:
        assert process.poll() is None, process.communicate()[1]
        time.sleep(0.01)
    process.send_signal(signal.SIGINT)
    _, err = process.communicate(timeout=120)
    assert process.returncode == 130, err
    assert err.strip().splitlines()[-1] == (
        "error: interrupted; the entry being built was not written; "
        "the demo entries already in it are kept (demo-sentiment)"
    )
    assert "Traceback" not in err
    assert sorted(path.name for path in repository.iterdir()) == ["demo-sentiment"]


def test_the_stored_dtype_is_read_from_the_weights_where_the_config_names_none(tmp_path: Path) -> None:
    """sentence-transformers' configs name no dtype: the summary said "stored unknown"."""
    import torch
    from safetensors.torch import save_file

    from export.checkpoint import _weights_dtype

    tensors = {"a": torch.zeros(4, dtype=torch.float16), "b": torch.zeros(2, dtype=torch.float16)}
    save_file({**tensors, "ids": torch.zeros(3, dtype=torch.int64)}, str(tmp_path / "model.safetensors"))
    assert _weights_dtype(tmp_path) == "float16"
    assert _weights_dtype(tmp_path / "none") is None
    (tmp_path / "model.safetensors").write_bytes(b"\xff" * 16)  # a broken header: unknown, no error
    assert _weights_dtype(tmp_path) is None
