"""`python -m export CHECKPOINT --name NAME ...` and `python -m export demo`."""

from __future__ import annotations

import argparse
import math
import signal
import sys
import threading
from pathlib import Path

from bertcore.messages import one_line
from export.errors import ExportError
from export.quiet import quiet_libraries

DESCRIPTION = """Export a fine-tuned BERT-family checkpoint (BERT, RoBERTa, ALBERT, DistilBERT, XLM-RoBERTa, CamemBERT,
ELECTRA, ERNIE, MobileBERT, DeBERTa-v2/v3, ModernBERT or XLNet; sequence classification, token classification or
question answering; or sentence embeddings: a sentence-transformers directory, or a base model with --task embedding
--pooling) to a validated, optimized ONNX model-repository entry.
`python -m export demo` builds the demo repository instead, one model per task: small public fine-tuned
checkpoints from the Hugging Face hub where it is reachable, else small random-weight models (it says so)."""


def finite_points(text: str) -> float:
    """--max-accuracy-loss: a finite number (NaN would refuse every variant, and neither it nor infinity is JSON)."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of points") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"{text!r} is not a finite number of points")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m export", description=DESCRIPTION)
    parser.add_argument(
        "checkpoint",
        help="checkpoint directory or hub id; 'demo' builds the demo repository (write ./demo for a folder named demo)",
    )
    parser.add_argument("--name", help="name of the repository entry (required unless 'demo')")
    parser.add_argument(
        "--task",
        default="auto",
        choices=["auto", "classification", "ner", "qa", "embedding"],
        help="default: from the checkpoint's head (a sentence-transformers directory, with modules.json: embedding)",
    )
    parser.add_argument(
        "--pooling",
        choices=["mean", "cls", "max", "mean_sqrt_len_tokens"],
        default=None,
        help="--task embedding on a base (*Model) checkpoint: how token states become one vector",
    )
    parser.add_argument(
        "--normalize",
        action="store_true",
        help="--task embedding on a base checkpoint: L2-normalize each vector (inside the graph)",
    )
    parser.add_argument("--repository", type=Path, default=Path("models"), help="model repository (default: models)")
    parser.add_argument(
        "--variants",
        default="fp32,fp16,int8",
        help="comma-separated, of fp32,fp16,int8,int8-dynamic (fp32 is always made; int8 is static, batch-invariant)",
    )
    parser.add_argument(
        "--calibration",
        type=Path,
        default=None,
        help="text to calibrate static int8 on: one input a line (QA: question<TAB>context); default: built-in English",
    )
    parser.add_argument(
        "--eval",
        type=Path,
        default=None,
        help="labelled data to measure every variant on against fp32: text<TAB>label TSV (classification), "
        'CoNLL (ner), SQuAD JSON (qa), retrieval JSON (embedding: {"queries": [str], "passages": [str], '
        '"answers": [[passage index, ...] per query]}, recall@1 and recall@10; python -m export.retrieval_data '
        "makes one from SQuAD)",
    )
    parser.add_argument(
        "--eval-limit",
        type=int,
        default=None,
        help="use only the first N (1 or more) examples (embedding: queries) of --eval",
    )
    parser.add_argument(
        "--max-accuracy-loss",
        type=finite_points,
        default=0.5,
        help="points of accuracy (entity F1, SQuAD F1, embedding: recall@10) a variant may lose against fp32 on "
        "--eval data, or it is refused (default 0.5)",
    )
    parser.add_argument("--max-length", type=int, default=None, help="longest input in tokens (default: the model's)")
    parser.add_argument("--opset", type=int, default=None, help="ONNX opset (default 17)")
    parser.add_argument(
        "--source",
        choices=["auto", "hub", "random"],
        default=None,
        help="demo only: the hub's fine-tuned checkpoints, random weights, or auto (default): the hub unless "
        "HF_HUB_OFFLINE is set or it cannot be reached, then random",
    )
    parser.add_argument(
        "--checkpoints",
        default=None,
        metavar="NAME=OWNER/REPO[@REV],...",
        help="demo only: hub checkpoints to use for entries, over the defaults (export/demo_hub.py HUB_CHECKPOINTS)",
    )
    parser.add_argument("--quiet", action="store_true", help="print only the summary")
    return parser


class Terminated(BaseException):
    """SIGTERM (docker stop, a pod deleted): raised in the main thread, it unwinds the export as Ctrl-C does, so
    that the staging folder is removed and the repository is left as it was."""


def _terminate(signum: int, frame: object) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a second SIGTERM must not cut the clean-up short
    raise Terminated


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    quiet_libraries()
    in_main_thread = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, _terminate) if in_main_thread else None
    try:
        return _run(args)
    finally:
        if in_main_thread:
            signal.signal(signal.SIGTERM, previous if previous is not None else signal.SIG_DFL)


def _left_as(args: argparse.Namespace) -> str:
    """What a stop mid-way left: one export writes its entry at the end or not at all; the demo's three are built in
    turn, and those finished before the stop are kept (it said the repository was as it was)."""
    if args.checkpoint != "demo":
        return "the repository was left as it was"
    built = sorted(path.parent.name for path in Path(args.repository).glob("demo-*/model.json"))
    kept = f"the demo entries already in it are kept ({', '.join(built)})" if built else "it has no demo entry"
    return f"the entry being built was not written; {kept}"


def _check_flags_that_need_another(args: argparse.Namespace) -> None:
    """A flag that does nothing without another is refused, not passed over (an empty --calibration file was taken
    without a word where no int8 variant was asked, as --eval-limit without --eval)."""
    if args.eval_limit is not None and args.eval_limit >= 1 and args.eval is None:  # out of range: said later
        raise ExportError("--eval-limit limits the examples of --eval: give --eval too")
    if args.calibration is not None and "int8" not in [part.strip() for part in args.variants.split(",")]:
        raise ExportError(
            f"--calibration is the text static int8 is calibrated on, and --variants {args.variants} has no int8"
        )


def _run(args: argparse.Namespace) -> int:
    progress = (lambda _: None) if args.quiet else (lambda msg: print(f"... {msg}", file=sys.stderr, flush=True))
    notice = None
    try:
        if args.checkpoint == "demo":
            from export.demo import build_demo

            if args.quiet:
                from huggingface_hub.utils import disable_progress_bars

                disable_progress_bars()
            demo = build_demo(
                args.repository,
                source=args.source or "auto",
                checkpoints=args.checkpoints,
                variants=args.variants,
                progress=progress,
            )
            results, notice = demo.results, demo.notice
        else:
            if args.source is not None or args.checkpoints is not None:
                raise ExportError("--source and --checkpoints are for `python -m export demo`")
            if not args.name:
                raise ExportError("--name is required: the name the model is served under")
            _check_flags_that_need_another(args)
            from export.graph import DEFAULT_OPSET
            from export.pipeline import export_checkpoint

            results = [
                export_checkpoint(
                    args.checkpoint,
                    args.name,
                    args.repository,
                    task=args.task,
                    variants=args.variants,
                    max_length=args.max_length,
                    opset=DEFAULT_OPSET if args.opset is None else args.opset,
                    progress=progress,
                    eval_path=args.eval,
                    eval_limit=args.eval_limit,
                    max_accuracy_loss=args.max_accuracy_loss,
                    calibration=args.calibration,
                    pooling=args.pooling,
                    normalize=args.normalize,
                )
            ]
    except ExportError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"error: interrupted; {_left_as(args)}", file=sys.stderr)
        return 130
    except Terminated:
        print(f"error: terminated (SIGTERM); {_left_as(args)}", file=sys.stderr)
        return 128 + signal.SIGTERM
    except Exception as exc:  # a bug or an environment problem: still one line, and a non-zero exit
        print(f"error: unexpected failure: {one_line(exc)}", file=sys.stderr)
        return 2
    from export.report import summary

    for result in results:
        print(summary(result))
    if notice:  # last, so that it is the line a user sees before the server's
        print(f"note: {notice}", file=sys.stderr, flush=True)
    return 0
