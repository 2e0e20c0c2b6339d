"""Request and response bodies of the REST API (also what /docs and the committed OpenAPI schema show)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, model_validator

from bertcore.tasks.classification import TextInput, text_input
from bertcore.tasks.qa import MAX_ANSWER_LEN, MAX_TOP_K, MIN_SEQ_LEN
from service.settings import MAX_INPUTS_CEILING

# A request's list of inputs (or documents, or sentences): one at least, and no more than the inputs setting may
# allow, checked before the items are
INPUTS = Field(min_length=1, max_length=MAX_INPUTS_CEILING)


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class TextPair(Strict):
    text: str = Field(description="first segment")
    text_pair: str | None = Field(
        None, description='second segment; absent, null or "": the text alone, as the transformers pipeline reads it'
    )

    def as_input(self) -> TextInput:
        """The text, or the pair, as the pipeline reads it (`classification.text_input`)."""
        return text_input(self.text, self.text_pair)


ClassifyInput = Annotated[str | TextPair, Field(description="a text, or a text pair")]


class ClassifyRequest(Strict):
    inputs: ClassifyInput | Annotated[list[ClassifyInput], INPUTS] = Field(
        description="one input or a non-empty list of them", examples=["a gorgeous, witty, seductive movie."]
    )
    top_k: StrictInt | None = Field(1, ge=1, description="best labels to return per input; null: every label, sorted")


class LabelScore(BaseModel):
    label: str
    score: float


class ClassifyResponse(BaseModel):
    model: str
    results: list[list[LabelScore]] = Field(description="per input, labels by decreasing score")


WordList = Annotated[list[str], Field(min_length=1)]


class NerRequest(Strict):
    inputs: str | Annotated[list[str | WordList], INPUTS] = Field(
        description="one text or a non-empty list of texts; with is_split_into_words, one text's words or a "
        "non-empty list of such lists",
        examples=["EU rejects German call to boycott British lamb."],
    )
    aggregation_strategy: Literal["none", "simple", "first", "average", "max"] = Field(
        "simple", description="as transformers' token-classification pipeline"
    )
    is_split_into_words: StrictBool = Field(
        False,
        description="inputs are texts given as words (e.g. CoNLL's): each text is its words joined by one space "
        "(offsets count in that text), each entity also names its first_word and last_word, and the strategies "
        "first, average and max label these words rather than the words the tokenizer's pieces suggest",
    )


class Entity(BaseModel):
    entity_group: str | None = Field(None, description="entity type (aggregated strategies)")
    entity: str | None = Field(None, description="token tag (strategy none)")
    index: int | None = Field(None, description="token index (strategy none)")
    score: float
    word: str
    start: int | None = Field(description="character offset into the input text")
    end: int | None
    first_word: int | None = Field(None, description="with is_split_into_words: index of the entity's first word")
    last_word: int | None = Field(None, description="with is_split_into_words: index of the entity's last word")


class NerResponse(BaseModel):
    model: str
    results: list[list[Entity]]


class QaInput(Strict):
    question: str = Field(min_length=1, description="the question (not empty)")
    context: str = Field(min_length=1, description="the text to find the answer in (not empty)")


class QaRequest(Strict):
    inputs: QaInput | Annotated[list[QaInput], INPUTS]
    top_k: StrictInt = Field(1, ge=1, le=MAX_TOP_K, description="answers per input")
    max_answer_len: StrictInt = Field(15, ge=1, le=MAX_ANSWER_LEN, description="longest answer, in tokens")
    doc_stride: StrictInt | None = Field(
        None,
        ge=0,
        description="overlap of consecutive context windows, in tokens; null: min(max_seq_len / 2, 128); must be "
        "smaller than the room max_seq_len leaves for the context, where the context needs windows",
    )
    max_seq_len: StrictInt | None = Field(
        None,
        ge=MIN_SEQ_LEN,
        description="window length in tokens; null: 384; capped by the model's max_length. A request may need at "
        "most max_qa_windows windows (a server setting, 1536 by default), and one context at most what the longest "
        "context allowed needs at the default windows: 422 past either",
    )
    max_question_len: StrictInt = Field(64, ge=1, description="as transformers' question-answering pipeline")
    handle_impossible_answer: StrictBool = Field(False, description="allow an empty answer")
    align_to_words: StrictBool = Field(
        True, description="answers on word boundaries; false: on the tokens' own (as transformers' pipeline)"
    )


class Answer(BaseModel):
    score: float
    start: int = Field(description="character offset into the context")
    end: int
    answer: str


class QaResponse(BaseModel):
    model: str
    results: list[list[Answer]]


class EmbedRequest(Strict):
    inputs: str | Annotated[list[str], INPUTS] = Field(
        description="one text or a non-empty list of texts", examples=["A man is playing a guitar."]
    )
    normalize: StrictBool = Field(
        True,
        description="scale each vector to unit length (L2); false: the model's own vectors (unit length anyway "
        "where the model normalizes: see GET /v1/models/{name}, embedding.normalize)",
    )
    truncate: StrictBool | None = Field(
        None,
        description="a text longer than the model's window: cut to it (true) or answered 422 (false); null: as the "
        "server's --token-overflow says",
    )
    dimensions: StrictInt | None = Field(
        None,
        ge=1,
        description="keep each vector's first N values, normalized again unless normalize is false (Matryoshka-"
        "trained models); at most the "
        "model's dimension; null: every value",
    )
    prompt_name: str | None = Field(
        None,
        description="one of the model's prompts (GET /v1/models/{name}: embedding.prompts), put before each text; "
        "null: the model's default prompt, if any",
    )


class EmbedResponse(BaseModel):
    model: str
    results: list[list[float]] = Field(description="per input, its vector")


class ShapeInfo(BaseModel):
    buckets: int = Field(description="padded (rows, width) shapes the engine runs batches at; 0: exact shapes (CPU)")
    warmed: int = Field(description="shapes run once at warm-up (every bucket where there are buckets)")
    cuda_graphs: bool = Field(description="a CUDA graph is captured per bucket (--cuda-graphs)")


class EmbeddingInfo(BaseModel):
    dimension: int = Field(description="the vector's size (OpenAI's dimensions may ask for fewer, not more)")
    pooling: str = Field(description="the token states' pooling inside the graph: mean, cls, max, mean_sqrt_len_tokens")
    normalize: bool = Field(description="the graph itself scales every vector to unit length")
    dense_layers: int = Field(description="Dense layers after the pooling, inside the graph")
    similarity: str = Field(description="how the model's vectors are compared (sentence-transformers' similarity)")
    prompts: dict[str, str] = Field(description="the model's named prompts (prefixes), for prompt_name")
    default_prompt: str | None = Field(
        None,
        description="the prefix put before every text where no prompt_name is given, as sentence-transformers' "
        "encode puts it",
    )


class OpenAIModel(BaseModel):
    """A model as OpenAI's models API describes it."""

    id: str = Field(description="the model's name")
    object: Literal["model"] = "model"
    created: int = Field(description="its version's export time, Unix seconds (0: unknown)")
    owned_by: str = "bertserve"


