"""Golden outputs of transformers 4.57's question-answering pipeline, for tests/bertcore/tasks/test_qa.py.

The pipeline is gone from transformers 5, so it runs here, once, in a separate virtualenv with 4.57.6; the
tests compare `bertcore/tasks/qa.py` with the JSON this writes to tests/fixtures/qa/. Run from the repository root:

    python3 -m venv .venv-qa-golden
    .venv-qa-golden/bin/pip install torch==2.13.0 transformers==4.57.6 numpy
    HF_HUB_OFFLINE=1 .venv-qa-golden/bin/python tools/qa_golden.py

Options: --main-python (the transformers 5 venv that builds the tiny checkpoints; default .venv/bin/python),
--shared (default ../shared; its real checkpoint and SQuAD data are skipped with a message when absent),
--out (default tests/fixtures/qa), --only tiny|real, --arch NAME (repeatable: only those tiny checkpoints).
It takes about two minutes on 2 CPU cores (four tiny checkpoints and the real one).

What it does:
- Tiny checkpoints (bert, roberta, albert, distilbert and issue 31's families, TINY_ARCHS; XLNet's tokenizer
  pads on the left, so there the pipeline puts the context first): built by the MAIN venv with
  tests/tiny_models.write_tiny_checkpoint(directory, arch, "qa") in a temporary directory, exactly as the tests
  build them (seeded weights, deterministic tokenizers). transformers 4.57 cannot load the tokenizer_config.json
  that transformers 5 writes (`"tokenizer_class": "TokenizersBackend"`, unknown to 4.57), so 4.57 loads a copy
  whose tokenizer_config.json says `PreTrainedTokenizerFast` (and drops the 5-only `backend` key); the script
  checks that 4.57's backend tokenizer is then identical to tokenizer.json. Weights and config load as written.
- Real checkpoint ../shared/models/minilm-bert-squad (stored fp16): loaded with torch_dtype=float32 and the
  model object handed to the pipeline. Questions come from ../shared/data/squad/dev-v1.1-eval-half.json (the
  first question of every 8th paragraph, 150 in all), plus long contexts made of 6 consecutive paragraphs of
  one article (several windows at the default max_seq_len 384), with default and other parameters, and a few
  questions no context answers (the empty answer, and spans of score 0 with top_k 10 on tiny contexts).
- Every model runs in fp32 with eager attention (the tests use eager attention too).
- Each fixture records the inputs (texts stored once, cases refer to them by index), the pipeline keyword
  arguments, what the pipeline fed the model (window lengths and a hash of each window's ids, taken from the
  pipeline's own preprocess), and the answers (always a list; the pipeline returns a bare dict for one answer),
  or the error the pipeline raised. `checkpoint.fingerprint` holds the sha256 of model.safetensors and
  tokenizer.json as transformers 5 wrote them, so the tests can tell when a rebuilt checkpoint changed.
- Beside each fixture, NAME.logits.npz holds the start and end logits the pipeline's model produced for each
  window: `windows` (the window hashes, sorted), `lengths` (tokens per window) and `logits` (float32, shape
  (2, total tokens): start and end logits of the windows one after the other, in that order). The tests
  post-process exactly these logits, so their answers do not depend on how a CPU computes the model; that our
  PyTorch model still gives these logits is a separate test with its own tolerance.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ["RUST_BACKTRACE"] = "0"  # the tokenizer panics on purpose below; a backtrace is slow and noisy

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from export.sample_text import CONTEXT, QUESTIONS, SENTENCES  # noqa: E402  (plain strings, no dependencies)

TINY_ARCHS = (
    "bert",
    "roberta",
    "albert",
    "distilbert",
    # issue 31's families (XLNet's tokenizer pads on the left: the pipeline puts its context first)
    "xlm-roberta",
    "camembert",
    "electra",
    "ernie",
    "mobilebert",
    "deberta-v2",
    "modernbert",
    "xlnet",
)
REAL_NAME = "minilm-bert-squad"
SQUAD_FILE = Path("data") / "squad" / "dev-v1.1-eval-half.json"
SQUAD_QUESTIONS = 150
SQUAD_PARAGRAPH_STEP = 8
FINGERPRINTED = ("model.safetensors", "tokenizer.json")

# Tiny checkpoints take 64 tokens: the small windows make several windows out of short texts.
TINY_CONTEXTS = (
    CONTEXT,
    SENTENCES[3],
    SENTENCES[4] + " " + SENTENCES[10],
    "  Multiple   spaces\tand\ttabs\nand new lines: Marie Curie won   two Nobel prizes in Paris.  ",
    # No word ending in "-ly" outside the vocabulary: the tiny WordPiece vocabulary lists "##ly" twice, and the
    # id it gets equals vocab_size (an IndexError in the tiny BERT and DistilBERT models).
    "Marie Curie won two Nobel prizes, quietly; the river Thames flows through London (São Paulo, Zürich, "
    "Kraków) - and an emoji 😀 and CJK 東京 text, 1,299 delegates.",
    "Tokyo.",
)
TINY_QUESTIONS = (
    *QUESTIONS,
    "Where will the committee meet again next week?",
    "who WON?",
)
TINY_PAIRS = (
    *((question, 0) for question in range(len(TINY_QUESTIONS))),
    (0, 1),
    (1, 2),
    (3, 3),
    (5, 3),
    (2, 4),
    (3, 4),
    (3, 5),
    (0, 5),
)
TINY_PARAMS: tuple[dict[str, Any], ...] = (
    {},
    {"top_k": 3},
    {"max_seq_len": 48, "doc_stride": 16},
    {"max_seq_len": 48, "doc_stride": 16, "top_k": 3},
    {"max_answer_len": 5},
    {"max_answer_len": 1, "top_k": 4},
    {"handle_impossible_answer": True},
    {"handle_impossible_answer": True, "top_k": 3, "max_seq_len": 32, "doc_stride": 8},
    {"max_question_len": 4},
    {"max_question_len": 4, "max_seq_len": 40, "doc_stride": 10},
    {"align_to_words": False},
    {"align_to_words": False, "top_k": 5, "max_seq_len": 40, "doc_stride": 12},
    {"max_seq_len": 28, "doc_stride": 4, "top_k": 12},
    {"max_seq_len": 40, "doc_stride": 0},
    {"top_k": 25, "max_seq_len": 48, "doc_stride": 16, "handle_impossible_answer": True},
)
# Parameters the pipeline refuses for a long context (the tests expect a ValueError from ours).
TINY_ERRORS: tuple[tuple[int, int, dict[str, Any]], ...] = (
    (0, 0, {"max_seq_len": 48, "doc_stride": 50}),  # doc_stride > max_seq_len
    (0, 0, {"max_seq_len": 48, "doc_stride": 40}),  # doc_stride >= the room left for the context
    (4, 0, {"max_seq_len": 20, "doc_stride": 2}),  # the question leaves no room for the context
    (0, 0, {"top_k": 0}),
    (0, 0, {"max_answer_len": 0}),
)
# The same over-long doc_stride with a context that fits one window: the pipeline answers (no stride needed).
TINY_FITS = ((0, 1, {"max_seq_len": 64, "doc_stride": 60}),)

REAL_PARAMS_EXTRA: tuple[dict[str, Any], ...] = (
    {"top_k": 3},
    {"handle_impossible_answer": True},
    {"top_k": 3, "handle_impossible_answer": True},
    {"align_to_words": False},
    {"max_seq_len": 128, "doc_stride": 32, "max_answer_len": 30},
)
REAL_EXTRA_EVERY = 15  # every 15th SQuAD question also runs with each of REAL_PARAMS_EXTRA
# Questions the context cannot answer, on a SQuAD paragraph and on tiny contexts: the empty answer wins, and
# with top_k 10 a window has fewer positive spans than the pipeline selects (spans of score 0 come back).
UNANSWERABLE = ("How many moons does Jupiter have?", "What is the capital of Mongolia?", "Why?")
TINY_REAL_CONTEXTS = ("Hello.", "It rained.")
UNANSWERABLE_PARAMS: tuple[dict[str, Any], ...] = (
    {"handle_impossible_answer": True},
    {"top_k": 3, "handle_impossible_answer": True},
    {"top_k": 10},
    {"top_k": 10, "handle_impossible_answer": True, "align_to_words": False},
)
LONG_ARTICLES = (0, 7, 15)
LONG_PARAGRAPHS = 6
LONG_PARAMS: tuple[dict[str, Any], ...] = (
    {},
    {"top_k": 3, "handle_impossible_answer": True},
    {"doc_stride": 64, "max_answer_len": 20},
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--main-python", type=Path, default=ROOT / ".venv" / "bin" / "python")
    parser.add_argument("--shared", type=Path, default=ROOT.parent / "shared")
    parser.add_argument("--out", type=Path, default=ROOT / "tests" / "fixtures" / "qa")
    parser.add_argument("--only", choices=("tiny", "real"))
    parser.add_argument("--arch", action="append", choices=TINY_ARCHS, help="only these tiny checkpoints (repeat)")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    import torch

    torch.set_num_threads(1)  # tiny matrices: more threads only spin, and the machine is shared
    if args.only != "real":
        with tempfile.TemporaryDirectory(prefix="qa-golden-") as workdir:
            for arch in args.arch or TINY_ARCHS:
                write_fixture(args.out / f"tiny-{arch}.json", *tiny_fixture(Path(workdir), arch, args.main_python))
    if args.only != "tiny":
        checkpoint = args.shared / "models" / REAL_NAME
        squad = args.shared / SQUAD_FILE
        if (checkpoint / "config.json").is_file() and squad.is_file():
            write_fixture(args.out / f"{REAL_NAME}.json", *real_fixture(checkpoint, squad))
        else:
            print(f"skipped the real checkpoint: {checkpoint} or {squad} is absent", file=sys.stderr)


def write_fixture(path: Path, fixture: dict[str, Any], logits: dict[str, Any]) -> None:
    """JSON with one case per line (small, and readable in a diff), and the windows' logits beside it (npz)."""
    import numpy as np

    windows = {window[1] for case in fixture["cases"] for window in case.get("windows", [])}
    if windows != set(logits):
        raise SystemExit(f"{path}: logits recorded for {len(logits)} windows, the cases have {len(windows)}")
    keys = sorted(logits)
    np.savez_compressed(
        path.with_suffix(".logits.npz"),
        windows=np.array(keys),
        lengths=np.array([logits[key].shape[1] for key in keys], dtype=np.int64),
        logits=np.concatenate([logits[key] for key in keys], axis=1),
    )
    header = [f" {json.dumps(key)}: {json.dumps(value, ensure_ascii=False)}," for key, value in fixture.items()]
    header = [line for line, key in zip(header, fixture, strict=True) if key != "cases"]
    cases = ",\n".join("  " + json.dumps(case, ensure_ascii=False) for case in fixture["cases"])
    path.write_text("{\n" + "\n".join(header) + '\n "cases": [\n' + cases + "\n ]\n}\n", encoding="utf-8")
    cases = fixture["cases"]
    errors = sum("error" in case for case in cases)
    print(f"{path}: {len(cases)} cases ({errors} errors), {path.stat().st_size / 1024:.0f} KiB", file=sys.stderr)


