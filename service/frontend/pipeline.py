"""From parsed inputs to answers: limits, tokenization (off the event loop), batching, post-processing."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np

from bertcore.model_config import EmbeddingSpec
from bertcore.rows import Row
from bertcore.tasks import classification, embedding, ner, qa
from bertcore.tasks.errors import TaskInputError
from service import tracing
from service.errors import ClientClosed, InvalidInput, WrongTask, unpaired_surrogate
from service.frontend.admission import Admission, ModelGates
from service.frontend.engine_client import Engine
from service.frontend.registry import SELF_TEST, ModelRegistry, ServedModel
from service.metrics import Metrics
from service.settings import Settings
from service.system.memory import IdleRelease, malloc_trim
from service.wire.ticket import Ticket

T = TypeVar("T")
# A request's text up to this many characters in all is tokenized and post-processed on the event loop (~0.1 ms per
# 1,000 characters for classification, ~0.5 ms for a SQuAD question's windows): handing it to a thread and back
# costs more, and under load the thread waits for the GIL anyway. Longer requests go to the pool.
INLINE_CHARS = 2_000
ENDPOINT_OF_TASK = {"classification": "classify", "ner": "ner", "qa": "qa", "embedding": "embed"}


@dataclass
class Timings:
    tokenization_s: float = 0.0
    queue_s: float = 0.0
    inference_s: float = 0.0
    inference_calls: int = 0
    rows: int = 0
    tokens: int = 0


class RequestPipeline:
    def __init__(
        self,
        settings: Settings,
        registry: ModelRegistry,
        engine: Engine,
        executor: ThreadPoolExecutor,
        metrics: Metrics,
    ) -> None:
        self.settings = settings
        self.metrics = metrics
        self.registry = registry
        self.engine = engine
        self.executor = executor
        # Tokenizer outputs and numpy buffers of large requests stay in glibc's heap: return them once idle.
        self.memory = IdleRelease("frontend", settings.release_memory_idle_s, malloc_trim)
        self.model_gates = ModelGates(
            settings.max_queue_s,
            settings.admission_floor_tokens,
            cold_requests=settings.admission_cold_requests,
            on_scale=self._model_share_changed,
            on_forget=self._model_gate_gone,
        )
        registry.on_change.append(lambda: self.model_gates.follow(registry.models))  # a gate per model served

    async def model_for(self, name: str, task: str, ticket: Ticket) -> ServedModel:
        """The model, if it serves `task`. Waiting for an engine that is (re)connecting counts as queueing: it is
        bounded by --max-queue-s and the request's deadline."""
        wait_s = min(self.settings.max_queue_s, ticket.deadline - time.monotonic())
        model = await self.registry.serving(name, wait_s, ticket)
        if model.task != task:
            endpoint = ENDPOINT_OF_TASK.get(model.task or "", "")
            raise WrongTask(f"model {name} is {_a(model.task)} model; use POST /v1/models/{name}/{endpoint}")
        return model

    def check_texts(self, texts: Sequence[tuple[str, str]]) -> None:
        """(field, text) pairs against the request limits, and text the tokenizer can take."""
        for where, text in texts:
            if len(text) > self.settings.max_chars_per_input:
                raise InvalidInput(
                    f"{where} has {len(text)} characters; the limit is {self.settings.max_chars_per_input}",
                    field=where,
                )
            if not text.isascii() and (surrogate := unpaired_surrogate(where, text)) is not None:
                raise surrogate

    def check_count(self, count: int, field: str = "inputs") -> None:
        """`field`: the request's name for its inputs (OpenAI's is input)."""
        if count > self.settings.max_inputs_per_request:
            raise InvalidInput(
                f"{count} inputs in one request; the limit is {self.settings.max_inputs_per_request}", field=field
            )

    async def classify(
        self,
        name: str,
        inputs: list[classification.TextInput],
        top_k: int | None,
        ticket: Ticket,
        function_to_apply: str | None = None,
    ) -> tuple[list[list[dict]], Timings]:
        """Labels and scores of each text or text pair; `function_to_apply` (softmax, sigmoid, none; None: the
        model's own, as transformers' pipeline chooses it) turns logits into scores."""
        model = await self.model_for(name, "classification", ticket)
        self._check_task_options(lambda: classification.check_function(function_to_apply))
        self.check_count(len(inputs))
        outputs, timings = await self._classify_rows(model, inputs, _classify_texts(inputs), ticket)
        labels, problem_type = model.labels, model.config.problem_type if model.config else None
        with tracing.span("postprocess"):
            results = classification.postprocess_all(
                [out["logits"] for out in outputs], labels, problem_type, top_k, function_to_apply
            )
        return results, timings

    async def rerank(
        self, name: str, query: str, documents: list[str], ticket: Ticket, max_tokens_per_doc: int | None = None
    ) -> tuple[list[float], list[int], Timings]:
        """The relevance of each document to the query, by a cross-encoder (a classification entry with one label
        that the export marked rerank): the sigmoid of its logit of the (query, document) pair, in [0, 1]; and the
        documents' indices best first, by the logits (`classification.relevance_order`). The pairs are this
        request's rows in the batcher, as a classify request's inputs; a
        pair longer than the model's window is cut as classify cuts one (--token-overflow), and with
        `max_tokens_per_doc` each document is first cut to its first that many tokens."""
        try:
            model = await self.model_for(name, "classification", ticket)
        except WrongTask:
            raise _not_a_cross_encoder(self.registry.lookup(name)) from None
        if model.config is None or not model.config.rerank:
            raise _not_a_cross_encoder(model)
        self.check_count(len(documents), "documents")
        texts = [("query", query), *((f"documents.{i}", document) for i, document in enumerate(documents))]
        if max_tokens_per_doc is not None:
            self.check_texts(texts)  # before the documents are tokenized to be cut
            tokenizer = model.loaded_tokenizer
            documents = await self._checked(
                lambda: [classification.first_tokens(tokenizer, text, max_tokens_per_doc) for text in documents]
            )
        pairs: list[classification.TextInput] = [(query, document) for document in documents]
        try:
            outputs, timings = await self._classify_rows(
                model, pairs, texts, ticket, [name for name, _ in texts[1:]], ("query", "document")
            )
        except InvalidInput as exc:  # a pair over the window: the query's fault where it leaves a document no room
            if exc.field is not None and exc.field.startswith("documents."):
                tokenizer = model.loaded_tokenizer
                self._check_task_options(lambda: classification.check_query(tokenizer, query, model.max_length))
            raise
        with tracing.span("postprocess"):
            logits = [out["logits"] for out in outputs]
            scores, order = classification.relevance_all(logits), classification.relevance_order(logits)
        return scores, order, timings

    async def embed(
        self,
        name: str,
        texts: list[str],
        ticket: Ticket,
        normalize: bool = True,
        dimensions: int | None = None,
        truncate: bool | None = None,
        field: str = "inputs",
        prompt_name: str | None = None,
        names: Sequence[str] | None = None,
    ) -> tuple[list[np.ndarray], Timings]:
        """A vector per text, in order, a float32 array each: the graph's (pooled, through any Dense layers,
        normalized where the model normalizes), its first `dimensions` values, scaled to unit length with
        `normalize`. A text longer than the model's window is cut to it or refused (`truncate`; None: as
        --token-overflow says); each text is one row in the batcher, as a classify input. `field` is the request's
        name for its texts (inputs; OpenAI's input), so that an error names the text at fault as the client knows
        it. Each text goes behind the prompt named (`prompt_name`, one of the model's), else the model's default
        prompt, as sentence-transformers' `encode` puts it. `names`, where given: each text's own name in the
        request, for its errors (`field` then names the texts as a whole, for their count)."""
        model = await self.model_for(name, "embedding", ticket)
        spec = _embedding_spec(model)
        self._check_task_options(lambda: embedding.check_dimensions(dimensions, spec.dimension))
        self.check_count(len(texts), field)
        inputs = self._check_task_options(lambda: embedding.prompted(texts, spec, prompt_name))
        tokenizer = model.loaded_tokenizer
        where = list(names) if names is not None else [f"{field}.{i}" for i in range(len(texts))]
        outputs, timings = await self._text_rows(
            model,
            list(zip(where, texts, strict=True)),
            ticket,
            lambda cut: embedding.prepare(tokenizer, inputs, model.max_length, cut, field if names is None else where),
            truncate,
        )
        with tracing.span("postprocess"):
            vectors = [embedding.postprocess(out[embedding.OUTPUT], normalize, dimensions) for out in outputs]
        return vectors, timings

    async def _classify_rows(
        self,
        model: ServedModel,
        inputs: list[classification.TextInput],
        texts: list[tuple[str, str]],
        ticket: Ticket,
        names: Sequence[str] | None = None,
        pair_names: tuple[str, str] = ("text", "text_pair"),
    ) -> tuple[list[Any], Timings]:
        """Texts or pairs, checked (`texts`: each with the field that names it) and tokenized, through the engine;
        `names`: each input's name for a refusal of its length (else inputs.N), `pair_names` a pair's two parts'."""
        tokenizer = model.loaded_tokenizer
        return await self._text_rows(
            model,
            texts,
            ticket,
            lambda cut: classification.prepare(tokenizer, inputs, model.max_length, cut, names, pair_names),
        )

    async def _text_rows(
        self,
        model: ServedModel,
        texts: list[tuple[str, str]],
        ticket: Ticket,
        prepare: Callable[[bool], list[Row]],
        truncate: bool | None = None,
    ) -> tuple[list[Any], Timings]:
        """One row per input (classification's, an embedding's): the texts checked (each with the field that names
        it), `prepare(truncate)` run (None: truncate as --token-overflow says), the rows through the engine. A
        request's few short texts are tokenized right here (INLINE_CHARS)."""
        cut = self.settings.token_overflow == "truncate" if truncate is None else truncate
        timings = Timings()
        self.check_texts(texts)
        rows = await self._off_loop(
            timings, lambda: prepare(cut), inline=sum(len(text) for _, text in texts) <= INLINE_CHARS
        )
        return await self._run(model, rows, ticket, timings), timings

    @staticmethod
    def _check_task_options(check: Callable[[], T]) -> T:
        """A task module's check of its parameters (and what it gives back): its TaskInputError is the client's
        (422, the field named)."""
        try:
            return check()
        except TaskInputError as exc:
            raise InvalidInput(str(exc), field=exc.field) from exc

    async def ner(
        self,
        name: str,
        inputs: list[str] | list[list[str]],
        strategy: str,
        ticket: Ticket,
        ignore_labels: Sequence[str] = ("O",),
        stride: int | None = None,
    ) -> tuple[list[list[dict]], Timings]:
        """Entities of each text; of each text given as its words, where `inputs` holds lists of words. Labels in
        `ignore_labels` are left out; texts longer than the model's window are cut into windows overlapping by
        `stride` tokens (None: `ner.default_stride`), as transformers' pipeline cuts them."""
        model = await self.model_for(name, "ner", ticket)
        self._check_task_options(lambda: ner.check_strategy(strategy))
        self.check_count(len(inputs))
        sources = [item if isinstance(item, str) else ner.Words.join(item) for item in inputs]
        texts = [source if isinstance(source, str) else source.text for source in sources]
        for i, item in enumerate(inputs):
            if not isinstance(item, str) and not texts[i].isascii():  # a fault in a word is named as that word's
                self.check_texts([(f"inputs.{i}.{j}", word) for j, word in enumerate(item)])
        self.check_texts([(f"inputs.{i}", text) for i, text in enumerate(texts)])
        timings = Timings()
        if stride is None:
            stride = ner.default_stride(model.loaded_tokenizer, model.max_length)
        else:
            self._check_task_options(lambda: ner.check_stride(model.loaded_tokenizer, model.max_length, stride))
        ignored = tuple(ignore_labels)
        small = sum(len(text) for text in texts) <= INLINE_CHARS
        features = await self._off_loop(
            timings,
            lambda: [ner.prepare(model.loaded_tokenizer, item, model.max_length, stride) for item in sources],
            inline=small,
        )
        outputs = await self._run(model, [row for f in features for row in f.rows], ticket, timings)
        per_input = _split(outputs, [len(f.rows) for f in features])

        def post() -> list[list[dict]]:
            logits = [[o["logits"] for o in outs] for outs in per_input]
            return ner.postprocess_all(texts, features, logits, model.labels, strategy, ignored)

        with tracing.span("postprocess"):
            return await self._checked(post, inline=small), timings

    async def qa(
        self, name: str, pairs: list[tuple[str, str]], options: dict[str, Any], ticket: Ticket
    ) -> tuple[list[list[dict]], Timings]:
        model = await self.model_for(name, "qa", ticket)
        try:
            params = qa.request_params(options)
            params.window(model.max_length)
        except qa.QaInputError as exc:
            raise InvalidInput(str(exc), field=exc.field) from exc
        self.check_count(len(pairs))
        self.check_texts(
            [
                (f"inputs.{i}.{part}", text)
                for i, pair in enumerate(pairs)
                for part, text in zip(("question", "context"), pair, strict=True)
            ]
        )
        timings, s = Timings(), self.settings
        small = sum(len(question) + len(context) for question, context in pairs) <= INLINE_CHARS
        features = await self._off_loop(
            timings,
            lambda: qa.prepare_all(
                model.loaded_tokenizer, pairs, params, model.max_length, s.max_qa_windows, s.max_chars_per_input
            ),
            inline=small,
        )
        outputs = await self._run(model, [row for f in features for row in f.rows], ticket, timings)
        per_input = _split(outputs, [len(f.rows) for f in features])

        def post() -> list[list[dict]]:
            return [
                qa.postprocess(q, c, f, [o["start_logits"] for o in outs], [o["end_logits"] for o in outs], params)
                for (q, c), f, outs in zip(pairs, features, per_input, strict=True)
            ]

        with tracing.span("postprocess"):
            return await self._checked(post, inline=small), timings

    async def self_test(self, model: ServedModel) -> None:
        """One real request through the whole path before the model (a version of it) serves; a ServiceError (or
        any exception) says why it cannot."""
        ticket = Ticket.with_timeout(max(self.settings.request_timeout_s, 60.0))
        token = SELF_TEST.set(model)
        try:
            if model.task == "classification":
                await self.classify(model.name, ["bertserve self-test"], None, ticket)
            elif model.task == "ner":
                await self.ner(model.name, ["The bertserve self-test runs in Paris."], "simple", ticket)
            elif model.task == "embedding":
                await self.embed(model.name, ["bertserve self-test"], ticket)
            else:
                await self.qa(model.name, [("What runs?", "The bertserve self-test runs.")], {}, ticket)
        finally:
            SELF_TEST.reset(token)
            ticket.done()

    async def _off_loop(self, timings: Timings, work: Callable[[], T], inline: bool = False) -> T:
        """Tokenize on the pool; small work (`inline`) right here, where a thread hop would cost more than it."""
        started = time.perf_counter()
        with tracing.span("tokenize"):
            result = await self._checked(work, inline)
        timings.tokenization_s = time.perf_counter() - started
        return result

    async def _checked(self, work: Callable[[], T], inline: bool = False) -> T:
        """Run CPU work on the tokenizer pool, or with `inline` here (a request's few short texts: the hop to a
        thread and back cost more than the work, ~0.1-0.2 ms of a front-end's CPU each way under load); a ValueError
        from a task module is the client's input (422), with the field it names where it names one."""
        try:
            if inline:
                return work()
            return await asyncio.get_running_loop().run_in_executor(self.executor, work)
        except ValueError as exc:
            raise InvalidInput(str(exc), field=getattr(exc, "field", None)) from exc

    async def _run(self, model: ServedModel, rows: list[Row], ticket: Ticket, timings: Timings) -> list[Any]:
        if ticket.cancelled:  # the client left while its texts were tokenized: the engine is not handed its rows
            raise ClientClosed("the client went away before the answer; its rows were not run")
        tokens = sum(len(row) for row in rows)
        ticket.charge(tokens)
        share = self._model_share(model, tokens, ticket)
        self.memory.begin()
        answered = False
        try:
            with tracing.span("engine", {"bertserve.model": model.name, "bertserve.rows": len(rows)}) as span:
                if span.is_recording():
                    span.set_attribute("bertserve.tokens", tokens)
                    ticket.trace = tracing.current_context()  # the engine's spans of these rows: this span's
                outputs = await self.engine.infer(model.target, rows, ticket)
            answered = True
        finally:
            self.memory.end(large=tokens >= self.settings.release_memory_min_tokens)
            if share is not None:
                share.leave(completed=answered)
        timings.queue_s = ticket.queue_seconds
        timings.inference_s = ticket.inference_seconds
        timings.inference_calls = ticket.inference_calls
        timings.rows = len(rows)
        timings.tokens = tokens
        metrics = self.metrics
        metrics.series(metrics.queue_duration, model.name).observe(timings.queue_s)
        metrics.series(metrics.tokenization_duration, model.name).observe(timings.tokenization_s)
        return outputs

    def _model_share_changed(self, model: str, scale: float) -> None:
        """A model's gate admits `scale` of its usual share now: its metric, and the front-end's (the lowest)."""
        self.metrics.series(self.metrics.model_admission_share, model).set(scale)
        self.metrics.admission_share.set(self.model_gates.lowest())

    def _model_gate_gone(self, model: str) -> None:
        self.metrics.forget_series(self.metrics.model_admission_share, model)
        self.metrics.admission_share.set(self.model_gates.lowest())

    def _model_share(self, model: ServedModel, tokens: int, ticket: Ticket) -> Admission | None:
        """The model's own gate admits the request's tokens (`admission.ModelGates`), or Overloaded (429), where the
        door did not (the request named its model in its body). A self-test passes: a version must be tested to
        serve, whatever the load on the one before."""
        if ticket.admitted_model == model.name or SELF_TEST.get() is not None:
            return None
        gate = self.model_gates.gate(model.name)
        share = gate.try_enter(tokens, since=ticket.admitted_at)  # its time counts from the door
        if share is None:
            raise gate.overloaded()
        share.charge(tokens)  # tokenized: its real count, as the door's share was charged
        return share