class ModelInfo(OpenAIModel):
    name: str
    status: Literal["loading", "checking", "ready", "failed", "unloading"] = Field(
        description="loading -> checking (one real request through the whole path) -> ready, or failed; "
        "unloading: its requests in flight finish, new ones get 404"
    )
    error: str | None = None
    version: str | None = Field(
        None, description="the version in use: the export's time and a digest of the entry's files"
    )
    loading_version: str | None = Field(None, description="a new version being loaded beside the one in use")
    load_error: str | None = Field(
        None, description="why the latest load of a new version failed (the version in use keeps serving)"
    )
    task: str | None = None
    architecture: str | None = None
    labels: list[str] | None = None
    problem_type: str | None = None
    variant: str | None = None
    variant_accuracy: dict[str, Any] | None = Field(
        None, description="the served variant's figures measured at export on labelled data (--eval), against fp32"
    )
    provider: str | None = None
    note: str | None = None
    placement: dict[str, Any] | None = Field(
        None,
        description="where it runs and why: the --device asked for (requested), the provider, reason (requested, "
        "no_cuda_provider, cuda_unusable) and why in words, the graph's nodes per provider; on CUDA the device, "
        "the nodes placed on the CPU by op type and whether CUDA graphs are used",
    )
    cpu_variant_trial: dict[str, Any] | None = Field(
        None,
        description="--cpu-variant auto with fp32 and int8 both in the accuracy budget: each one's milliseconds "
        "per batch timed at load on this CPU, the batch, and the variant chosen and why",
    )
    demo: bool = False
    rerank: bool = Field(False, description="a cross-encoder (one label): POST /v1/rerank and /v2/rerank take it")
    embedding: EmbeddingInfo | None = Field(
        None, description="an embedding model's vector (POST /v1/models/{name}/embed and /v1/embeddings take it)"
    )
    max_length: int | None = None
    shapes: ShapeInfo | None = Field(None, description="the engine's shape buckets, once the model is loaded")
    limits: dict[str, int | float | str]


