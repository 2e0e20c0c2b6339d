"""The Open Inference Protocol v2 (KServe's v2 protocol) as this server speaks it: which tensors a model of each task
takes and gives (its metadata), how text arrives in them, which request parameters a task takes, and the call
into the one RequestPipeline. Shared by both transports, REST (`service.frontend.http.open_inference`) and gRPC
(`service.frontend.grpc`), which only turn their wire format into `InputTensor`s and `OutputTensor`s back into
theirs: the protocol's rules are written once, and both transports refuse the same input with the same message.

A model's tensors (one element per input, row-major; shape [N] or [N, 1]):

- classification: `text` BYTES and optional `text_pair` BYTES in; `label` BYTES and `score` FP32 out, shape [N, k]
  (the k best labels of each input, best first; parameter `top_k`, default 1);
- ner: `text` BYTES in; `entities` BYTES out, shape [N]: each a JSON list of entities (as the native /ner answers);
  parameter `aggregation_strategy`;
- qa: `question` and `context` BYTES in; `answers` BYTES out, shape [N]: each a JSON list of answers (as the native
  /qa answers); parameters `top_k`, `max_answer_len`, `doc_stride`, `max_seq_len`, `max_question_len`,
  `handle_impossible_answer`, `align_to_words`;
- embedding: `text` BYTES in; `embedding` FP32 out, shape [N, D] (a vector per input, as the native /embed answers
  it); parameters `normalize` (default true) and `dimensions` (the first D values, normalized again unless
  `normalize` is false).

BYTES elements are UTF-8 text. Every error is a domain error (`service.errors`): BadRequest where the tensors break
the protocol (a name, a datatype, a shape that disagrees with the data), InvalidInput where the text breaks a limit.
"""

from __future__ import annotations

import json
import struct
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from bertcore.messages import shown
from bertcore.tasks.classification import text_input
from bertcore.tasks.ner import AGGREGATION_STRATEGIES
from bertcore.version import __version__
from service.errors import BadRequest, InvalidInput, ModelNotFound, NotReady
from service.frontend.pipeline import RequestPipeline, Timings
from service.frontend.registry import ServedModel
from service.wire.ticket import Ticket

SERVER_NAME = "bertserve"
PLATFORM = "bertserve"  # the tensors are text and answers, not the ONNX graph's: no ONNX Runtime platform name fits
# Triton's extension (tritonclient's default over HTTP): tensor data as raw bytes after the JSON.
BINARY_EXTENSION = "binary_tensor_data"
EXTENSIONS = (BINARY_EXTENSION,)
# Request parameters any model takes, beside its task's: tritonclient's HTTP client sends binary_data_output where the
# request names no outputs (binary outputs are sent where it is true); its `priority` and `timeout` arguments
# become Triton's parameters of those names: a priority is taken and has no effect (one queue serves every request
# alike, oldest first), a timeout (microseconds, 0: none) shortens the request's deadline.
TRANSPORT_PARAMETERS = frozenset({"binary_data_output", "priority", "timeout"})
FLOAT32_LE = np.dtype("<f4")
LENGTH = struct.Struct("<I")  # a BYTES element's length, in the raw (binary) form


@dataclass(frozen=True)
class TensorSpec:
    name: str
    datatype: str
    shape: tuple[int, ...]  # -1: any size
    optional: bool = False

    def metadata(self) -> dict[str, Any]:
        return {"name": self.name, "datatype": self.datatype, "shape": list(self.shape)}


@dataclass(frozen=True)
class TaskTensors:
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    parameters: tuple[str, ...]


QA_PARAMETERS = (
    "top_k",
    "max_answer_len",
    "doc_stride",
    "max_seq_len",
    "max_question_len",
    "handle_impossible_answer",
    "align_to_words",
)
TASKS = {
    "classification": TaskTensors(
        inputs=(TensorSpec("text", "BYTES", (-1,)), TensorSpec("text_pair", "BYTES", (-1,), optional=True)),
        outputs=(TensorSpec("label", "BYTES", (-1, -1)), TensorSpec("score", "FP32", (-1, -1))),
        parameters=("top_k",),
    ),
    "ner": TaskTensors(
        inputs=(TensorSpec("text", "BYTES", (-1,)),),
        outputs=(TensorSpec("entities", "BYTES", (-1,)),),
        parameters=("aggregation_strategy",),
    ),
    "qa": TaskTensors(
        inputs=(TensorSpec("question", "BYTES", (-1,)), TensorSpec("context", "BYTES", (-1,))),
        outputs=(TensorSpec("answers", "BYTES", (-1,)),),
        parameters=QA_PARAMETERS,
    ),
    "embedding": TaskTensors(
        inputs=(TensorSpec("text", "BYTES", (-1,)),),
        outputs=(TensorSpec("embedding", "FP32", (-1, -1)),),
        parameters=("normalize", "dimensions"),
    ),
}


