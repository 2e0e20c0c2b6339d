"""The Hugging Face task API: `POST /v1/models/{name}` (the model's own URL, as an Inference Endpoint's URL is its
model) takes the task payload `{"inputs": ..., "parameters": {...}}` of the model's task and answers in that task's
output shape, as huggingface_hub's `InferenceClient(model=URL)` sends and parses them:

- text-classification: `[[{label, score}, ...], ...]`, one list per input (a single input too, as the Inference
  API answers it); by default every label, best first.
- token-classification: `[{entity_group | entity, score, word, start, end}, ...]` for one text, a list of such
  lists for a list of texts.
- question-answering: `{answer, score, start, end}` for one input with top_k 1, else a list; a list of those for a
  list of inputs.
- feature-extraction (an embedding model): `[[float, ...], ...]`, a vector per input (a single input too, as TEI
  answers it); its parameters sit beside `inputs` (the task's spec, and the client's), or under `parameters` (the
  Inference API's older clients), in one place each.
- sentence-similarity (an embedding model, its `inputs` an object `{source_sentence, sentences}`): `[float, ...]`,
  the cosine similarity of the source to each sentence, in the sentences' order.

Every payload may carry the Inference API's `options` (use_cache, wait_for_model), which change nothing here.

An adapter only: the body's parameters become the request pipeline's options (`RequestPipeline.classify`, `ner`,
`qa`, `embed`), and the request is admitted, limited, timed and counted as the native routes' are
(`routes.admitted`)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
from fastapi.exceptions import RequestValidationError
from pydantic import BaseModel, ValidationError
from starlette.requests import Request
from starlette.responses import Response

from service.errors import InvalidInput
from service.frontend.http import schemas
from service.frontend.http.json_answer import JsonAnswer
from service.frontend.http.routes import AdapterRoute, admitted, json_body, parse_body, server_state, timing_headers
from service.frontend.pipeline import RequestPipeline, Timings
from service.wire.ticket import Ticket

Run = Callable[[RequestPipeline, str, Any, Ticket], Awaitable[tuple[Any, Timings]]]


@dataclass(frozen=True)
class HfTask:
    """One task of the API: its payload's schema and how it runs on the pipeline."""

    name: str  # the task's name in Hugging Face's task specs
    request: type[BaseModel]
    run: Run
    parameters: str = "parameters."  # where its payload holds the parameters (feature-extraction: the top level)


async def _text_classification(pipeline: RequestPipeline, name: str, body: Any, ticket: Ticket) -> tuple[Any, Timings]:
    params = body.parameters or schemas.HfClassificationParameters()
    items = body.inputs if isinstance(body.inputs, list) else [body.inputs]
    inputs = [item if isinstance(item, str) else item.as_input() for item in items]
    return await pipeline.classify(name, inputs, params.top_k, ticket, params.function_to_apply)


async def _token_classification(pipeline: RequestPipeline, name: str, body: Any, ticket: Ticket) -> tuple[Any, Timings]:
    params = body.parameters or schemas.HfTokenClassificationParameters()
    single = isinstance(body.inputs, str)
    results, timings = await pipeline.ner(
        name,
        [body.inputs] if single else body.inputs,
        params.aggregation_strategy or "simple",
        ticket,
        ignore_labels=("O",) if params.ignore_labels is None else params.ignore_labels,
        stride=params.stride,
    )
    return (results[0] if single else results), timings


async def _question_answering(pipeline: RequestPipeline, name: str, body: Any, ticket: Ticket) -> tuple[Any, Timings]:
    params = body.parameters or schemas.HfQuestionAnsweringParameters()
    options = {key: value for key, value in params.model_dump().items() if value is not None}
    single = not isinstance(body.inputs, list)
    items = [body.inputs] if single else body.inputs
    answers, timings = await pipeline.qa(name, [(item.question, item.context) for item in items], options, ticket)
    results: list[Any] = answers
    if options.get("top_k", 1) == 1:  # one answer is the answer itself, as the pipeline returns it
        results = [found[0] if len(found) == 1 else found for found in answers]
    return (results[0] if single else results), timings


async def _feature_extraction(pipeline: RequestPipeline, name: str, body: Any, ticket: Ticket) -> tuple[Any, Timings]:
    texts = body.inputs if isinstance(body.inputs, list) else [body.inputs]
    params = _feature_extraction_parameters(body)
    normalize = True if params.normalize is None else params.normalize
    return await pipeline.embed(
        name, texts, ticket, normalize, params.dimensions, params.truncate, prompt_name=params.prompt_name
    )


def _feature_extraction_parameters(body: schemas.HfFeatureExtractionRequest) -> schemas.HfFeatureExtractionParameters:
    """The parameters given beside `inputs` and those under `parameters`, in one; a parameter given in both places
    is a 422 naming it (which one would be meant?)."""
    if body.parameters is None:
        return body  # the payload is its own parameters
    given = {key: getattr(body, key) for key in schemas.HfFeatureExtractionParameters.model_fields}
    for key, value in body.parameters.model_dump(exclude_none=True).items():
        if given[key] is not None:
            raise InvalidInput(f"{key} is given twice, beside inputs and in parameters: give it once", field=key)
        given[key] = value
    return schemas.HfFeatureExtractionParameters(**given)