class ModelList(BaseModel):
    models: list[ModelInfo]
    object: Literal["list"] = Field("list", description="OpenAI's models API: the openai SDK's models.list()")
    data: list[OpenAIModel] = Field(description="every served model as OpenAI's models API lists it")


# The Hugging Face task API (POST /v1/models/{name}, service.frontend.http.hf_tasks): the task payload
# {"inputs", "parameters"} of the model's task, answered in that task's output shape.


class HfOptions(Strict):
    """The Inference API's `options`, as its clients send them (langchain's HuggingFaceInferenceAPIEmbeddings sends
    both on every call): taken, and they change nothing here."""

    use_cache: StrictBool | None = Field(None, description="taken and ignored: every answer is computed, none cached")
    wait_for_model: StrictBool | None = Field(
        None, description="taken and ignored: a model not ready is a 503 with Retry-After, whatever it says"
    )


class HfClassificationParameters(Strict):
    top_k: StrictInt | None = Field(None, ge=1, description="best labels per input; null: every label, sorted")
    function_to_apply: Literal["sigmoid", "softmax", "none"] | None = Field(
        None, description="logits to scores; null: the model's own (softmax, or sigmoid for multi-label)"
    )


class HfClassificationRequest(Strict):
    inputs: ClassifyInput | Annotated[list[ClassifyInput], INPUTS] = Field(
        description="a text, a {text, text_pair} or a non-empty list of them"
    )
    parameters: HfClassificationParameters | None = None
    options: HfOptions | None = None


class HfTokenClassificationParameters(Strict):
    aggregation_strategy: Literal["none", "simple", "first", "average", "max"] | None = Field(
        None, description="as transformers' token-classification pipeline; null: simple"
    )
    ignore_labels: list[str] | None = Field(None, description='labels left out; null: ["O"]')
    stride: StrictInt | None = Field(
        None, ge=0, description="overlap in tokens of the windows a long text is cut into; null: the server's"
    )


class HfTokenClassificationRequest(Strict):
    inputs: str | Annotated[list[str], INPUTS] = Field(description="a text or a non-empty list of texts")
    parameters: HfTokenClassificationParameters | None = None
    options: HfOptions | None = None


class HfQuestionAnsweringParameters(Strict):
    top_k: StrictInt | None = Field(None, ge=1, le=MAX_TOP_K, description="answers per input; null: 1")
    doc_stride: StrictInt | None = Field(None, ge=0, description="as QaRequest.doc_stride")
    max_answer_len: StrictInt | None = Field(
        None, ge=1, le=MAX_ANSWER_LEN, description="longest answer in tokens; null: 15"
    )
    max_seq_len: StrictInt | None = Field(None, ge=MIN_SEQ_LEN, description="as QaRequest.max_seq_len")
    max_question_len: StrictInt | None = Field(None, ge=1, description="accepted, as transformers' pipeline")
    handle_impossible_answer: StrictBool | None = Field(None, description="allow an empty answer; null: false")
    align_to_words: StrictBool | None = Field(None, description="answers on word boundaries; null: true")


class HfQuestionAnsweringRequest(Strict):
    inputs: QaInput | Annotated[list[QaInput], INPUTS]
    parameters: HfQuestionAnsweringParameters | None = None
    options: HfOptions | None = None