# --- checkpoints -------------------------------------------------------------------------------------------------


def fingerprint(directory: Path) -> dict[str, str]:
    return {name: hashlib.sha256((directory / name).read_bytes()).hexdigest() for name in FINGERPRINTED}


def build_tiny(workdir: Path, arch: str, main_python: Path) -> Path:
    """The checkpoint as the tests build it: transformers 5 (main venv), tests/tiny_models.py."""
    directory = workdir / arch
    directory.mkdir()
    code = (
        "import sys; from pathlib import Path; from tests.tiny_models import write_tiny_checkpoint; "
        "write_tiny_checkpoint(Path(sys.argv[1]), sys.argv[2], 'qa')"
    )
    subprocess.run([str(main_python), "-c", code, str(directory), arch], cwd=ROOT, check=True, capture_output=True)
    return directory


def loadable_by_457(directory: Path) -> tuple[Path, list[str]]:
    """A copy 4.57 can load: transformers 5's tokenizer_config names a class 4.57 does not have."""
    copy = directory.with_name(directory.name + "-for-4.57")
    shutil.copytree(directory, copy)
    path = copy / "tokenizer_config.json"
    config = json.loads(path.read_text(encoding="utf-8"))
    notes = []
    if config.get("tokenizer_class") not in (None, "PreTrainedTokenizerFast"):
        notes.append(f"tokenizer_config.json: tokenizer_class {config['tokenizer_class']} -> PreTrainedTokenizerFast")
        config["tokenizer_class"] = "PreTrainedTokenizerFast"
    if "backend" in config:
        notes.append(f"tokenizer_config.json: dropped backend={config.pop('backend')!r}")
    path.write_text(json.dumps(config, indent=2), encoding="utf-8")
    return copy, notes