async def _sentence_similarity(pipeline: RequestPipeline, name: str, body: Any, ticket: Ticket) -> tuple[Any, Timings]:
    """The source and the sentences embedded in one pipeline call (one request's rows, the source first), each
    vector scaled to unit length: the dot products are the cosine similarities (sentence-transformers' cos_sim)."""
    params = body.parameters or schemas.HfSentenceSimilarityParameters()
    sentences = body.inputs.sentences
    names = ["inputs.source_sentence", *(f"inputs.sentences.{i}" for i in range(len(sentences)))]
    vectors, timings = await pipeline.embed(
        name,
        [body.inputs.source_sentence, *sentences],
        ticket,
        truncate=params.truncate,
        field="inputs.sentences",
        prompt_name=params.prompt_name,
        names=names,
    )
    source, others = np.asarray(vectors[0], dtype=np.float64), np.asarray(vectors[1:], dtype=np.float64)
    # float32 vectors of unit length give a text and itself 1.00000006 in float64: a cosine is at most 1
    return np.clip(others @ source, -1.0, 1.0).tolist(), timings


TASKS = {
    "classification": HfTask("text-classification", schemas.HfClassificationRequest, _text_classification),
    "ner": HfTask("token-classification", schemas.HfTokenClassificationRequest, _token_classification),
    "qa": HfTask("question-answering", schemas.HfQuestionAnsweringRequest, _question_answering),
    "embedding": HfTask("feature-extraction", schemas.HfFeatureExtractionRequest, _feature_extraction, ""),
}
# An embedding model's other task: its payload's `inputs` is an object (feature-extraction's is a text or a list).
SENTENCE_SIMILARITY = HfTask("sentence-similarity", schemas.HfSentenceSimilarityRequest, _sentence_similarity)


def task_of(model_task: str, data: Any) -> HfTask:
    """The task a payload asks of a model of `model_task`: an embedding model's is sentence-similarity where
    `inputs` is an object, feature-extraction otherwise."""
    if model_task == "embedding" and isinstance(data, dict) and isinstance(data.get("inputs"), dict):
        return SENTENCE_SIMILARITY
    return TASKS[model_task]


async def serve(request: Request) -> Response:
    """The payload is read as the task of the model named in the path (404 for none; 503 for one that failed to
    load); its errors are the native API's: one error body, 422 naming the field or parameter."""
    server = server_state(request)
    name = request.path_params["name"]
    data = await json_body(request)
    model = server.registry.lookup(name)
    if model.task is None:  # its model.json could not be read: the load failure says why
        raise model.load_failure()
    task = task_of(model.task, data)
    try:
        body = parse_body(task.request, data)
    except RequestValidationError:
        other = _other_task_taking(data, model.task)
        if other is None:
            raise
        served = " and ".join(known.name for known in _tasks_of(model.task))
        raise InvalidInput(
            f"this payload is {other.name}'s, and model {name} serves {served}: send its task's payload "
            "(GET /v1/models says which task a model serves)",
            field="inputs",
        ) from None
    async with admitted(request) as ticket:
        try:
            result, timings = await task.run(server.pipeline, name, body, ticket)
        except InvalidInput as exc:
            raise _named_in_the_payload(exc, task.parameters) from None
    return JsonAnswer(result, headers=timing_headers(timings, ticket))


def _tasks_of(model_task: str) -> list[HfTask]:
    return [TASKS[model_task], SENTENCE_SIMILARITY] if model_task == "embedding" else [TASKS[model_task]]


def _other_task_taking(data: Any, model_task: str) -> HfTask | None:
    """The task of another kind of model whose payload `data` is, where the model's own refused it: a question and
    context sent to an embedding model were told 'inputs.source_sentence: Field required (also: inputs.context,
    inputs.question, ...)', naming the fields the client did send."""
    for task in (*TASKS.values(), SENTENCE_SIMILARITY):
        if task in _tasks_of(model_task):
            continue
        try:
            task.request.model_validate(data)
        except ValidationError:
            continue
        return task
    return None


def _named_in_the_payload(exc: InvalidInput, parameters: str) -> InvalidInput:
    """The task's refusal of a parameter names it where the task's payload has it (parameters.stride), as the
    schema's own refusals do; a refusal of the inputs is named as it is."""
    field = exc.field
    if not parameters or field is None or field == "inputs" or field.startswith(("inputs.", parameters)):
        return exc
    return InvalidInput(exc.message, field=parameters + field)


ROUTES = (
    AdapterRoute(
        "/v1/models/{name}",
        "hf_task",
        "Hugging Face task API: the payload of the model's task (text-, token-classification, question-answering, "
        "feature-extraction, sentence-similarity)",
        schemas.HfTaskRequest,
        schemas.HfTaskResponse,
        serve,
    ),
)