def _not_a_cross_encoder(model: ServedModel) -> WrongTask:
    labels = len(model.labels)
    plural = "s" if labels != 1 else ""
    what = (
        f"a classification model with {labels} label{plural}"
        if model.task == "classification"
        else f"{_a(model.task)} model"
    )
    return WrongTask(
        f"model {model.name} is {what}, not a cross-encoder: rerank needs a classification entry with one label "
        f"(see GET /v1/models/{model.name})"
    )


def _a(task: str | None) -> str:
    """The task's name after its article: "a classification", "an embedding"."""
    return f"{'an' if task and task[0] in 'aeiou' else 'a'} {task}"


def _embedding_spec(model: ServedModel) -> EmbeddingSpec:
    """An embedding entry's spec (its model.json cannot lack one: `ModelConfig.parse` requires it)."""
    if model.config is None or model.config.embedding is None:
        raise model.load_failure()
    return model.config.embedding


def _classify_texts(inputs: list[classification.TextInput]) -> list[tuple[str, str]]:
    texts = []
    for i, item in enumerate(inputs):
        if isinstance(item, str):
            texts.append((f"inputs.{i}", item))
        else:
            texts.extend([(f"inputs.{i}.text", item[0]), (f"inputs.{i}.text_pair", item[1])])
    return texts


def _split(outputs: list[T], counts: list[int]) -> list[list[T]]:
    result, start = [], 0
    for count in counts:
        result.append(outputs[start : start + count])
        start += count
    return result