def check_tokenizer(tokenizer: Any, original: Path) -> None:
    """4.57 must tokenize with exactly the tokenizer.json the tests (and the server) use."""
    loaded = json.loads(tokenizer.backend_tokenizer.to_str())
    if loaded != json.loads((original / "tokenizer.json").read_text(encoding="utf-8")):
        raise SystemExit(f"transformers 4.57 changed the tokenizer of {original} while loading it")
    saved = json.loads((original / "tokenizer_config.json").read_text(encoding="utf-8")).get("padding_side", "right")
    if not tokenizer.is_fast or tokenizer.padding_side != saved:
        raise SystemExit(f"{original}: expected a fast tokenizer padding on the {saved} (as transformers 5 saved it)")


class LogitsRecorder:
    """The start and end logits of every window the pipeline's model sees, keyed by the window's hash."""

    def __init__(self, model: Any) -> None:
        self.logits: dict[str, Any] = {}
        model.register_forward_hook(self._record, with_kwargs=True)

    def _record(self, module: Any, args: Any, kwargs: dict[str, Any], output: Any) -> None:
        import numpy as np

        for ids, start, end in zip(kwargs["input_ids"], output.start_logits, output.end_logits, strict=True):
            logits = np.stack([start.detach().numpy(), end.detach().numpy()]).astype(np.float32)
            key = window_hash(ids.tolist())
            if key in self.logits and not np.array_equal(self.logits[key], logits):
                raise SystemExit(f"window {key}: the model gave different logits for the same window")
            self.logits[key] = logits