class HfFeatureExtractionParameters(Strict):
    """feature-extraction's parameters, at the top level of its payload (Hugging Face's task spec, and
    huggingface_hub's), or under `parameters` (the Inference API's older clients: langchain's
    HuggingFaceHubEmbeddings sends `{"inputs", "parameters": {}}`); one may be given in one place only."""

    normalize: StrictBool | None = Field(None, description="scale each vector to unit length; null: true")
    prompt_name: str | None = Field(
        None, description="one of the model's prompts, put before each text; null: the model's default prompt"
    )
    truncate: StrictBool | None = Field(
        None, description="a text past the model's window: cut (true) or 422 (false); null: --token-overflow"
    )
    truncation_direction: Literal["right"] | None = Field(
        None, description="the side a text is cut on: right (its end), the only one taken"
    )
    dimensions: StrictInt | None = Field(
        None,
        ge=1,
        description="keep each vector's first N values, normalized again unless normalize is false; at most the "
        "model's dimension",
    )
    encoding_format: Literal["float"] | None = Field(None, description="float, the only one taken")


class HfFeatureExtractionRequest(HfFeatureExtractionParameters):
    """feature-extraction's payload: its parameters beside `inputs`, or under `parameters`."""

    inputs: str | Annotated[list[str], INPUTS] = Field(description="a text or a non-empty list of texts")
    parameters: HfFeatureExtractionParameters | None = None
    options: HfOptions | None = None


class HfSentenceSimilarityInput(Strict):
    source_sentence: str = Field(description="the text the others are compared to")
    sentences: Annotated[list[str], INPUTS] = Field(
        description="a non-empty list of texts, each compared to source_sentence"
    )


class HfSentenceSimilarityParameters(Strict):
    """TEI's similarity parameters (the task's spec names none; huggingface_hub sends an empty object)."""

    prompt_name: str | None = Field(
        None, description="one of the model's prompts, put before each text; null: the model's default prompt"
    )
    truncate: StrictBool | None = Field(
        None, description="a text past the model's window: cut (true) or 422 (false); null: --token-overflow"
    )
    truncation_direction: Literal["right"] | None = Field(
        None, description="the side a text is cut on: right (its end), the only one taken"
    )


class HfSentenceSimilarityRequest(Strict):
    """sentence-similarity's payload (an embedding model whose `inputs` is an object): answered with the cosine
    similarity of source_sentence to each of the sentences, in their order."""

    inputs: HfSentenceSimilarityInput
    parameters: HfSentenceSimilarityParameters | None = None
    options: HfOptions | None = None


HfTaskRequest = Annotated[
    HfClassificationRequest
    | HfTokenClassificationRequest
    | HfQuestionAnsweringRequest
    | HfFeatureExtractionRequest
    | HfSentenceSimilarityRequest,
    Field(
        description="the task payload of the model's task (text-classification, token-classification, "
        "question-answering, or for an embedding model feature-extraction, or sentence-similarity where inputs is "
        "an object)"
    ),
]
HfTaskResponse = (
    list[list[LabelScore]]
    | list[Entity]
    | list[list[Entity]]
    | Answer
    | list[Answer]
    | list[Answer | list[Answer]]
    | list[list[float]]
    | list[float]
)


# Rerank (service.frontend.http.rerank): Cohere v1 and Jina (POST /v1/rerank), Cohere v2 (POST /v2/rerank).


class RerankDocument(BaseModel):
    """A document given as an object: its `text` is ranked; the object comes back as given."""

    model_config = ConfigDict(extra="allow")
    text: str

    @model_validator(mode="before")
    @classmethod
    def _text_only(cls, value: Any) -> Any:
        """Jina's multimodal documents ({"image": URL}) named: the 422 said only that `text` was missing."""
        if isinstance(value, dict) and "text" not in value and "image" in value:
            raise ValueError("an image document: multimodal reranking is not served, each document is a text")
        return value


class RerankRequest(Strict):
    model: str | None = Field(
        None, description="a rerank model's name; may be left out when the server serves exactly one"
    )
    query: str = Field(min_length=1)
    documents: Annotated[list[str | RerankDocument], INPUTS] = Field(
        description="texts, or objects whose text is ranked (returned as given)"
    )
    top_n: StrictInt | None = Field(None, ge=1, description="best documents to return; null: every document")
    return_documents: StrictBool | None = Field(
        False, description="each result also carries its document; null: false (as top_n's null is its default)"
    )


