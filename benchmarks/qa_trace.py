"""One real trace of a QA request in process mode (issue 39), as a collector receives it: the real MiniLM SQuAD
model (../shared, exported fp32 unless --repository holds it), `python -m service --engine-mode process
--frontends 1 --otlp-endpoint ...` sending to an OTLP/HTTP receiver in this process (tests.harness.otlp_receiver,
the opentelemetry-proto messages), a few SQuAD questions to warm it up, then one traced question (a client's
`traceparent`). Prints the request's tree (each span's process, start offset from the request's, duration and
chosen attributes) and the batch its rows ran in (a span of its own trace, linked to the request).

    python -m benchmarks.qa_trace [--repository DIR] [--question-index 7] [--workdir /tmp/bertserve-qa-trace]
"""

from __future__ import annotations

import argparse
import secrets
import sys
from pathlib import Path

import httpx

from benchmarks.realdata import SHARED, shared_available, squad
from export.pipeline import export_checkpoint
from export.quiet import quiet_libraries
from tests.harness.otlp_receiver import OtlpReceiver, ReceivedSpan
from tests.harness.serving import start_service

MODEL = "minilm-bert-squad"
SHOWN = (
    "http.route",
    "http.response.status_code",
    "bertserve.model",
    "bertserve.rows",
    "bertserve.tokens",
    "bertserve.batch.rows",
    "bertserve.batch.tokens",
    "bertserve.batch.width",
    "bertserve.batch.padded_tokens",
    "bertserve.provider",
    "bertserve.variant",
    "error.type",
)


def render(spans: list[ReceivedSpan], root: ReceivedSpan) -> list[str]:
    lines: list[str] = []

    def draw(span: ReceivedSpan, depth: int) -> None:
        shown = " ".join(f"{key}={span.attributes[key]}" for key in SHOWN if key in span.attributes)
        offset = (span.start_ns - root.start_ns) / 1e6
        process = span.resource.get("bertserve.process", "?")
        lines.append(
            f"{'  ' * depth}{span.name:<{34 - 2 * depth}} {process:<8} +{offset:7.2f} ms {span.duration_ms:7.2f} ms  "
            f"{shown}".rstrip()
        )
        for child in sorted(
            (s for s in spans if s.trace_id == span.trace_id and s.parent_span_id == span.span_id),
            key=lambda s: s.start_ns,
        ):
            draw(child, depth + 1)

    draw(root, 0)
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.qa_trace", description=__doc__)
    parser.add_argument("--repository", type=Path, help=f"a repository holding {MODEL} (default: exported here)")
    parser.add_argument("--question-index", type=int, default=7, help="which SQuAD question is traced")
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/bertserve-qa-trace"))
    args = parser.parse_args(argv)
    if not shared_available():
        print(f"needs ../shared (not found at {SHARED})", file=sys.stderr)
        return 2
    quiet_libraries()
    repository = args.repository
    if repository is None:
        repository = args.workdir / "models"
        if not (repository / MODEL / "model.json").exists():
            export_checkpoint(str(SHARED / "models" / MODEL), MODEL, repository, variants="fp32")
    questions = squad(args.question_index + 1)
    with OtlpReceiver("http") as receiver:
        args.workdir.mkdir(parents=True, exist_ok=True)
        extra = [
            "--engine-mode",
            "process",
            "--frontends",
            "1",
            "--models",
            MODEL,
            "--otlp-endpoint",
            receiver.endpoint,
        ]
        server = start_service(repository, *extra, log_path=args.workdir / "server.log")
        try:
            with httpx.Client(base_url=server.url, timeout=60) as client:
                for question, context, _ in questions[:5]:  # warm: a process's first requests pay for its caches
                    body = {"inputs": [{"question": question, "context": context}]}
                    client.post(f"/v1/models/{MODEL}/qa", json=body).raise_for_status()
                question, context, _ = questions[args.question_index]
                trace_id, parent_id = secrets.token_hex(16), secrets.token_hex(8)
                answer = client.post(
                    f"/v1/models/{MODEL}/qa",
                    json={"inputs": [{"question": question, "context": context}]},
                    headers={"traceparent": f"00-{trace_id}-{parent_id}-01"},
                )
                answer.raise_for_status()

            def complete(spans: list[ReceivedSpan]) -> bool:
                names = {s.name for s in spans if s.trace_id == trace_id}
                return {"inference", "queue"} <= names and any(s.parent_span_id == parent_id for s in spans)

            spans = receiver.wait_for(complete, timeout=30)
        finally:
            server.stop()
    root = next(s for s in spans if s.trace_id == trace_id and s.parent_span_id == parent_id)
    print(f"question: {question!r} ({len(context)} characters of context)")
    best = answer.json()["results"][0][0]["answer"]
    print(f"answer: {best!r}; response traceparent: {answer.headers['traceparent']}")
    print(f"\ntrace {trace_id} (the client's span {parent_id} is its parent):")
    print("\n".join(render(spans, root)))
    linked = {link.span_id for s in spans if s.trace_id == trace_id and s.name == "inference" for link in s.links}
    for batch in (s for s in spans if s.name == "batch" and s.span_id in linked):
        print(f"\nthe batch it ran in (trace {batch.trace_id}, linked to {len(batch.links)} request(s)):")
        print("\n".join(render(spans, batch)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