def make_pipeline(model_dir: Path, tokenizer_dir: Path) -> Any:
    import torch
    from transformers import AutoModelForQuestionAnswering, AutoTokenizer, pipeline

    model = AutoModelForQuestionAnswering.from_pretrained(
        str(model_dir), torch_dtype=torch.float32, attn_implementation="eager"
    ).eval()
    tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    qa = pipeline("question-answering", model=model, tokenizer=tokenizer, framework="pt", device="cpu")
    assert qa.model.dtype == torch.float32
    return qa


def checkpoint_info(name: str, kind: str, original: Path, qa: Any, notes: list[str]) -> dict[str, Any]:
    return {
        "name": name,
        "kind": kind,
        "fingerprint": fingerprint(original),
        "model_max_length": int(qa.tokenizer.model_max_length),
        "model_input_names": list(qa.tokenizer.model_input_names),
        "padding_side": qa.tokenizer.padding_side,  # left (XLNet): the pipeline puts the context first
        "loaded_for_4.57_with": notes,
    }


def generator_info() -> dict[str, Any]:
    import numpy
    import tokenizers
    import torch
    import transformers

    return {
        "script": "tools/qa_golden.py",
        "transformers": transformers.__version__,
        "tokenizers": tokenizers.__version__,
        "torch": torch.__version__,
        "numpy": numpy.__version__,
        # Where the answers were made (for a reader: the tests no longer depend on it).
        "torch_cpu_capability": torch.backends.cpu.get_cpu_capability(),
        "pipeline": "question-answering, PyTorch, fp32, eager attention, batch size 1",
    }


# --- cases -------------------------------------------------------------------------------------------------------


class Texts:
    """Questions and contexts stored once; cases refer to them by index."""

    def __init__(self) -> None:
        self.questions: list[str] = []
        self.contexts: list[str] = []

    @staticmethod
    def _index(values: list[str], text: str) -> int:
        if text not in values:
            values.append(text)
        return values.index(text)

    def refs(self, question: str, context: str) -> dict[str, int]:
        return {"question": self._index(self.questions, question), "context": self._index(self.contexts, context)}


def window_hash(ids: list[int]) -> str:
    return hashlib.sha256(",".join(map(str, ids)).encode()).hexdigest()[:16]


def run_case(qa: Any, question: str, context: str, params: dict[str, Any]) -> dict[str, Any]:
    """The pipeline's windows and answers for one question, or the error it raised."""
    try:
        preprocess_params, _, _ = qa._sanitize_parameters(**params)
        windows = [
            item["input_ids"][0].tolist()
            for item in qa.preprocess({"question": question, "context": context}, **preprocess_params)
        ]
        output = qa(question=question, context=context, **params)
    except (KeyboardInterrupt, SystemExit):
        raise
    except BaseException as exc:  # the tokenizer panics (pyo3 PanicException) for some window settings
        return {"error": f"{type(exc).__name__}: {str(exc).splitlines()[0]}"}
    answers = [output] if isinstance(output, dict) else list(output)
    return {
        "windows": [[len(ids), window_hash(ids)] for ids in windows],
        "answers": [
            {"score": float(a["score"]), "start": int(a["start"]), "end": int(a["end"]), "answer": a["answer"]}
            for a in answers
        ],
    }