class RerankV2Request(Strict):
    model: str
    query: str = Field(min_length=1)
    documents: Annotated[list[str], INPUTS]
    top_n: StrictInt | None = Field(None, ge=1, description="best documents to return; null: every document")
    max_tokens_per_doc: StrictInt | None = Field(
        None, ge=1, description="each document cut to its first N tokens; null: cut only to the model's window"
    )


class RerankResult(BaseModel):
    index: int = Field(description="the document's position in the request")
    relevance_score: float = Field(description="the sigmoid of the cross-encoder's logit, in [0, 1]")
    document: dict[str, Any] | None = Field(None, description="with return_documents: the document, as {text, ...}")


class RerankMeta(BaseModel):
    api_version: dict[str, str]
    billed_units: dict[str, int]


class RerankUsage(BaseModel):
    total_tokens: int


class RerankResponse(BaseModel):
    id: str = Field(description="the request's id (x-request-id)")
    model: str
    results: list[RerankResult] = Field(description="best first")
    meta: RerankMeta
    usage: RerankUsage


# OpenAI's embeddings API (POST /v1/embeddings, service.frontend.http.openai_api): its request, its answer and its
# error body, as the openai SDK sends and parses them.

OpenAIText = Annotated[str, Field(min_length=1, description="a text (not empty)")]


class OpenAIEmbeddingRequest(Strict):
    input: OpenAIText | Annotated[list[OpenAIText], INPUTS] = Field(
        description="a text or a non-empty list of texts (token arrays are not taken: the model has its own tokenizer)",
        examples=["A man is playing a guitar."],
    )
    model: str = Field(description="the name of an embedding model this server serves")
    encoding_format: Literal["float", "base64"] | None = Field(
        None,
        description="float (null too): lists of numbers; base64: each vector's little-endian float32 bytes in "
        "base64 (what the openai SDK asks for by default, and decodes)",
    )
    dimensions: StrictInt | None = Field(
        None, ge=1, description="keep each vector's first N values, normalized again; at most the model's dimension"
    )
    user: str | None = Field(None, description="accepted and ignored")


class OpenAIEmbedding(BaseModel):
    object: Literal["embedding"]
    index: int = Field(description="the text's position in the request")
    embedding: list[float] | str = Field(description="the unit-length vector, or its float32 bytes in base64")


class OpenAIUsage(BaseModel):
    prompt_tokens: int = Field(description="the tokens of every text, special tokens included, after any cut")
    total_tokens: int


class OpenAIEmbeddingResponse(BaseModel):
    object: Literal["list"]
    data: list[OpenAIEmbedding]
    model: str
    usage: OpenAIUsage


class OpenAIError(BaseModel):
    message: str = Field(description="what went wrong, for a person")
    type: str = Field(
        description="invalid_request_error, authentication_error, rate_limit_error or server_error (by the status)"
    )
    param: str | None = Field(None, description="the offending field, where there is one")
    code: str | None = Field(None, description="the server's error_type: validation, not_found, wrong_task, ...")


class OpenAIErrorBody(BaseModel):
    error: OpenAIError


REQUEST_FIELDS = frozenset(
    name
    for model in (
        ClassifyRequest,
        TextPair,
        NerRequest,
        QaRequest,
        QaInput,
        HfClassificationRequest,
        HfClassificationParameters,
        HfTokenClassificationParameters,
        HfQuestionAnsweringParameters,
        RerankRequest,
        RerankV2Request,
        EmbedRequest,
        OpenAIEmbeddingRequest,
        HfFeatureExtractionRequest,
        HfSentenceSimilarityInput,
        HfOptions,
    )
    for name in model.model_fields
)


class ErrorBody(BaseModel):
    error: str = Field(description="what went wrong, for a person")
    error_type: str = Field(description="validation, bad_request, wrong_task, not_found, overloaded, timeout, ...")
    field: str | None = Field(None, description="the offending field, where there is one")


class ModelNotReady(BaseModel):
    status: str = Field(description="loading, checking (its self-test), failed, ...")
    error: str | None = Field(None, description="why it failed, where it did")


class NotReadyBody(ErrorBody):
    not_ready: dict[str, ModelNotReady] | None = Field(
        None, description="each model that is not ready, by name, and why (absent where the server is draining)"
    )