@dataclass
class InputTensor:
    """One input as a transport received it: its data still in the wire's form (`values`: a list of elements, or
    `raw`: the binary form)."""

    name: str
    datatype: str
    shape: list[int]
    values: Sequence[Any] | None = None
    raw: bytes | None = None


@dataclass
class OutputTensor:
    name: str
    datatype: str
    shape: list[int]
    data: list[Any] | np.ndarray  # flat, row-major: str for BYTES; float for FP32, or a float32 array

    def raw(self) -> bytes:
        """The binary form: BYTES elements each a 4-byte little-endian length and the UTF-8 bytes; FP32 as
        little-endian floats."""
        if isinstance(self.data, np.ndarray):
            return self.data.astype(FLOAT32_LE, copy=False).tobytes()
        if self.datatype == "BYTES":
            parts = []
            for text in self.data:
                encoded = text.encode("utf-8")
                parts += [LENGTH.pack(len(encoded)), encoded]
            return b"".join(parts)
        return struct.pack(f"<{len(self.data)}f", *self.data)


@dataclass
class InferResult:
    outputs: list[OutputTensor]
    timings: Timings
    parameters: dict[str, Any] = field(default_factory=dict)


def server_metadata() -> dict[str, Any]:
    return {"name": SERVER_NAME, "version": __version__, "extensions": list(EXTENSIONS)}


def task_of(model: ServedModel) -> TaskTensors:
    """The model's tensors; NotReady (or ModelFailed) while its task is not known (its entry did not load)."""
    if model.task not in TASKS:
        raise model.load_failure() if model.failure else NotReady.loading(model.name)
    return TASKS[model.task]


def model_metadata(model: ServedModel) -> dict[str, Any]:
    tensors = task_of(model)
    return {
        "name": model.name,
        "versions": [],
        "platform": PLATFORM,
        "inputs": [spec.metadata() for spec in tensors.inputs],
        "outputs": [spec.metadata() for spec in tensors.outputs],
    }


def count_of(tensor: InputTensor) -> int:
    """The number of elements the tensor's shape says, where the shape is one this server takes: [N] or [N, 1]."""
    shape = tensor.shape
    if len(shape) not in (1, 2) or any(dim < 0 for dim in shape) or (len(shape) == 2 and shape[1] != 1):
        raise BadRequest(f"input {tensor.name}: shape {shown(list(shape))}; expected [N] or [N, 1] (N texts)")
    return shape[0]


def decode_raw(raw: bytes, count: int, where: str) -> list[bytes]:
    """`count` BYTES elements out of their binary form; BadRequest where the bytes do not hold exactly that."""
    elements, offset, size = [], 0, len(raw)
    view = memoryview(raw)
    for _ in range(count):
        if offset + 4 > size:
            raise BadRequest(f"input {where}: its data holds fewer elements than its shape says ({count})")
        (length,) = LENGTH.unpack_from(raw, offset)
        offset += 4
        if offset + length > size:
            raise BadRequest(f"input {where}: an element's length ({length}) runs past the end of its data")
        elements.append(bytes(view[offset : offset + length]))
        offset += length
    if offset != size:
        raise BadRequest(f"input {where}: its data holds more than the {count} elements its shape says")
    return elements


def texts_of(tensor: InputTensor, pipeline: RequestPipeline) -> list[str]:
    """The tensor's texts: checked against the protocol (BYTES, a shape that agrees with the data) and the count
    limit before any element is decoded."""
    if tensor.datatype != "BYTES":
        raise BadRequest(f"input {tensor.name}: datatype {shown(tensor.datatype, 22)}; it takes BYTES (UTF-8 text)")
    count = count_of(tensor)
    pipeline.check_count(count, tensor.name)  # the field is the tensor: "inputs.1" would name a second one
    if tensor.raw is not None:
        elements: Sequence[Any] = decode_raw(tensor.raw, count, tensor.name)
    else:
        elements = tensor.values if tensor.values is not None else []
        if len(elements) != count:
            held = len(elements)
            shape = shown(list(tensor.shape))
            says = f"{count} element" if count == 1 else f"{count} elements"
            raise BadRequest(f"input {tensor.name}: shape {shape} says {says}, the data holds {held}")
    texts = []
    for i, element in enumerate(elements):
        if isinstance(element, bytes):
            try:
                texts.append(element.decode("utf-8"))
            except UnicodeDecodeError as exc:
                raise InvalidInput(
                    f"input {tensor.name}, element {i}: byte {exc.start} is not UTF-8; BYTES elements are UTF-8 text",
                    field=f"{tensor.name}.{i}",
                ) from None
        elif isinstance(element, str):
            texts.append(element)
        else:
            raise BadRequest(f"input {tensor.name}, element {i}: {json_kind(element)}; BYTES elements are text")
    # the limits on each text, named as this protocol names an element (the pipeline's own check names the native
    # API's field, inputs.{i}, which in a v2 body is another tensor)
    pipeline.check_texts([(f"{tensor.name}.{i}", text) for i, text in enumerate(texts)])
    return texts


