"""Sentence embeddings (issue 38, export half): a sentence-transformers directory, or a base model with --task embedding
--pooling, becomes an entry of task `embedding` whose graph answers one vector per input, equal to
sentence-transformers' own `encode`; --eval measures retrieval recall per variant; what is not supported is refused
in one line."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
import torch

from bertcore.model_config import ModelConfig
from export.cli import main
from export.embedding_check import cosine_rows, encode_batches, reference_texts
from export.pipeline import ExportResult
from export.report import summary
from export.retrieval import score
from export.sample_text import SENTENCES
from tests.conftest import SHARED
from tests.export.embedding_models import (
    MAX_SEQ_LENGTH,
    MINIMAL_ENTRY_CONFIG,
    write_base_model,
    write_sentence_transformers,
)

FP32_BOUND, FP16_BOUND = 0.99999, 0.999


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("embedding-checkpoints")
    return {
        "bert-st": write_sentence_transformers(root / "bert-st", "bert", dense=16),
        "roberta-st": write_sentence_transformers(root / "roberta-st", "roberta", pooling="cls", normalize=False),
        "distilbert": write_base_model(root / "distilbert", "distilbert"),
        "bert": write_base_model(root / "bert", "bert"),
        "subfolder-st": encoder_in_a_subfolder(write_sentence_transformers(root / "sub-st", "bert", pooling="max")),
    }


def encoder_in_a_subfolder(directory: Path) -> Path:
    """The older layout: the Transformer module's files in 0_Transformer/, modules.json naming it."""
    encoder = directory / "0_Transformer"
    encoder.mkdir()
    for file in directory.iterdir():
        if file.is_file() and file.name not in ("modules.json", "config_sentence_transformers.json", "README.md"):
            file.rename(encoder / file.name)
    modules = json.loads((directory / "modules.json").read_text())
    modules[0]["path"] = "0_Transformer"
    (directory / "modules.json").write_text(json.dumps(modules))
    return directory


