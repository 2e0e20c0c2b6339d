"""`--eval FILE`: every variant measured against fp32 on labelled data, recorded, and refused over the budget."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import onnxruntime as ort
import pytest
import torch
from transformers import AutoModelForSequenceClassification, AutoTokenizer

from export.checkpoint import load_checkpoint
from export.errors import ExportError
from export.evaluation import (
    _first_token_of_words,
    entity_spans,
    judge,
    load_eval_set,
    normalize_answer,
    predict,
    refusal_reason,
)
from export.pipeline import export_checkpoint
from export.report import summary
from export.validation import create_session
from tests.tiny_models import CORPUS

ROOT = Path(__file__).resolve().parents[2]
LABELS = ["negative", "neutral", "positive"]
NER_LABELS = ["O", "B-PER", "I-PER", "B-LOC", "I-LOC"]  # tests/tiny_models.py


def write_tsv(path: Path, rows: list[tuple[str, str]], header: bool = True) -> Path:
    path.write_text(("sentence\tlabel\n" if header else "") + "".join(f"{t}\t{label}\n" for t, label in rows))
    return path


def test_classification_eval_measures_every_variant_and_records_it(tiny_checkpoint, tmp_path: Path) -> None:
    checkpoint = tiny_checkpoint("bert", "classification")
    # Labels by name and by index; a header line.
    rows = [(text, LABELS[i % 3] if i % 2 else str(i % 3)) for i, text in enumerate(CORPUS)]
    data = write_tsv(tmp_path / "dev.tsv", rows)
    result = export_checkpoint(
        str(checkpoint), "m", tmp_path / "models", variants="fp32,fp16,int8", eval_path=data, max_accuracy_loss=100
    )
    config = result.config
    assert config["evaluation"]["examples"] == len(CORPUS) and config["evaluation"]["metric"] == "accuracy"
    assert config["evaluation"]["header"] == ["sentence", "label"]  # skipped, and said so
    assert "line 1 read as the file's header and skipped: sentence | label" in summary(result)

    tokenizer = AutoTokenizer.from_pretrained(str(checkpoint))
    model = AutoModelForSequenceClassification.from_pretrained(str(checkpoint), dtype=torch.float32).eval()
    with torch.no_grad():
        predicted = [int(model(**tokenizer(text, return_tensors="pt")).logits.argmax()) for text in CORPUS]
    expected = 100 * sum(p == i % 3 for i, p in enumerate(predicted)) / len(CORPUS)

    fp32 = config["variants"]["fp32"]["accuracy"]
    assert fp32["measured"] and fp32["scores"]["accuracy"] == pytest.approx(expected, abs=0.01)
    assert fp32["loss_points"] == 0 and fp32["agreement"] == 1.0 and fp32["within_budget"]
    int8 = config["variants"]["int8"]["accuracy"]
    assert int8["measured"] and int8["agreement_of"] == "labels" and int8["budget_points"] == 100
    assert int8["loss_points"] == pytest.approx(fp32["scores"]["accuracy"] - int8["scores"]["accuracy"], abs=0.01)
    assert config["default_variant"]["cpu"] == "int8"
    fp16 = config["variants"]["fp16"]["accuracy"]
    if "CUDAExecutionProvider" in ort.get_available_providers():
        assert fp16["measured"]
    else:
        assert not fp16["measured"] and "CUDAExecutionProvider is not available" in fp16["reason"]


def test_without_eval_nothing_is_measured_and_the_cpu_default_stays_fp32(tiny_checkpoint, tmp_path: Path) -> None:
    config = export_checkpoint(
        str(tiny_checkpoint("bert", "classification")), "m", tmp_path, variants="fp32,int8"
    ).config
    assert config["variants"]["int8"]["accuracy"] == {"measured": False, "reason": "no --eval data was given"}
    assert config["default_variant"]["cpu"] == "fp32" and config["refused_variants"] == {}


def conll_of(sentences: list[list[str]], tags: list[list[str]]) -> str:
    blocks = [
        "\n".join(f"{w} NNP B-NP {t}" for w, t in zip(ws, ts, strict=True))
        for ws, ts in zip(sentences, tags, strict=True)
    ]
    return "-DOCSTART- -X- -X- O\n\n" + "\n\n".join(blocks) + "\n"


def test_variant_over_the_budget_is_refused_with_a_one_line_reason(tiny_checkpoint, tmp_path: Path) -> None:
    """Gold tags = fp32's own answers (fp32 F1 100); int8 calibrated on a single word saturates and loses some: the
    tiny RoBERTa 6.9 F1 points with 7-bit int8 weights (the tiny BERT's int8 moved a few word tags, none of them
    an entity's: F1 100)."""
    source = str(tiny_checkpoint("roberta", "ner"))
    sentences = [text.split() for text in CORPUS]
    data = tmp_path / "test.conll"
    data.write_text(conll_of(sentences, [["O"] * len(words) for words in sentences]))
    checkpoint = load_checkpoint(source)
    fp32 = export_checkpoint(source, "fp32-only", tmp_path / "scratch", variants="fp32").entry / "model.fp32.onnx"
    answers = predict(create_session(str(fp32), "CPUExecutionProvider"), load_eval_set(data, checkpoint), NER_LABELS)
    data.write_text(conll_of(sentences, answers))
    narrow = tmp_path / "narrow.txt"
    narrow.write_text("a\n")
    result = export_checkpoint(
        source, "m", tmp_path / "models", variants="fp32,int8", eval_path=data, max_accuracy_loss=0, calibration=narrow
    )
    config = result.config
    assert config["variants"]["fp32"]["accuracy"]["scores"]["f1"] == 100.0
    assert list(config["variants"]) == ["fp32"] and not (result.entry / "model.int8.onnx").exists()
    refused = config["refused_variants"]["int8"]
    assert refused["accuracy"]["loss_points"] > 0 and not refused["accuracy"]["within_budget"]
    assert refused["reason"].startswith("int8 refused: f1 ") and "\n" not in refused["reason"]
    assert "over the budget of 0" in refused["reason"]
    assert config["default_variant"]["cpu"] == "fp32"


def test_qa_eval_reads_squad_json(tiny_checkpoint, tmp_path: Path) -> None:
    context = " ".join(CORPUS[:4])
    squad = {
        "data": [
            {
                "title": "t",
                "paragraphs": [
                    {
                        "context": context,
                        "qas": [
                            {"id": "1", "question": "Who met in Brussels?", "answers": [{"text": "Peter Blackburn"}]},
                            {
                                "id": "2",
                                "question": "Where?",
                                "answers": [{"text": "Brussels"}, {"text": "in Brussels"}],
                            },
                            {"id": "3", "question": "Unanswerable?", "answers": []},
                        ],
                    }
                ],
            }
        ]
    }
    data = tmp_path / "dev.json"
    data.write_text(json.dumps(squad))
    config = export_checkpoint(
        str(tiny_checkpoint("roberta", "qa")),
        "m",
        tmp_path / "models",
        variants="fp32,int8",
        eval_path=data,
        max_accuracy_loss=100,
    ).config
    assert config["evaluation"]["examples"] == 2 and config["evaluation"]["format"] == "SQuAD JSON"
    record = config["variants"]["int8"]["accuracy"]
    assert set(record["scores"]) == {"exact_match", "f1"} and record["agreement_of"] == "answer spans"
    assert 0 <= record["scores"]["f1"] <= 100


@pytest.mark.parametrize(
    ("task", "content", "message"),
    [
        ("classification", "sentence\tlabel\nfine\tpositive\ngood\tterrific\n", "line 3: label 'terrific'"),
        ("classification", "just text, no label\n", "line 1: expected text<TAB>label"),
        ("ner", "Peter B-PER\nBerlin\n", "line 2: expected `word TAG`"),
        ("qa", '{"version": "1.1"}', "not SQuAD JSON"),
        ("qa", "{not json", "cannot read it as SQuAD JSON"),
        ("qa", '{"data": 5}', "data is int, not list: not SQuAD JSON"),
        (
            "qa",
            '{"data": [{"paragraphs": [{"context": "c", "qas": [{"question": "q?", "answers": [{"start": 0}]}]}]}]}',
            "data[0].paragraphs[0].qas[0].answers[0] has no 'text': not SQuAD JSON",
        ),
        ("qa", '{"data": [{"paragraphs": [{"qas": []}]}]}', "data[0].paragraphs[0] has no 'context'"),
        ("ner", "-DOCSTART- O\n\n", "has no examples"),
        (
            "ner",
            "John NNP B-PERSON\nlives VBZ O\nin IN O\nParis NNP B-CITY\n\n",
            "2 tag(s) the model does not have (B-PERSON, B-CITY; first on line 1); its tags: O, B-PER, I-PER, B-LOC",
        ),
        ("classification", "sentence\tlabel\ngreat\t\u00b2\n", "line 2: label '\u00b2' is not one of"),  # isdigit()
        ("classification", "a fine film\t7\nok\t1\n", "line 1: label '7' is not one of"),  # a number: no header
        (  # a first example with a label the model lacks reads as a header: the message says so
            "classification",
            "a so-so film\tNEUTRAL\n",
            "has no examples (text/label TSV expected) (line 1 was read as its header: 'a so-so film', 'NEUTRAL')",
        ),
        (  # pandas' to_csv(sep="\t") with its index: the row numbers were read as the texts, the texts as pairs
            "classification",
            "\tsentence\tlabel\n0\tgreat\t1\n",
            "line 1: the header's first column has no name, as pandas writes its index",
        ),
        (
            "classification",
            "word " * 30_000 + "\tpositive\nok\tnegative\n",
            "line 1: not a text<TAB>label line: field larger than field limit",
        ),
        (  # a SQuAD file: it said "field larger than field limit (131072)"
            "classification",
            '{"data": [{"title": "t", "paragraphs": []}], "version": "1.1"}',
            "is JSON, and a classification model's --eval is text/label TSV (SQuAD JSON is a QA model's",
        ),
        ("ner", '[{"tokens": ["Paris"], "tags": ["B-LOC"]}]', "is JSON, and a ner model's --eval is CoNLL"),
    ],
)
def test_bad_eval_data_is_a_clear_error(tiny_checkpoint, tmp_path: Path, task: str, content: str, message: str):
    data = tmp_path / "data"
    data.write_text(content)
    checkpoint = load_checkpoint(str(tiny_checkpoint("bert", task)))
    with pytest.raises(ExportError, match=re.escape(message)):
        load_eval_set(data, checkpoint)


def test_labels_that_are_numbers_are_read_as_names_only(tiny_checkpoint, tmp_path: Path) -> None:
    """Star ratings "1".."5": "0" was read as index 0 and "1".."4" as names, four of five examples shifted."""
    checkpoint = load_checkpoint(str(tiny_checkpoint("bert", "classification", labels=["1", "2", "3", "4", "5"])))
    data = tmp_path / "stars.tsv"
    data.write_text("awful\t1\nfine\t3\nsuperb\t5\n")
    assert load_eval_set(data, checkpoint).golds == [0, 2, 4]
    data.write_text("awful\t1\nfine\t0\n")  # 0 is no star rating: an index, which this file cannot hold
    with pytest.raises(ExportError, match=re.escape("line 2: label '0' is not one of ['1', '2', '3', '4', '5'] (the")):
        load_eval_set(data, checkpoint)
    # labels that are their own indices are read either way, as before
    indices = load_checkpoint(str(tiny_checkpoint("bert", "classification", labels=["0", "1", "2"])))
    data.write_text("awful\t0\nsuperb\t2\n")
    assert load_eval_set(data, indices).golds == [0, 2]


def test_command_line_prints_figures_and_refuses_negative_budgets(tiny_checkpoint, tmp_path: Path) -> None:
    data = write_tsv(tmp_path / "dev.tsv", [(text, LABELS[i % 3]) for i, text in enumerate(CORPUS)], header=False)
    base = [sys.executable, "-m", "export", str(tiny_checkpoint("distilbert", "classification")), "--name", "m"]
    base += ["--repository", str(tmp_path / "models"), "--variants", "fp32,int8", "--eval", str(data)]
    env = {"HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin"}
    done = subprocess.run(base, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "on eval data: accuracy" in done.stdout and f"({len(CORPUS)} examples, text/label TSV)" in done.stdout
    assert "cpu default" in done.stdout
    done = subprocess.run([*base, "--max-accuracy-loss", "-1"], cwd=ROOT, env=env, capture_output=True, text=True)
    assert done.returncode == 1 and done.stderr.strip().splitlines()[-1].startswith("error: --max-accuracy-loss -1")


def test_judge_and_reason() -> None:
    record = judge("qa", {"exact_match": 40.0, "f1": 50.0}, {"exact_match": 41.0, "f1": 50.7}, 0.9, 0.5)
    assert record["metric"] == "f1" and record["loss_points"] == 0.7 and not record["within_budget"]
    assert judge("ner", {"f1": 80.0}, {"f1": 80.5}, 0.99, 0.5)["within_budget"]  # exactly at the budget


def test_refusal_reason_names_the_scores(tmp_path: Path) -> None:
    class Data:
        path = tmp_path / "dev.tsv"

        def __len__(self) -> int:
            return 872

    record = judge("classification", {"accuracy": 84.0}, {"accuracy": 85.3}, 0.97, 0.5)
    assert refusal_reason("int8", record, Data()) == (  # type: ignore[arg-type]
        "int8 refused: accuracy 84.00 against fp32's 85.30 on dev.tsv (872 examples) loses 1.30 points, "
        "over the budget of 0.5"
    )


def test_entity_spans_follow_conlleval() -> None:
    assert entity_spans(["B-PER", "I-PER", "O", "I-LOC", "B-LOC", "I-ORG"]) == {
        (0, 1, "PER"),
        (3, 3, "LOC"),
        (4, 4, "LOC"),
        (5, 5, "ORG"),
    }


def test_tags_without_a_b_or_i_prefix_are_entities_as_the_pipeline_groups_them() -> None:
    """IO tags (PER, LOC) made no span at all: F1 0 for every variant, and int8 'within budget' of it."""
    assert entity_spans(["PER", "PER", "O", "LOC", "O", "MISC"]) == {(0, 1, "PER"), (3, 3, "LOC"), (5, 5, "MISC")}
    # another scheme's tags are entities of the whole tag, as the pipeline's entity_group says them
    assert entity_spans(["S-PER", "O", "B-LOC", "E-LOC"]) == {(0, 0, "S-PER"), (2, 2, "LOC"), (3, 3, "E-LOC")}


def test_words_map_to_their_first_token() -> None:
    # "Peter Blackburn went": [CLS], Pe, ##ter, Black, ##burn, went, [SEP]
    offsets = [(0, 0), (0, 2), (2, 5), (6, 11), (11, 15), (16, 20), (0, 0)]
    assert _first_token_of_words([(0, 5), (6, 15), (16, 20), (21, 25)], offsets) == [1, 3, 5, None]


def test_squad_normalisation() -> None:
    assert normalize_answer("The  Eiffel Tower!") == "eiffel tower"


def test_a_question_the_server_cannot_take_is_named(tiny_checkpoint, tmp_path: Path) -> None:
    """A question that leaves its context no room in a window (the server answers 422) stops the export, saying
    which one, rather than a traceback."""
    paragraph = {"context": "Peter met Maria in Brussels.", "qas": [{"id": "1", "question": "Who?", "answers": []}]}
    paragraph["qas"] += [{"id": "2", "question": " ".join(["why"] * 80), "answers": [{"text": "Peter"}]}]
    paragraph["qas"] += [{"id": "3", "question": "Who met?", "answers": [{"text": "Peter"}]}]
    data = tmp_path / "dev.json"
    data.write_text(json.dumps({"data": [{"title": "t", "paragraphs": [paragraph]}]}))
    checkpoint = load_checkpoint(str(tiny_checkpoint("bert", "qa")))
    with pytest.raises(ExportError, match=r"dev.json: the question 'why why .*\.\.\.' cannot be asked: .*question"):
        load_eval_set(data, checkpoint)


@pytest.mark.parametrize(("arch", "variant"), [("bert", "fp32"), ("bert", "int8"), ("xlnet", "fp32")])
def test_the_qa_gate_scores_the_answers_the_server_gives(
    tiny_checkpoint, tmp_path: Path, arch: str, variant: str
) -> None:
    """The export judges a QA variant on the answers the server would give: the server's windows (contexts of
    several windows here) and decoding at its defaults, so that what passes the budget is what is served.
    XLNet: windows context first, rows padded on the left."""
    from tests.harness.serving import start_service

    contexts = [" ".join(CORPUS[i : i + 6]) for i in range(0, 12, 3)]
    questions = ["Who met in Brussels?", "Where will the committee meet?", "What did the scientists report?"]
    qas = [
        {"id": f"{c}-{q}", "question": question, "answers": [{"text": "Geneva"}]}
        for q, question in enumerate(questions)
        for c in range(len(contexts))
    ]
    squad = {"data": [{"title": "t", "paragraphs": [{"context": context, "qas": qas} for context in contexts]}]}
    data = tmp_path / "dev.json"
    data.write_text(json.dumps(squad))
    source = str(tiny_checkpoint(arch, "qa"))
    entry = export_checkpoint(
        source, "m", tmp_path / "models", variants="fp32,int8", eval_path=data, max_accuracy_loss=100
    ).entry
    checkpoint = load_checkpoint(source)
    eval_set = load_eval_set(data, checkpoint)
    assert sum(len(example.features.rows) for example in eval_set.extras) > len(eval_set), "no context had windows"
    spans = predict(create_session(str(entry / f"model.{variant}.onnx"), "CPUExecutionProvider"), eval_set, None)

    server = start_service(tmp_path / "models", "--cpu-variant", variant, "--device", "cpu")
    try:
        with server.client() as client:
            served = []
            for paragraph in squad["data"][0]["paragraphs"]:
                for qa in paragraph["qas"]:
                    body = {"inputs": {"question": qa["question"], "context": paragraph["context"]}}
                    response = client.post("/v1/models/m/qa", json=body)
                    assert response.status_code == 200, response.text
                    answer = response.json()["results"][0][0]
                    served.append((answer["start"], answer["end"]))
            assert client.get("/v1/models/m").json()["variant"] == variant
    finally:
        server.stop()
    assert spans == served
    first_window_reach = [
        max(
            end
            for (_, end), part in zip(first.offsets, first.sequence_ids, strict=True)
            if part == example.features.context_sequence
        )
        for example in eval_set.extras
        for first in example.features.encodings[:1]
    ]
    assert any(start >= reach for (start, _), reach in zip(served, first_window_reach, strict=True)), (
        "every answer lay in its first window: a gate that cut contexts to one window would pass this test too"
    )


def test_a_byte_order_mark_is_not_read_as_data(tiny_checkpoint, tmp_path: Path) -> None:
    """Editors on Windows write one: CoNLL's `-DOCSTART-` behind it became a scored one-word sentence, and SQuAD's
    JSON was refused with the decoder's own words."""
    ner = load_checkpoint(str(tiny_checkpoint("bert", "ner")))
    conll = tmp_path / "dev.conll"
    conll.write_text("\ufeff-DOCSTART- -X- O O\n\nJohn NNP B-PER\nlives VBZ O\n\n", encoding="utf-8")
    assert load_eval_set(conll, ner).golds == [["B-PER", "O"]]
    qa = load_checkpoint(str(tiny_checkpoint("bert", "qa")))
    squad = tmp_path / "dev.json"
    question = {"question": "Who lives?", "answers": [{"text": "John", "answer_start": 0}]}
    body = {"data": [{"paragraphs": [{"context": "John lives here.", "qas": [question]}]}]}
    squad.write_text("\ufeff" + json.dumps(body), encoding="utf-8")
    assert len(load_eval_set(squad, qa).golds) == 1