def json_kind(value: object) -> str:
    """What a JSON value is, as JSON names it (a message about a client's JSON names no Python type)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, dict):  # an array cannot come here: a tensor's nested data is read flat
        return "an object"
    return f"a {type(value).__name__}"


def check_parameters(task: TaskTensors, parameters: dict[str, Any]) -> dict[str, Any]:
    """The task's parameters of the request; BadRequest naming one the task does not take, and every one a request
    may give (the task's, then the transport's that every model takes)."""
    unknown = sorted(set(parameters) - set(task.parameters) - TRANSPORT_PARAMETERS)
    if unknown:
        takes = ", ".join([*task.parameters, *sorted(TRANSPORT_PARAMETERS)])
        raise BadRequest(f"parameter {shown(unknown[0], 102)} is not one this model takes (it takes: {takes})")
    return {name: value for name, value in parameters.items() if name in task.parameters}


def unversioned(name: str, version: str) -> ModelNotFound:
    """The error for a request naming a model's version (REST's /versions/{v}/ routes, gRPC's model_version): the
    served models have none."""
    return ModelNotFound(f"model {shown(name, 102)} has no version {shown(version, 22)}: served models are unversioned")


# Triton's extensions that tritonclient calls and this server does not serve: what each 404 says instead
NOT_SERVED = {
    "stats": "Triton's statistics extension is not served: GET /metrics has the server's figures (Prometheus)",
    "config": "Triton's model configuration is not served: GET /v2/models/{name} gives the model's tensors",
}


def check_output_parameters(output: str, parameters: dict[str, Any]) -> None:
    """A requested output's parameters: `binary_data` (REST's binary extension) only. Triton's classification
    extension (`classification`, tritonclient's `class_count`) is refused, not ignored: the plain tensor came back
    as if it had been applied."""
    for name in parameters:
        if name == "binary_data":
            continue
        if name == "classification":
            raise BadRequest(
                f"output {shown(output, 102)}: parameter 'classification' (tritonclient's class_count) is not taken: "
                "Triton's classification extension is not served; a classification model's label and score "
                "outputs give its best labels (parameter top_k)"
            )
        raise BadRequest(f"output {shown(output, 102)}: parameter {shown(name, 102)} is not one an output takes")


async def infer(
    pipeline: RequestPipeline,
    model: ServedModel,
    inputs: list[InputTensor],
    parameters: dict[str, Any],
    requested: list[str] | None,
    ticket: Ticket,
) -> InferResult:
    """One inference request of the protocol: the model's input tensors in, the requested outputs (all where
    `requested` is None) out."""
    task = task_of(model)
    options = check_parameters(task, parameters)
    _shorten_deadline(ticket, parameters.get("timeout"))
    names = {spec.name for spec in task.outputs}
    asked: set[str] = set()
    for name in requested or ():
        if name in asked:  # it was answered once, as if asked once
            raise BadRequest(f"output {shown(name, 102)} is requested twice: name each output once")
        asked.add(name)
        if name not in names:
            raise BadRequest(f"output {shown(name, 102)}: model {model.name} has outputs {', '.join(sorted(names))}")
    texts = _inputs(task, inputs, pipeline)
    counts = {len(values) for values in texts.values()}
    if len(counts) > 1:
        held = ", ".join(f"{name} {len(values)}" for name, values in texts.items())
        raise BadRequest(f"the inputs hold different numbers of texts ({held}); each input needs one per row")
    if counts == {0}:  # as the native routes refuse an empty list of inputs
        first = next(iter(texts))
        raise InvalidInput(f"input {first}: no texts (shape [0]); a request needs at least one", field=first)
    if model.task == "classification":
        outputs, timings = await _classify(pipeline, model.name, texts, options, ticket)
    elif model.task == "ner":
        outputs, timings = await _recognize(pipeline, model.name, texts["text"], options, ticket)
    elif model.task == "embedding":
        outputs, timings = await _embed(pipeline, model.name, texts["text"], options, ticket)
    else:
        outputs, timings = await _answer(pipeline, model.name, texts, options, ticket)
    return InferResult([out for out in outputs if requested is None or out.name in requested], timings)


def _shorten_deadline(ticket: Ticket, timeout_us: Any) -> None:
    """Triton's `timeout` parameter: the request's deadline, in microseconds from now, where it is sooner than the
    server's own (0 and none: the server's)."""
    if timeout_us is None:
        return
    if not _whole(timeout_us) or timeout_us < 0:
        raise InvalidInput(
            f"parameter timeout must be a whole number of microseconds, not {shown(timeout_us)}", field="timeout"
        )
    if timeout_us:
        ticket.deadline = min(ticket.deadline, time.monotonic() + timeout_us / 1e6)


def _inputs(task: TaskTensors, inputs: list[InputTensor], pipeline: RequestPipeline) -> dict[str, list[str]]:
    specs = {spec.name: spec for spec in task.inputs}
    texts: dict[str, list[str]] = {}
    for tensor in inputs:
        if tensor.name not in specs:
            raise BadRequest(f"input {shown(tensor.name, 102)}: the model takes {', '.join(specs)}")
        if tensor.name in texts:
            raise BadRequest(f"input {tensor.name}: given twice")
        texts[tensor.name] = texts_of(tensor, pipeline)
    missing = [spec.name for spec in task.inputs if not spec.optional and spec.name not in texts]
    if missing:
        raise BadRequest(f"input {missing[0]} is missing: the model takes {', '.join(specs)}")
    return texts


async def _classify(
    pipeline: RequestPipeline, name: str, texts: dict[str, list[str]], options: dict[str, Any], ticket: Ticket
) -> tuple[list[OutputTensor], Timings]:
    top_k = options.get("top_k", 1)
    if not _whole(top_k) or top_k < 1:
        raise InvalidInput(f"parameter top_k must be a whole number of at least 1, not {shown(top_k)}", field="top_k")
    pairs = texts.get("text_pair")
    inputs: list[Any] = list(texts["text"])
    if pairs is not None:  # an empty second text is none, as the pipeline reads it
        inputs = [text_input(text, pair) for text, pair in zip(inputs, pairs, strict=True)]
    results, timings = await pipeline.classify(name, inputs, top_k, ticket)
    k = len(results[0]) if results else 0
    shape = [len(results), k]
    labels = [item["label"] for result in results for item in result]
    scores = [item["score"] for result in results for item in result]
    return [OutputTensor("label", "BYTES", shape, labels), OutputTensor("score", "FP32", shape, scores)], timings


async def _recognize(
    pipeline: RequestPipeline, name: str, texts: list[str], options: dict[str, Any], ticket: Ticket
) -> tuple[list[OutputTensor], Timings]:
    strategy = options.get("aggregation_strategy", "simple")
    if strategy not in AGGREGATION_STRATEGIES:
        raise InvalidInput(
            f"parameter aggregation_strategy must be one of {', '.join(AGGREGATION_STRATEGIES)}, not {shown(strategy)}",
            field="aggregation_strategy",
        )
    results, timings = await pipeline.ner(name, texts, strategy, ticket)
    return [OutputTensor("entities", "BYTES", [len(results)], [_json(result) for result in results])], timings


async def _answer(
    pipeline: RequestPipeline, name: str, texts: dict[str, list[str]], options: dict[str, Any], ticket: Ticket
) -> tuple[list[OutputTensor], Timings]:
    pairs = list(zip(texts["question"], texts["context"], strict=True))
    for i, (question, context) in enumerate(pairs):
        for part, text in (("question", question), ("context", context)):
            if not text:
                raise InvalidInput(
                    f"input {part}, element {i}: empty; a question and its context need text", field=f"{part}.{i}"
                )
    results, timings = await pipeline.qa(name, pairs, options, ticket)
    return [OutputTensor("answers", "BYTES", [len(results)], [_json(result) for result in results])], timings


async def _embed(
    pipeline: RequestPipeline, name: str, texts: list[str], options: dict[str, Any], ticket: Ticket
) -> tuple[list[OutputTensor], Timings]:
    normalize, dimensions = options.get("normalize", True), options.get("dimensions")
    if not isinstance(normalize, bool):
        raise InvalidInput(f"parameter normalize must be true or false, not {shown(normalize)}", field="normalize")
    if dimensions is not None and not _whole(dimensions):
        raise InvalidInput(f"parameter dimensions must be a whole number, not {shown(dimensions)}", field="dimensions")
    vectors, timings = await pipeline.embed(name, texts, ticket, normalize, dimensions, field="text")
    size = len(vectors[0]) if vectors else 0
    data = np.concatenate(vectors) if vectors else np.zeros(0, dtype=np.float32)
    return [OutputTensor("embedding", "FP32", [len(vectors), size], data)], timings


def _whole(value: Any) -> bool:
    """An integer parameter's value (JSON's true and false are Python's bools, which are ints)."""
    return isinstance(value, int) and not isinstance(value, bool)


def _json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))