def collect(qa: Any, texts: Texts, cases: list[tuple[str, str, dict[str, Any]]]) -> list[dict[str, Any]]:
    return [
        {**texts.refs(question, context), "params": params, **run_case(qa, question, context, params)}
        for question, context, params in cases
    ]


def tiny_fixture(workdir: Path, arch: str, main_python: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    original = build_tiny(workdir, arch, main_python)
    copy, notes = loadable_by_457(original)
    qa = make_pipeline(copy, copy)
    recorder = LogitsRecorder(qa.model)
    check_tokenizer(qa.tokenizer, original)
    cases = [(TINY_QUESTIONS[q], TINY_CONTEXTS[c], params) for q, c in TINY_PAIRS for params in TINY_PARAMS]
    checked = [(*case, True) for case in TINY_ERRORS] + [(*case, False) for case in TINY_FITS]
    cases += [(TINY_QUESTIONS[q], TINY_CONTEXTS[c], params) for q, c, params, _ in checked]
    texts = Texts()
    results = collect(qa, texts, cases)
    for (_, _, params, expect_error), result in zip(checked, results[-len(checked) :], strict=True):
        if ("error" in result) != expect_error:
            raise SystemExit(f"tiny-{arch} {params}: expected {'an error' if expect_error else 'answers'}: {result}")
    fixture = {
        "generator": generator_info(),
        "checkpoint": {**checkpoint_info(f"tiny-{arch}", "tiny", original, qa, notes), "arch": arch},
        "questions": texts.questions,
        "contexts": texts.contexts,
        "cases": results,
    }
    return fixture, recorder.logits


def squad_cases(squad: Path) -> list[tuple[str, str, dict[str, Any]]]:
    articles = json.loads(squad.read_text(encoding="utf-8"))["data"]
    picked = [
        (paragraph["qas"][0]["question"], paragraph["context"])
        for article in articles
        for number, paragraph in enumerate(article["paragraphs"])
        if number % SQUAD_PARAGRAPH_STEP == 0 and paragraph["qas"]
    ][:SQUAD_QUESTIONS]
    cases = [(question, context, {}) for question, context in picked]
    for number, (question, context) in enumerate(picked):
        if number % REAL_EXTRA_EVERY == 0:
            cases += [(question, context, params) for params in REAL_PARAMS_EXTRA]
    for index in LONG_ARTICLES:
        paragraphs = articles[index]["paragraphs"][:LONG_PARAGRAPHS]
        context = "\n\n".join(paragraph["context"] for paragraph in paragraphs)
        for number in (0, 2, 5):
            question = paragraphs[number]["qas"][-1]["question"]
            cases += [(question, context, params) for params in LONG_PARAMS]
    for question in UNANSWERABLE:
        for context in (picked[0][1], *TINY_REAL_CONTEXTS):
            cases += [(question, context, params) for params in UNANSWERABLE_PARAMS]
    return cases


def real_fixture(checkpoint: Path, squad: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    qa = make_pipeline(checkpoint, checkpoint)
    recorder = LogitsRecorder(qa.model)
    check_tokenizer(qa.tokenizer, checkpoint)
    notes = ["model loaded with torch_dtype=torch.float32 (stored fp16) and passed to the pipeline as an object"]
    texts = Texts()
    results = collect(qa, texts, squad_cases(squad))
    long_windows = [len(case["windows"]) for case in results if case["params"] == {} and len(case["windows"]) > 1]
    if len(long_windows) < len(LONG_ARTICLES) * 3:
        raise SystemExit(f"the long contexts should need several windows at the defaults: {long_windows}")
    fixture = {
        "generator": generator_info(),
        "checkpoint": checkpoint_info(REAL_NAME, "shared", checkpoint, qa, notes),
        "data": {"file": str(SQUAD_FILE), "selection": f"first question of every {SQUAD_PARAGRAPH_STEP}th paragraph"},
        "questions": texts.questions,
        "contexts": texts.contexts,
        "cases": results,
    }
    return fixture, recorder.logits


if __name__ == "__main__":
    main()