@pytest.fixture(scope="module")
def bert_st_entry(checkpoints, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    """The tiny BERT sentence-transformers directory (mean pooling, Dense to 16, Normalize), exported once with the
    default variants and no --task: (entry, its model.json)."""
    repository = tmp_path_factory.mktemp("bert-st-repository")
    return repository / "embed", export_entry(checkpoints["bert-st"], repository)


@pytest.fixture(scope="module")
def retrieval_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Each sentence's first words as a query, the sentences as passages: its own sentence answers each."""
    path = tmp_path_factory.mktemp("retrieval") / "retrieval.json"
    queries = [" ".join(sentence.split()[:4]) for sentence in SENTENCES]
    path.write_text(json.dumps({"queries": queries, "passages": list(SENTENCES), "answers": [[i] for i in range(12)]}))
    return path


def export_entry(checkpoint: Path, repository: Path, *extra: str) -> dict[str, Any]:
    code = main([str(checkpoint), "--name", "embed", "--repository", str(repository), "--quiet", *extra])
    assert code == 0
    return json.loads((repository / "embed" / "model.json").read_text())


def sentence_transformers_vectors(checkpoint: Path, pooling: str | None = None, normalize: bool = False) -> np.ndarray:
    import torch
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import Normalize, Pooling, Transformer

    if pooling is None:
        model = SentenceTransformer(str(checkpoint), device="cpu", model_kwargs={"dtype": torch.float32})
    else:
        encoder = Transformer(str(checkpoint), model_kwargs={"dtype": torch.float32})
        modules = [encoder, Pooling(int(encoder.auto_model.config.hidden_size), pooling)]
        model = SentenceTransformer(modules=[*modules, *([Normalize()] if normalize else [])], device="cpu")
    return np.asarray(model.encode(reference_texts(), batch_size=5), dtype=np.float64)


def onnx_vectors(entry: Path, variant: str) -> np.ndarray:
    """The variant's vectors of the reference texts, tokenized by the entry's own tokenizer.json (the server's)."""
    import onnxruntime as ort
    from tokenizers import Tokenizer

    config = ModelConfig.read(entry)
    tokenizer = Tokenizer.from_file(str(entry / config.tokenizer.file))
    tokenizer.enable_truncation(config.max_length)
    session = ort.InferenceSession(str(entry / config.variant_file(variant)), providers=["CPUExecutionProvider"])
    vectors = []
    for text in reference_texts():  # one at a time: no padding, as a front-end sends a lone input
        encoding = tokenizer.encode(text)
        feed = {
            "input_ids": np.array([encoding.ids], dtype=np.int64),
            "attention_mask": np.array([encoding.attention_mask], dtype=np.int64),
            "token_type_ids": np.array([encoding.type_ids], dtype=np.int64),
        }
        vectors.append(session.run(["sentence_embedding"], {n: feed[n] for n in config.inputs})[0][0])
    return np.array(vectors, dtype=np.float64)


def output_shape(path: Path) -> list[str | int]:
    (output,) = onnx.load(str(path), load_external_data=False).graph.output
    return [d.dim_param or d.dim_value for d in output.type.tensor_type.shape.dim]


def test_a_sentence_transformers_directory_is_an_embedding_entry(checkpoints, bert_st_entry) -> None:
    entry, config = bert_st_entry  # no --task: modules.json says it
    parsed = ModelConfig.read(entry)
    assert parsed.task == "embedding" and not parsed.per_token and parsed.labels == ()
    assert parsed.embedding is not None
    assert (parsed.embedding.pooling, parsed.embedding.normalize, parsed.embedding.dimension) == ("mean", True, 16)
    assert parsed.embedding.dense_layers == 1 and parsed.embedding.similarity == "cosine"
    assert config["outputs"] == ["sentence_embedding"] and config["max_length"] == MAX_SEQ_LENGTH
    for variant in ("fp32", "fp16", "int8"):
        assert output_shape(entry / config["variants"][variant]["file"]) == ["batch", 16]
    # attention fused in every layer, as for the other tasks; the int8 graph quantizes it (QAttention)
    assert config["attention_fusion"] == {"fused_layers": 2, "layers": 2, "reason": None}
    assert config["variants"]["fp32"]["fused_operators"]["Attention"] == 2
    assert config["variants"]["fp16"]["fused_operators"]["Attention"] == 2
    assert config["variants"]["int8"]["fused_operators"]["QAttention"] == 2
    fp32 = config["variants"]["fp32"]["validation"]
    assert fp32["passed"] and fp32["embedding_reference"]["reference"].startswith("sentence-transformers ")
    assert (
        fp32["embedding_reference"]["min_cosine"] >= FP32_BOUND and fp32["embedding_reference"]["bound"] == FP32_BOUND
    )
    assert fp32["agreement_of"] == "vectors (cosine >= 0.999)"
    int8 = config["variants"]["int8"]["validation"]
    assert int8["embedding_reference"]["bound"] is None and int8["embedding_reference"]["min_cosine"] > 0.99
    # the CLI's summary gives each variant's cosine with sentence-transformers, not a share above 0.999 (int8: 0%)
    lines = summary(ExportResult(entry, config, 1.0)).splitlines()
    (int8_line,) = [line for line in lines if line.lstrip().startswith("int8 ")]
    assert "agree" not in int8_line and "cosine with sentence-transformers " in int8_line, int8_line
    # the graph's vectors, tokenized as the server will (tokenizer.json), against sentence-transformers' encode
    expected = sentence_transformers_vectors(checkpoints["bert-st"])
    assert cosine_rows(onnx_vectors(entry, "fp32"), expected).min() >= FP32_BOUND
    assert np.allclose(np.linalg.norm(onnx_vectors(entry, "fp32"), axis=-1), 1.0, atol=1e-5)  # Normalize, in the graph


@pytest.mark.parametrize(
    ("name", "extra", "pooling", "normalize"),
    [
        ("roberta-st", [], "cls", False),  # byte-level BPE, no Normalize module
        ("subfolder-st", [], "max", True),  # the encoder's files in 0_Transformer/
        ("distilbert", ["--task", "embedding", "--pooling", "max", "--normalize"], "max", True),
        ("bert", ["--task", "embedding", "--pooling", "cls"], "cls", False),
    ],
)
def test_families_and_pooling_modes_equal_sentence_transformers(
    checkpoints, tmp_path: Path, name: str, extra: list[str], pooling: str, normalize: bool
) -> None:
    config = export_entry(checkpoints[name], tmp_path, "--variants", "fp32,int8", *extra)
    spec = config["embedding"]
    assert (spec["pooling"], spec["normalize"], spec["dimension"]) == (pooling, normalize, 32)
    plain = "--pooling" in extra
    assert spec["source"] == ("--pooling" if plain else "sentence-transformers")
    assert config["source"]["checkpoint"] == str(checkpoints[name].resolve())
    assert config["attention_fusion"]["fused_layers"] == 2
    assert config["variants"]["fp32"]["validation"]["embedding_reference"]["min_cosine"] >= FP32_BOUND
    for variant in ("fp32", "int8"):  # every pooling mode: a row's vector alone and in a batch, bit for bit
        assert config["variants"][variant]["validation"]["batch_invariance_max_abs_diff"] == 0.0
    expected = sentence_transformers_vectors(checkpoints[name], pooling if plain else None, normalize)
    assert cosine_rows(onnx_vectors(tmp_path / "embed", "fp32"), expected).min() >= FP32_BOUND
    assert cosine_rows(onnx_vectors(tmp_path / "embed", "int8"), expected).min() >= 0.99


def test_retrieval_eval_measures_recall_per_variant(checkpoints, retrieval_file: Path, tmp_path: Path) -> None:
    config = export_entry(checkpoints["bert-st"], tmp_path, "--variants", "fp32,int8", "--eval", str(retrieval_file))
    assert config["evaluation"]["metric"] == "recall@10" and config["evaluation"]["examples"] == 12
    assert config["evaluation"]["format"] == "retrieval JSON"
    for variant in ("fp32", "int8"):
        accuracy = config["variants"][variant]["accuracy"]
        assert accuracy["measured"] and set(accuracy["scores"]) == {"recall@1", "recall@10", "mrr@10"}
        assert accuracy["agreement_of"] == "top-1 passages"
    assert config["variants"]["fp32"]["accuracy"]["scores"]["recall@10"] == 100.0  # 12 passages: all in the top 10
    within = config["variants"]["int8"]["accuracy"]["within_budget"]
    assert config["default_variant"]["cpu"] == ("int8" if within else "fp32")


def test_an_int8_that_loses_recall_is_refused(checkpoints, retrieval_file: Path, tmp_path: Path, monkeypatch) -> None:
    """Over --max-accuracy-loss points of recall@10 (here: int8's rankings made to miss every answer), int8 is
    refused and the CPU default stays fp32, as for the other tasks."""
    import export.evaluation

    real_predict = export.evaluation.predict
    calls: list[str] = []

    def predict(session, data, labels):  # fp32 comes first; every later variant's rankings lose their answers
        answers = real_predict(session, data, labels)
        calls.append(data.task)
        if len(calls) == 1:
            return answers
        return [[p for p in ranked if p not in gold] for ranked, gold in zip(answers, data.golds, strict=True)]

    monkeypatch.setattr(export.evaluation, "predict", predict)
    config = export_entry(checkpoints["bert-st"], tmp_path, "--variants", "fp32,int8", "--eval", str(retrieval_file))
    assert set(config["variants"]) == {"fp32"} and config["default_variant"]["cpu"] == "fp32"
    reason = config["refused_variants"]["int8"]["reason"]
    assert reason.startswith("int8 refused: recall@10 0.00 against fp32's 100.00 on retrieval.json (12 examples)")


def test_retrieval_scores() -> None:
    ranked = [[3, 1, 2], [0, 2, 1], [2, 0, 1]]
    assert score(ranked, [[3], [1], [5]]) == {"recall@1": 33.33, "recall@10": 66.67, "mrr@10": 44.44}


def test_a_variant_under_its_cosine_bound_is_refused(checkpoints, tmp_path: Path, monkeypatch, capsys) -> None:
    import export.pipeline

    monkeypatch.setattr(export.pipeline, "COSINE_BOUNDS", {"fp32": FP32_BOUND, "int8": 0.9999999})
    config = export_entry(checkpoints["bert-st"], tmp_path, "--variants", "fp32,int8")
    assert set(config["variants"]) == {"fp32"} and not (tmp_path / "embed" / "model.int8.onnx").exists()
    reason = config["refused_variants"]["int8"]["reason"]
    assert (
        reason.startswith("int8 refused: its vectors' least cosine with sentence-transformers ")
        and "0.9999999" in reason
    )
    assert config["default_variant"]["cpu"] == "fp32"
    monkeypatch.setattr(export.pipeline, "COSINE_BOUNDS", {"fp32": 1.5})  # fp32 missing its bound stops the export
    code = main([str(checkpoints["bert-st"]), "--name", "other", "--repository", str(tmp_path), "--quiet"])
    err = capsys.readouterr().err.strip()
    assert code == 1 and err.startswith("error: fp32 refused: its vectors' least cosine") and "\n" not in err
    assert not (tmp_path / "other").exists()


def unsupported_module(checkpoint: Path, tmp_path: Path) -> Path:
    import shutil

    copy = tmp_path / "unsupported-st"
    shutil.copytree(checkpoint, copy)
    modules = json.loads((copy / "modules.json").read_text())
    modules.insert(2, {"idx": 9, "name": "9", "path": "", "type": "sentence_transformers.models.LayerNorm"})
    (copy / "modules.json").write_text(json.dumps(modules))
    return copy


def weighted_mean(checkpoint: Path, tmp_path: Path) -> Path:
    import shutil

    copy = tmp_path / "weighted-st"
    shutil.copytree(checkpoint, copy)
    pooling = json.loads((copy / "1_Pooling" / "config.json").read_text())
    (copy / "1_Pooling" / "config.json").write_text(json.dumps({**pooling, "pooling_mode": "weightedmean"}))
    return copy


REFUSALS = [
    ("classifier", ["--pooling", "mean"], "--pooling and --normalize are for --task embedding, not --task auto"),
    ("classifier", ["--task", "embedding", "--pooling", "mean"], "task mismatch: "),
    ("bert", ["--task", "embedding"], "--task embedding on a base checkpoint needs --pooling mean|cls|max"),
    ("bert-st", ["--pooling", "cls"], "is a sentence-transformers directory: its pooling and normalization come"),
    ("bert-st", ["--task", "ner"], "task mismatch: "),
    ("unsupported", [], "module 'sentence_transformers.models.LayerNorm' is not supported here"),
    ("weighted", [], "pooling mode 'weightedmean' is not supported; mean, cls, max, mean_sqrt_len_tokens are"),
    ("bad-eval", [], "'answers' must hold one list of passage indices per query"),
]


@pytest.mark.parametrize(("source", "extra", "message"), REFUSALS, ids=[f"{r[0]}{''.join(r[1])}" for r in REFUSALS])
def test_what_is_not_supported_is_refused_in_one_line(
    checkpoints, tiny_checkpoint, tmp_path: Path, capsys, source: str, extra: list[str], message: str
) -> None:
    repository = tmp_path / "repository"
    (repository / "existing").mkdir(parents=True)
    (repository / "existing" / "model.json").write_text("{}")
    paths = {
        **checkpoints,
        "classifier": tiny_checkpoint("bert", "classification"),
        "unsupported": unsupported_module(checkpoints["bert-st"], tmp_path),
        "weighted": weighted_mean(checkpoints["bert-st"], tmp_path),
        "bad-eval": checkpoints["bert-st"],
    }
    if source == "bad-eval":
        bad = tmp_path / "bad.json"
        bad.write_text(json.dumps({"queries": ["q"], "passages": ["p"], "answers": []}))
        extra = ["--eval", str(bad)]
    before = hashlib.sha256((repository / "existing" / "model.json").read_bytes()).hexdigest()
    code = main([str(paths[source]), "--name", "existing", "--repository", str(repository), "--quiet", *extra])
    err = capsys.readouterr().err.strip()
    assert code == 1 and err.startswith("error: ") and "\n" not in err, err
    assert message in err, err
    assert sorted(p.name for p in repository.iterdir()) == ["existing"]
    assert hashlib.sha256((repository / "existing" / "model.json").read_bytes()).hexdigest() == before


def test_model_config_contract() -> None:
    base = json.loads(json.dumps(MINIMAL_ENTRY_CONFIG))
    assert ModelConfig.parse(base).embedding is not None
    for change, message in [
        ({"embedding": None}, "field 'embedding' is missing"),
        (
            {"embedding": {**MINIMAL_ENTRY_CONFIG["embedding"], "pooling": "weightedmean"}},
            "embedding.pooling 'weightedmean'",
        ),
        ({"embedding": {**MINIMAL_ENTRY_CONFIG["embedding"], "dimension": 0}}, "embedding.dimension 0"),
        ({"task": "classification", "labels": ["a", "b"]}, "has an 'embedding' section but task 'classification'"),
    ]:
        with pytest.raises(ValueError, match=message.replace("(", r"\(")):
            ModelConfig.parse({**base, **change})


def test_padding_does_not_move_a_vector(checkpoints, bert_st_entry) -> None:
    """A row's vector alone and in a padded batch, bit for bit (mean pooling counts only real tokens), fp32 and
    static int8: the pooling's ReduceSum summed in blocks that moved with the batch's padded length (~1e-7 apart:
    identical requests answered different vectors with different neighbours)."""
    import onnxruntime as ort

    from export.checkpoint import load_checkpoint

    checkpoint = load_checkpoint(str(checkpoints["bert-st"]))
    texts = [SENTENCES[0], SENTENCES[3] * 3, "Short."]
    (batch,) = encode_batches(checkpoint, texts)
    for variant in ("fp32", "int8"):
        session = ort.InferenceSession(str(bert_st_entry[0] / f"model.{variant}.onnx"))
        together = session.run(["sentence_embedding"], batch)[0]
        for row, real in enumerate(batch["attention_mask"].astype(bool)):
            alone = session.run(["sentence_embedding"], {k: v[row : row + 1, real] for k, v in batch.items()})[0]
            assert np.array_equal(alone[0], together[row]), np.abs(alone[0] - together[row]).max()


def test_retrieval_data_from_squad(tmp_path: Path) -> None:
    from export.retrieval_data import main as make_retrieval

    squad = {
        "data": [
            {"paragraphs": [{"context": "Paris is in France.", "qas": [{"question": " Where is Paris? "}]}]},
            {
                "paragraphs": [
                    {"context": "The Thames flows through London.", "qas": [{"question": "What flows?"}]},
                    {"context": "Berlin is large.", "qas": [{"question": "Is Berlin large?"}, {"question": "Which?"}]},
                ]
            },
        ]
    }
    (tmp_path / "squad.json").write_text(json.dumps(squad))
    assert make_retrieval([str(tmp_path / "squad.json"), str(tmp_path / "out.json")]) == 0
    made = json.loads((tmp_path / "out.json").read_text())
    assert made["queries"] == ["Where is Paris?", "What flows?", "Is Berlin large?", "Which?"]
    assert len(made["passages"]) == 3 and made["answers"] == [[0], [1], [2], [2]]
    assert make_retrieval([str(tmp_path / "squad.json"), str(tmp_path / "one.json"), "--articles", "1"]) == 0
    assert json.loads((tmp_path / "one.json").read_text())["answers"] == [[0]]


def test_embedding_check_measures_every_variant_again(bert_st_entry, capsys) -> None:
    from export.embedding_check import main as check

    assert check([str(bert_st_entry[0])]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert "texts against sentence-transformers" in lines[0]
    assert [line.split()[0] for line in lines[1:]] == ["fp32", "fp16", "int8"]  # fp16's graph, on the CPU
    assert lines[1].endswith(f"within the bound {FP32_BOUND:g}") and lines[2].endswith(
        f"within the bound {FP16_BOUND:g}"
    )


MINILM = SHARED / "models" / "minilm-embed"
SQUAD = SHARED / "data" / "squad" / "dev-v1.1-eval-half.json"


@pytest.mark.shared
@pytest.mark.skipif(
    not (MINILM / "modules.json").is_file() or not SQUAD.is_file(),
    reason="../shared/models/minilm-embed or ../shared/data/squad (the real checkpoint and data) is absent",
)
def test_real_minilm_embed(tmp_path: Path) -> None:
    """The real all-MiniLM-L6-v2 (sentence-transformers: BertModel + mean pooling + Normalize), exported as is:
    sentence-transformers' vectors to 0.99999 in fp32; retrieval on the first two SQuAD articles of the held-out
    half (100 questions against their 103 paragraphs)."""
    from export.retrieval_data import main as make_retrieval

    assert make_retrieval([str(SQUAD), str(tmp_path / "retrieval.json"), "--articles", "2"]) == 0
    config = export_entry(
        MINILM,
        tmp_path / "repository",
        "--variants",
        "fp32,int8",
        "--eval",
        str(tmp_path / "retrieval.json"),
        "--eval-limit",
        "100",
    )
    assert config["task"] == "embedding" and config["architecture"] == "BertModel"
    assert config["embedding"] | {"prompts": {}} == {
        "pooling": "mean",
        "normalize": True,
        "dimension": 384,
        "dense_layers": 0,
        "similarity": "cosine",
        "prompts": {},
        "default_prompt_name": None,
        "source": "sentence-transformers",
    }
    assert config["max_length"] == 256  # sentence_bert_config.json's max_seq_length
    assert config["attention_fusion"] == {"fused_layers": 6, "layers": 6, "reason": None}
    fp32, int8 = (config["variants"][v] for v in ("fp32", "int8"))
    assert fp32["validation"]["embedding_reference"]["min_cosine"] >= FP32_BOUND
    assert fp32["validation"]["embedding_reference"]["reference"].startswith("sentence-transformers")
    assert fp32["validation"]["batch_invariance_max_abs_diff"] == 0.0  # was 8.9e-8 (the pooling's ReduceSum)
    assert int8["validation"]["embedding_reference"]["min_cosine"] >= 0.98
    assert fp32["accuracy"]["scores"]["recall@10"] >= 90.0
    assert int8["accuracy"]["scores"]["recall@10"] >= fp32["accuracy"]["scores"]["recall@10"] - 3.0


@pytest.mark.parametrize("mode", ["mean", "cls", "max", "mean_sqrt_len_tokens"])
def test_pooling_is_sentence_transformers_pooling(mode: str) -> None:
    """export.embedding.pool against sentence-transformers' Pooling on random states, right and left padding."""
    import torch
    from sentence_transformers.sentence_transformer.modules import Pooling

    from export.embedding import pool

    torch.manual_seed(0)
    states = torch.randn(3, 7, 8)
    right = torch.tensor([[1] * 7, [1] * 4 + [0] * 3, [1] * 2 + [0] * 5])
    for mask in (right, right.flip(1)):
        expected = Pooling(8, mode)({"token_embeddings": states, "attention_mask": mask})["sentence_embedding"]
        assert torch.allclose(pool(states, mask, mode), expected, atol=1e-6)


def test_without_sentence_transformers_the_reference_is_the_pytorch_module(checkpoints, monkeypatch) -> None:
    import sys

    from export.checkpoint import load_checkpoint
    from export.embedding_check import embedding_reference

    checkpoint = load_checkpoint(str(checkpoints["bert-st"]))
    with_it = embedding_reference(checkpoint)
    monkeypatch.setitem(sys.modules, "sentence_transformers", None)  # import fails, as in the export image
    without = embedding_reference(checkpoint)
    assert without.source == "PyTorch (sentence-transformers is not installed)"
    assert with_it.source.startswith("sentence-transformers ") and without.texts == with_it.texts
    assert cosine_rows(without.vectors, with_it.vectors).min() >= FP32_BOUND


def broken_file(checkpoint: Path, tmp_path: Path, kind: str) -> Path:
    """A copy of a sentence-transformers directory with one file its export cannot take."""
    import shutil

    from safetensors.torch import load_file, save_file

    copy = shutil.copytree(checkpoint, tmp_path / f"{kind}-st")
    settings = copy / "sentence_bert_config.json"
    if kind == "pooling-list":
        pooling = copy / "1_Pooling" / "config.json"
        pooling.write_text(json.dumps([json.loads(pooling.read_text())]))
    elif kind in ("length-word", "length-zero"):
        value = "long" if kind == "length-word" else 0
        settings.write_text(json.dumps({**json.loads(settings.read_text()), "max_seq_length": value}))
    elif kind == "dense-in":  # a Dense of 64 inputs after a 32-wide encoder
        dense = copy / "2_Dense"
        config = json.loads((dense / "config.json").read_text())
        (dense / "config.json").write_text(json.dumps({**config, "in_features": 64}))
        weights = load_file(str(dense / "model.safetensors"))
        weights["linear.weight"] = torch.randn(config["out_features"], 64)
        save_file(weights, str(dense / "model.safetensors"))
    return copy


@pytest.mark.parametrize(
    ("kind", "message"),
    [
        ("pooling-list", "1_Pooling/config.json is not a JSON object (it is a list)"),
        ("length-word", "sentence_bert_config.json: max_seq_length 'long' is not a positive whole number of tokens"),
        ("length-zero", "sentence_bert_config.json: max_seq_length 0 is not a positive whole number of tokens"),
        ("dense-in", "2_Dense/config.json: Dense in_features 64 does not match the model's hidden size (32)"),
    ],
)
def test_a_broken_sentence_transformers_file_is_named(
    checkpoints, tmp_path: Path, capsys, kind: str, message: str
) -> None:
    source = broken_file(checkpoints["bert-st"], tmp_path, kind)
    code = main([str(source), "--name", "x", "--repository", str(tmp_path / "repository"), "--quiet"])
    err = capsys.readouterr().err.strip()
    assert code == 1 and err.startswith("error: ") and "\n" not in err, err
    assert message in err, err
    assert not (tmp_path / "repository").exists()


def test_a_max_seq_length_under_eight_names_the_file(checkpoints, tmp_path: Path, capsys) -> None:
    """Not '--max-length 4 is out of range': the user gave no --max-length."""
    source = broken_file(checkpoints["bert-st"], tmp_path, "short")
    settings = source / "sentence_bert_config.json"
    settings.write_text(json.dumps({**json.loads(settings.read_text()), "max_seq_length": 4}))
    code = main([str(source), "--name", "x", "--repository", str(tmp_path / "repository"), "--quiet"])
    err = capsys.readouterr().err.strip()
    assert code == 1
    assert err.startswith(f"error: {settings.resolve()}: max_seq_length 4 is out of range: this model takes 8 to ")
