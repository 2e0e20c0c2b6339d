"""Extractive question answering: windows in, answer spans out, as transformers 4.57's question-answering pipeline.

The pipeline left transformers in version 5; its last behaviour (4.57.x, fast tokenizers) is the reference, and
`tests/fixtures/qa/` holds its outputs (made by `tools/qa_golden.py`). What it does, and so what this module does:

Windows (`prepare`)
    The question comes first and the context second (the pipeline puts the question first whenever the
    tokenizer pads on the right, as every BERT-family tokenizer does). The pair is encoded with `only_second`
    truncation to `max_seq_len` tokens and `doc_stride` tokens of overlap: each window holds the whole question
    and a slice of the context. Where the tokenizer pads on the left (XLNet, its <cls> last) the pipeline puts
    the context first and truncates `only_first`, and so do we (`context_first`).
    `max_question_len` is *not* applied: 4.57 only passed it to the slow-tokenizer path, so a long question is
    never cut; it only leaves less room for the context.
    Defaults: `max_seq_len` = min(model limit, 384); `doc_stride` = min(max_seq_len // 2, 128). Unlike the
    pipeline we also cap an explicit `max_seq_len` at the model's limit (the model cannot take more).

Candidates (`postprocess`, per window)
    A token may start or end an answer when it belongs to the context, or holds the CLS token id (the pipeline
    leaves CLS unmasked). Every other logit becomes -10000 and each of the start and end logits goes through a
    softmax over the window (float32). Context first (XLNet), the pipeline masks no token at all (its p_mask is `tok
    != 1 if question_first else 0`: all zeros), so every token of the window is a candidate, and an answer's
    characters are found through the words of sequence 0 (the context). The null score of the window is p_start[0] *
    p_end[0]; then position 0 is zeroed. A span (s, e) scores p_start[s] * p_end[e] when s <= e < s +
    max_answer_len, else 0. The best `top_k * 2 + 10` spans (`top_k` when align_to_words is off) are taken with
    numpy's selection (same ties as the pipeline; only the band of spans that can score is searched where its best
    scores are distinct, which decides them alone), then spans whose start or end is not a candidate token are
    dropped (position 0 always counts as a candidate: a quirk of the pipeline's `np.isin(..., mask.nonzero())` on a
    2-D mask).

Answers
    A span becomes characters of the context: with `align_to_words` the start of the first token's word and the
    end of the last token's word (the word's tokens inside this window), falling back to the tokens' own offsets
    when a token has no word (special tokens); without it, the tokens' offsets. Answers whose text is equal
    ignoring case (across all windows) are merged: the first one keeps its start/end and the scores add up. With
    `handle_impossible_answer` the empty answer {"start": 0, "end": 0, "answer": ""} is added with the smallest
    null score over the windows. All answers are sorted by score (stable) and cut to `top_k`. Spans of score 0
    can be returned when a window has fewer positive spans than were selected, as the pipeline does.

Errors (QaInputError, a ValueError naming the field to change, where the pipeline raised something)
    top_k < 1, max_answer_len < 1, doc_stride > max_seq_len (as the pipeline), an empty question or context
    (as the pipeline). When the pair does not fit in one window: a question that leaves no room for the context,
    and doc_stride >= the room left for the context (the pipeline's tokenizer raised or panicked for both; a
    pair that fits in one window never needs a stride, so there they are no error, as in the pipeline).

Cost (ours: the pipeline had no limits)
    `plan` counts a pair's windows from one untruncated encoding, before any window is built; `prepare_all`
    refuses a request whose windows pass a total (the server's max_qa_windows), or one context that needs more
    windows than the longest context allowed (max_chars_per_input tokens) would at the model's default windows:
    more can only come from parameters that make each window advance a few tokens (the issue's max_seq_len 9:
    one token a window). Merging answers across windows is linear in windows (a dict by folded text).
    A long context is encoded once, not twice (`plan_from_windows`): where its windows advance at least a
    quarter of their length each (so building them costs at most a few times what counting them does) and the
    request's characters, a token each, keep it within max_qa_windows, `prepare_all` builds its windows straight
    away and counts them from what was built; elsewhere it counts first, as above. (A text with more tokens than
    characters may then be refused once its windows are built: at most a few plain encodings' work.)

Where ours differs on purpose
    - The result is always a list (the pipeline returns a bare dict when there is one answer).
    - An explicit max_seq_len above the model's limit is capped (the pipeline would feed the model too much).
    - The CLS id is the id of the special token that starts each window (the pipeline read tokenizer.cls_token_id;
      for BERT, RoBERTa, ALBERT and DistilBERT tokenizers they are the same token).
    - max_question_len must be >= 1 although it has no effect; the pipeline did not check it.
    - When a window has exactly as many spans (tokens squared) as the spans to select, numpy's argpartition
      raised in the pipeline; ours ranks them all.
    - The errors are ValueError where the tokenizer raised an Exception or panicked (pyo3 PanicException).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from itertools import pairwise
from typing import Any

import numpy as np
from tokenizers import Encoding

from bertcore.messages import shown
from bertcore.plain_wordpiece import PlainPairEncoding
from bertcore.rows import Row
from bertcore.tasks.errors import TaskInputError
from bertcore.tokenization import TextTokenizer

DEFAULT_MAX_SEQ_LEN = 384
DEFAULT_MAX_DOC_STRIDE = 128
# A context this many characters a token of max_seq_len or longer likely needs several windows: its windows are
# built straight away where that is safe (`plan_from_windows`); a shorter one's one untruncated encoding is its
# window. English has ~4 characters a WordPiece token: of SQuAD dev's eval half (5,609 questions, MiniLM, 384
# tokens) every one of the 72 contexts in several windows has 4 x 384 characters or more, as have 53 in one window
# (they pay the question's encoding for nothing); at 3 characters a token, 454 would. Text of fewer characters a
# token (CJK) is counted first, then cut: encoded twice, as before.
WINDOWS_FIRST_CHARS_PER_TOKEN = 4
# Windows are built before they are counted only where each advances at least 1/this of its length.
MAX_WINDOW_OVERLAP = 4
MASKED_LOGIT = np.float32(-10000.0)
CONTEXT_SEQUENCE = 1  # question first, context second (context first: 0)


class QaInputError(TaskInputError):
    """Input QA cannot take; the field is always named: a parameter ("max_seq_len", "doc_stride") or a part of the
    input ("question", "context")."""

    def __init__(self, message: str, field: str) -> None:
        super().__init__(message, field)


# Bounds of a request's parameters, whichever protocol carries them (`request_params`; the native schemas say the
# same): a longest answer past a window's length finds nothing more, and 100 answers a question is a listing
MAX_TOP_K = 100
MAX_ANSWER_LEN = 512
MIN_SEQ_LEN = 8  # room for the special tokens, a question token and a context token


@dataclass(frozen=True)
class QaParams:
    """Request parameters, with transformers 4.57's defaults. None for max_seq_len / doc_stride: derived."""

    top_k: int = 1
    max_answer_len: int = 15
    doc_stride: int | None = None  # None: min(max_seq_len // 2, 128)
    max_seq_len: int | None = None  # None: min(model limit, 384)
    max_question_len: int = 64  # accepted and validated, but has no effect (as in 4.57 with fast tokenizers)
    handle_impossible_answer: bool = False
    align_to_words: bool = True

    def __post_init__(self) -> None:
        _check_int("top_k", self.top_k, minimum=1)
        _check_int("max_answer_len", self.max_answer_len, minimum=1)
        _check_int("max_question_len", self.max_question_len, minimum=1)
        if self.max_seq_len is not None:
            _check_int("max_seq_len", self.max_seq_len, minimum=1)
        if self.doc_stride is not None:
            _check_int("doc_stride", self.doc_stride, minimum=0)
        for name in ("handle_impossible_answer", "align_to_words"):
            if not isinstance(getattr(self, name), bool):
                raise QaInputError(f"{name} must be true or false (got {shown(getattr(self, name))})", field=name)
        if self.max_seq_len is not None and self.doc_stride is not None:
            _check_stride(self.doc_stride, self.max_seq_len)

    def window(self, model_max_length: int) -> tuple[int, int]:
        """(max_seq_len, doc_stride) for a model that takes at most `model_max_length` tokens."""
        _check_int("model_max_length", model_max_length, minimum=1)
        requested = DEFAULT_MAX_SEQ_LEN if self.max_seq_len is None else self.max_seq_len
        max_seq_len = min(requested, model_max_length)
        doc_stride = min(max_seq_len // 2, DEFAULT_MAX_DOC_STRIDE) if self.doc_stride is None else self.doc_stride
        asked = self.max_seq_len is not None and requested > max_seq_len
        capped = f"{max_seq_len}: the model's limit, {requested} asked" if asked else None
        _check_stride(doc_stride, max_seq_len, capped)
        return max_seq_len, doc_stride

    @property
    def candidates_per_window(self) -> int:
        """Spans taken from each window before spans outside the context are dropped (the pipeline's pre_topk)."""
        return self.top_k * 2 + 10 if self.align_to_words else self.top_k


def request_params(options: dict[str, Any]) -> QaParams:
    """A request's parameters, within what a request may ask: QaParams itself takes any size (the algorithms are
    checked on answers of 1,000 tokens), a request no more than the native schema allows, on every protocol."""
    params = QaParams(**options)
    _check_int("top_k", params.top_k, minimum=1, maximum=MAX_TOP_K)
    _check_int("max_answer_len", params.max_answer_len, minimum=1, maximum=MAX_ANSWER_LEN)
    if params.max_seq_len is not None:
        _check_int("max_seq_len", params.max_seq_len, minimum=MIN_SEQ_LEN)
    return params


def _check_int(name: str, value: Any, minimum: int, maximum: int | None = None) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise QaInputError(f"{name} must be an integer (got {shown(value)})", field=name)
    if value < minimum:
        raise QaInputError(f"{name} must be >= {minimum} (got {shown(value)})", field=name)
    if maximum is not None and value > maximum:
        raise QaInputError(f"{name} must be <= {maximum} (got {shown(value)})", field=name)


def _check_stride(doc_stride: int, max_seq_len: int, said: str | None = None) -> None:
    """`said`: how max_seq_len reads in the message where it is not the request's own value (capped)."""
    if doc_stride > max_seq_len:
        message = f"doc_stride ({doc_stride}) is larger than max_seq_len ({said or max_seq_len})"
        raise QaInputError(message, field="doc_stride")


@dataclass(frozen=True)
class WindowPlan:
    """How question + context will be cut into windows, known from one untruncated encoding, before any window
    is built: what a request will cost can be checked first."""

    max_seq_len: int
    doc_stride: int
    fixed: int  # question tokens and special tokens: in every window besides the context
    context_tokens: int
    windows: int
    # The windows, where they were built already: the untruncated pair when it fits in one window, or a long
    # context's windows (`plan_from_windows`); None where `prepare` builds them.
    encodings: Sequence[Encoding | PlainPairEncoding] | None

    def windows_at(self, max_seq_len: int, doc_stride: int) -> int | None:
        """Windows the same pair needs at another max_seq_len and doc_stride; None where it cannot be cut."""
        return _window_count(self.fixed, self.context_tokens, max_seq_len, doc_stride)


@dataclass(frozen=True)
class QaFeatures:
    """One input row per window, and what post-processing needs of each window."""

    rows: list[Row]
    encodings: Sequence[Encoding | PlainPairEncoding]  # the tokenizer's windows: words and character offsets
    candidates: list[np.ndarray]  # bool per token: may start or end an answer (context tokens and CLS)
    max_seq_len: int
    doc_stride: int
    context_sequence: int = CONTEXT_SEQUENCE  # the context's sequence index in each window (0: context first)


def plan(tokenizer: TextTokenizer, question: str, context: str, params: QaParams, model_max_length: int) -> WindowPlan:
    """Count the windows question + context needs, from one untruncated encoding (the context tokenized once).

    The count is the tokenizer's own (its truncation with overflow, `only_second`): the context takes
    room = max_seq_len - fixed tokens of each window and the next window starts room - doc_stride tokens later,
    so n tokens need 1 + ceil((n - room) / (room - doc_stride)) windows. Raises QaInputError where the pair does
    not fit in one window and cannot be cut into windows."""
    _check_texts(question, context)
    max_seq_len, doc_stride = params.window(model_max_length)
    whole = _encode(tokenizer, question, context)[0]
    context_tokens = whole.sequence_ids.count(_context_sequence(tokenizer))
    fixed = len(whole) - context_tokens
    windows = _window_count(fixed, context_tokens, max_seq_len, doc_stride)
    if windows is None:
        # The tokenizer could not make windows (it raises or panics), which is fine only if none is needed.
        raise QaInputError(
            _no_windows_message(fixed, max_seq_len, doc_stride), _no_windows_field(fixed, max_seq_len, params)
        )
    return WindowPlan(max_seq_len, doc_stride, fixed, context_tokens, windows, [whole] if windows == 1 else None)


def plan_from_windows(
    tokenizer: TextTokenizer, question: str, context: str, params: QaParams, model_max_length: int
) -> WindowPlan | None:
    """The plan `plan` makes, from the pair's windows built straight away: a long context encoded once (with
    truncation into windows) rather than twice (untruncated to count its windows, then into them). None, and
    nothing built, where the context is short (its one untruncated encoding is its window: `plan` costs no more)
    or where its windows would advance less than 1/MAX_WINDOW_OVERLAP of their length each (building them before
    counting them could cost many times a plain encoding: `plan` counts first). Raises what `plan` raises for an
    empty question or context."""
    max_seq_len, doc_stride = params.window(model_max_length)
    if not isinstance(context, str) or len(context) < WINDOWS_FIRST_CHARS_PER_TOKEN * max_seq_len:
        return None  # `plan` checks it
    _check_texts(question, context)
    # The question's tokens and the special tokens: in every window (the question is encoded alone, as in a pair)
    fixed = len(tokenizer.encode(question, add_special_tokens=False)[0]) + tokenizer.num_special_tokens(pair=True)
    if (max_seq_len - fixed - doc_stride) * MAX_WINDOW_OVERLAP < max_seq_len:
        return None
    encodings = _encode(tokenizer, question, context, max_length=max_seq_len, stride=doc_stride)
    sequence = _context_sequence(tokenizer)
    in_window = [encoding.sequence_ids.count(sequence) for encoding in encodings]
    fixed = len(encodings[0]) - in_window[0]
    # Each window after the first repeats `doc_stride` context tokens of the one before it.
    context_tokens = in_window[0] + sum(tokens - doc_stride for tokens in in_window[1:])
    if _window_count(fixed, context_tokens, max_seq_len, doc_stride) != len(encodings):
        return None  # not the tokenizer's windows as `plan` counts them (never seen): count them as `plan` does
    return WindowPlan(max_seq_len, doc_stride, fixed, context_tokens, len(encodings), encodings)


def _check_texts(question: str, context: str) -> None:
    for name, text in (("question", question), ("context", context)):
        if not isinstance(text, str) or not text:
            raise QaInputError(f"{name} must be a non-empty string", field=name)


def too_many_windows(plans: list[WindowPlan], params: QaParams, model_max_length: int, limit: int) -> QaInputError:
    """The error for a request whose inputs (`plans`, counted so far) need more than `limit` windows. It names
    the parameter the client set whose default would have made them fit (doc_stride first), else the inputs."""
    windows, last = sum(counted.windows for counted in plans), plans[-1]
    field = _parameter_to_change(plans, params, model_max_length, limit) or "inputs"
    message = (
        f"this request needs at least {windows} windows of max_seq_len {last.max_seq_len} tokens; the limit is "
        f"{limit} (max_qa_windows). Input {len(plans) - 1}: {_windows_of(last)}"
    )
    return QaInputError(f"{message}: {_advice(field, 'send fewer or shorter contexts')}", field)


def amplified(
    window_plan: WindowPlan, index: int, params: QaParams, model_max_length: int, max_context_tokens: int
) -> QaInputError | None:
    """The error for a context that needs more windows than the longest context allowed (`max_context_tokens`
    tokens) needs at the model's default windows with the same question: only parameters that multiply the work
    (windows advancing a few tokens each) get there. None where it does not."""
    default_seq_len, default_stride = QaParams().window(model_max_length)
    bound = _window_count(window_plan.fixed, max_context_tokens, default_seq_len, default_stride)
    if bound is None or window_plan.windows <= bound:
        return None
    field = _parameter_to_change([window_plan], params, model_max_length, bound) or f"inputs.{index}.context"
    message = (
        f"input {index} needs {window_plan.windows} windows of max_seq_len {window_plan.max_seq_len} tokens: "
        f"{_windows_of(window_plan)}; a context may need at most {bound}, what the longest context allowed "
        f"({max_context_tokens} tokens) needs at this model's default windows ({default_seq_len} tokens, doc_stride "
        f"{default_stride})"
    )
    return QaInputError(f"{message}: {_advice(field, 'send a shorter context')}", field)


def _windows_of(window_plan: WindowPlan) -> str:
    advance = window_plan.max_seq_len - window_plan.fixed - window_plan.doc_stride
    return (
        f"{window_plan.context_tokens} context tokens in {window_plan.windows} windows, each advancing {advance} "
        f"tokens (max_seq_len minus {window_plan.fixed} for the question and special tokens minus doc_stride "
        f"{window_plan.doc_stride})"
    )


def _advice(field: str, otherwise: str) -> str:
    return {"doc_stride": "lower doc_stride", "max_seq_len": "raise max_seq_len"}.get(field, otherwise)


def _parameter_to_change(plans: list[WindowPlan], params: QaParams, model_max_length: int, limit: int) -> str | None:
    """The parameter the client set whose default would bring `plans` within `limit` windows (doc_stride first,
    the other as given), None if neither."""
    default_seq_len, default_stride = QaParams().window(model_max_length)
    reverted = {
        "doc_stride": QaParams(max_seq_len=params.max_seq_len).window(model_max_length),
        "max_seq_len": (default_seq_len, params.doc_stride if params.doc_stride is not None else default_stride),
    }
    for name, (max_seq_len, doc_stride) in reverted.items():
        counts = [counted.windows_at(max_seq_len, doc_stride) for counted in plans]
        if getattr(params, name) is not None and None not in counts and sum(filter(None, counts)) <= limit:
            return name
    return None


def prepare_all(
    tokenizer: TextTokenizer,
    pairs: list[tuple[str, str]],
    params: QaParams,
    model_max_length: int,
    max_windows: int,
    max_context_tokens: int | None = None,
) -> list[QaFeatures]:
    """Every (question, context) pair's windows, for one request. The windows are counted first (`plan`: one
    untruncated encoding per pair) and the request is refused, before any window is built, as soon as they pass
    `max_windows`, or one context needs more than the longest context allowed (`max_context_tokens`) would at
    the default windows (`amplified`). Errors name the request's field: inputs.I.question, inputs.I.context,
    max_seq_len, doc_stride, inputs. Except where the request's characters, a token each, keep it within
    `max_windows`: there a long context is encoded once, straight into its windows, and the same checks count
    what was built (`plan_from_windows`)."""
    plans: list[WindowPlan] = []
    windows = 0
    windows_first = _fits_by_characters(tokenizer, pairs, params, model_max_length, max_windows)
    for index, (question, context) in enumerate(pairs):
        try:
            built = plan_from_windows(tokenizer, question, context, params, model_max_length) if windows_first else None
            plans.append(built or plan(tokenizer, question, context, params, model_max_length))
        except QaInputError as exc:
            if exc.field in ("question", "context"):
                raise QaInputError(str(exc), field=f"inputs.{index}.{exc.field}") from exc
            raise
        if max_context_tokens is not None:
            error = amplified(plans[-1], index, params, model_max_length, max_context_tokens)
            if error is not None:
                raise error
        windows += plans[-1].windows
        if windows > max_windows:
            raise too_many_windows(plans, params, model_max_length, max_windows)
    return [
        prepare(tokenizer, question, context, params, model_max_length, window_plan)
        for (question, context), window_plan in zip(pairs, plans, strict=True)
    ]


def _fits_by_characters(
    tokenizer: TextTokenizer, pairs: list[tuple[str, str]], params: QaParams, model_max_length: int, limit: int
) -> bool:
    """Whether the pairs' windows, counting a token a character (more than English text has), stay within
    `limit`: a request that may pass it has its windows counted before any is built."""
    max_seq_len, doc_stride = params.window(model_max_length)
    special = tokenizer.num_special_tokens(pair=True)
    windows = 0
    for question, context in pairs:
        if not isinstance(question, str) or not isinstance(context, str):
            return False
        counted = _window_count(len(question) + special, len(context), max_seq_len, doc_stride)
        if counted is None:
            return False
        windows += counted
    return windows <= limit


def _window_count(fixed: int, context_tokens: int, max_seq_len: int, doc_stride: int) -> int | None:
    if fixed + context_tokens <= max_seq_len:
        return 1
    room = max_seq_len - fixed
    if room < 1 or doc_stride >= room:
        return None
    return 1 + -(-(context_tokens - room) // (room - doc_stride))


def prepare(
    tokenizer: TextTokenizer,
    question: str,
    context: str,
    params: QaParams,
    model_max_length: int,
    window_plan: WindowPlan | None = None,
) -> QaFeatures:
    """Tokenize question + context into windows of at most max_seq_len tokens (capped at model_max_length).

    `window_plan`: this pair's plan (`plan`), where it was made already to check the cost. Without it a long
    context is encoded once, into its windows, where that is safe (`plan_from_windows`)."""
    window_plan = (
        window_plan
        or plan_from_windows(tokenizer, question, context, params, model_max_length)
        or plan(tokenizer, question, context, params, model_max_length)
    )
    max_seq_len, doc_stride = window_plan.max_seq_len, window_plan.doc_stride
    if window_plan.encodings is not None:
        encodings = window_plan.encodings
    else:
        encodings = _encode(tokenizer, question, context, max_length=max_seq_len, stride=doc_stride)
    rows = [Row.from_encoding(encoding) for encoding in encodings]
    every_token = context_first(tokenizer)
    return QaFeatures(
        rows=rows,
        encodings=encodings,
        candidates=[
            _candidate_tokens(encoding, every_token, row.input_ids)
            for encoding, row in zip(encodings, rows, strict=True)
        ],
        max_seq_len=max_seq_len,
        doc_stride=doc_stride,
        context_sequence=_context_sequence(tokenizer),
    )


def _no_windows_field(fixed: int, max_seq_len: int, params: QaParams) -> str:
    """The field to change: the parameter the client set that leaves too little room, else the question."""
    if max_seq_len - fixed >= 1 and params.doc_stride is not None:  # room enough, but the stride is too large
        return "doc_stride"
    return "max_seq_len" if params.max_seq_len is not None else "question"


def _no_windows_message(fixed: int, max_seq_len: int, doc_stride: int) -> str:
    """Why question + context cannot be cut into windows: each holds the question, and the context must advance."""
    room = max_seq_len - fixed
    if room < 1:
        return (
            f"the question takes {fixed} tokens with the special tokens, which leaves no room for the context "
            f"in max_seq_len={max_seq_len}: shorten the question or raise max_seq_len"
        )
    return (
        f"doc_stride ({doc_stride}) must be smaller than the room left for the context in each window "
        f"({room} tokens: max_seq_len {max_seq_len} minus {fixed} for the question and special tokens)"
    )


def context_first(tokenizer: TextTokenizer) -> bool:
    """The pipeline's order for a tokenizer that pads on the left (XLNet): context, then question."""
    return tokenizer.padding_side == "left"


def _context_sequence(tokenizer: TextTokenizer) -> int:
    return 0 if context_first(tokenizer) else CONTEXT_SEQUENCE


def _encode(
    tokenizer: TextTokenizer, question: str, context: str, max_length: int | None = None, stride: int = 0
) -> Sequence[Encoding | PlainPairEncoding]:
    """The pair in the pipeline's order, the context truncated into windows (with `max_length`)."""
    if context_first(tokenizer):
        return tokenizer.encode(context, question, max_length=max_length, stride=stride, strategy="only_first")
    return tokenizer.encode_pair_windows(question, context, max_length, stride)


def _candidate_tokens(
    encoding: Encoding | PlainPairEncoding, every_token: bool = False, ids: np.ndarray | None = None
) -> np.ndarray:
    """Context tokens, and every token holding the CLS id (the special token the template puts first); every
    token where the context comes first (the pipeline's p_mask is all zeros there). `ids`: the encoding's ids as an
    array, where made already (its row's).

    The context's tokens are one run in a pair's encoding (the template puts the second sequence in one piece):
    marked as a slice, found from the sequence ids' first and last context token; a list of sequence ids where they
    are not one run is read token by token."""
    length = len(encoding)
    if every_token:
        return np.ones(length, dtype=bool)
    sequences = encoding.sequence_ids  # a new list at each access; None for special tokens
    candidates = np.zeros(length, dtype=bool)
    inside = sequences.count(CONTEXT_SEQUENCE)
    if inside:
        first = sequences.index(CONTEXT_SEQUENCE)
        if sequences[first : first + inside].count(CONTEXT_SEQUENCE) == inside:
            candidates[first : first + inside] = True
        else:
            candidates = np.array([sequence == CONTEXT_SEQUENCE for sequence in sequences], dtype=bool)
    if length and encoding.special_tokens_mask[0] == 1:
        ids = np.asarray(encoding.ids) if ids is None else ids
        candidates |= ids == ids[0]
    return candidates


@dataclass
class _Answer:
    score: float
    start: int
    end: int
    answer: str

    def as_dict(self) -> dict[str, Any]:
        return {"score": self.score, "start": self.start, "end": self.end, "answer": self.answer}


@dataclass
class _Collector:
    """Answers from all windows so far: equal texts (ignoring case) merge and add their scores.

    Found by their folded text in a dict: one lookup per span, so the merge is linear in windows (a scan of the
    answers so far made it quadratic: 10 s for one 20,000-character context in 3,900 windows)."""

    answers: list[_Answer] = field(default_factory=list)  # in order of first appearance
    by_text: dict[str, _Answer] = field(default_factory=dict)  # folded text -> its answer in `answers`
    null_score: float = 1_000_000.0  # the pipeline's starting value: smallest null score over windows

    def add(self, score: float, start: int, end: int, context: str) -> None:
        text = context[start:end]
        folded = text.lower()
        known = self.by_text.get(folded)
        if known is not None:
            known.score += score
            return
        answer = _Answer(score, start, end, text)
        self.by_text[folded] = answer
        self.answers.append(answer)


def postprocess(
    question: str,
    context: str,
    features: QaFeatures,
    start_logits: list[np.ndarray],
    end_logits: list[np.ndarray],
    params: QaParams,
) -> list[dict[str, Any]]:
    """Answers {"score", "start", "end", "answer"} best first, at most top_k (a list even when top_k == 1)."""
    del question  # the answer comes from the context only
    windows = len(features.rows)
    if len(start_logits) != windows or len(end_logits) != windows:
        raise ValueError(f"expected logits for {windows} windows, got {len(start_logits)} and {len(end_logits)}")
    collector = _Collector()
    for index in range(windows):
        _collect_window(collector, context, features, index, start_logits[index], end_logits[index], params)
    answers = list(collector.answers)
    if params.handle_impossible_answer:
        answers.append(_Answer(collector.null_score, 0, 0, ""))
    ranked = sorted(answers, key=lambda answer: answer.score, reverse=True)[: params.top_k]
    return [answer.as_dict() for answer in ranked]


def _collect_window(
    collector: _Collector,
    context: str,
    features: QaFeatures,
    index: int,
    start_logits: np.ndarray,
    end_logits: np.ndarray,
    params: QaParams,
) -> None:
    candidates = features.candidates[index]
    length = len(candidates)
    for name, logits in (("start", start_logits), ("end", end_logits)):
        if np.shape(logits) != (length,):
            raise ValueError(f"window {index}: {name} logits have shape {np.shape(logits)}, expected ({length},)")
    p_start, p_end = _masked_softmax(np.array((start_logits, end_logits), dtype=np.float32), candidates)
    collector.null_score = min(collector.null_score, float(p_start[0] * p_end[0]))
    p_start[0] = p_end[0] = 0.0
    chars = _CharSpans(features.encodings[index], params.align_to_words, features.context_sequence)
    for start, end, score in _best_spans(p_start, p_end, candidates, params):
        char_start, char_end = chars.span(start, end)
        collector.add(score, char_start, char_end, context)


def _masked_softmax(logits: np.ndarray, candidates: np.ndarray) -> np.ndarray:
    """Softmax over the window in float32, non-candidate tokens at logit -10000; of each row where `logits` has
    several (the same floats, bit for bit, as one row at a time). The ufuncs are called directly, in place: the
    array methods' Python wrappers and the temporaries were a third of its time, for the same floats."""
    values = np.where(candidates, np.asarray(logits, dtype=np.float32), MASKED_LOGIT)
    np.subtract(values, np.maximum.reduce(values, axis=-1, keepdims=True), out=values)
    np.exp(values, out=values)
    np.divide(values, np.add.reduce(values, axis=-1, keepdims=True), out=values)
    return values


def _best_spans(
    p_start: np.ndarray, p_end: np.ndarray, candidates: np.ndarray, params: QaParams
) -> list[tuple[int, int, float]]:
    """(start token, end token, score), best first: the top spans, then those inside candidate tokens.

    The spans that can score are the band s <= e < s + max_answer_len, max_answer_len per token (15 by default)
    of the window's length x length spans: where the band alone decides the top spans (`_top_in_band`) only it is
    scored, else the whole matrix is, as the pipeline scores it."""
    length = len(p_start)
    count = params.candidates_per_window
    found = _top_in_band(p_start, p_end, params.max_answer_len, count)
    if found is None:
        scores = np.outer(p_start, p_end)  # float32, scores[s, e]
        offsets = np.arange(length)[None, :] - np.arange(length)[:, None]  # e - s
        scores[(offsets < 0) | (offsets >= params.max_answer_len)] = 0.0
        flat = scores.ravel()
        order = _top_indices(flat, count)
        found = np.divmod(order, length), flat[order]
    (starts, ends), chosen = found
    allowed = candidates.tolist()
    allowed[0] = True  # the pipeline always counts position 0 as a candidate
    return [
        (start, end, score)
        for start, end, score in zip(starts.tolist(), ends.tolist(), chosen.tolist(), strict=True)
        if allowed[start] and allowed[end]
    ]


def _top_in_band(
    p_start: np.ndarray, p_end: np.ndarray, max_answer_len: int, count: int
) -> tuple[tuple[np.ndarray, np.ndarray], np.ndarray] | None:
    """The `count` best spans' (starts, ends), best first, and their scores, from the band of spans
    0 <= end - start < max_answer_len alone; None where the band cannot decide them alone.

    Every span outside the band scores 0 in the pipeline's matrix, and each score in it is the same float32
    product p_start[s] * p_end[e]. So where the band's `count` best scores are above 0 and its `count + 1` best
    are all different, they are the matrix's `count` best, in the one order any selection gives them: numpy's
    choice among equal scores, the pipeline's, never comes into it. Otherwise (ties, fewer spans that score, a
    tiny window) None, and the whole matrix goes through `_top_indices`, as the pipeline's does."""
    length = len(p_start)
    width = min(max_answer_len, length)
    if count + 1 > length * width:
        return None
    padded_end = np.zeros(length + width - 1, dtype=p_end.dtype)
    padded_end[:length] = p_end
    step = padded_end.strides[0]  # row s of the view: p_end[s], ..., p_end[s + width - 1] (zeros past the end)
    ends_from = np.ndarray((length, width), padded_end.dtype, padded_end, 0, (step, step))  # a view, no copy
    rows = p_start[:, None] * ends_from
    band = rows.ravel()  # band[s * width + d]: the span (s, s + d)
    chosen = _best_of_band(p_start, rows, count + 1)
    scores = band[chosen]
    best = scores.tolist()
    if not best[count - 1] > 0 or not all(higher > lower for higher, lower in pairwise(best)):
        return None
    starts, widths = np.divmod(chosen[:count], width)
    return (starts, starts + widths), scores[:count]


# A band of up to this many spans is searched whole for its best (one selection over it); a larger one (long
# windows with a long max_answer_len) first through the rows of its likeliest starts (`_best_of_band`)
WHOLE_BAND_SPANS = 16_384


def _best_of_band(p_start: np.ndarray, rows: np.ndarray, count: int) -> np.ndarray:
    """Indices in the band (`rows` raveled: row s holds the spans starting at token s) of `count` of its highest
    scores, best first: where those are distinct and above the next, exactly the `count` highest (`_top_in_band`
    asks for one more than it takes, so the ones it takes are). A band of thousands of spans (the
    default max_answer_len's) is searched whole: one selection costs less than the numpy calls that would narrow
    it. In a larger one only the scores at least as high as the `count`-th best in the rows of the `count`
    likeliest starts are sorted: those rows hold `count` scores that high, so the band's `count` highest are among
    them, and they are a few dozen of the band's tens of thousands."""
    band = rows.ravel()
    if band.size > WHOLE_BAND_SPANS and len(rows) > count:
        likeliest = np.argpartition(p_start, len(p_start) - count)[len(p_start) - count :]
        sample = rows[likeliest].ravel()
        floor = np.partition(sample, len(sample) - count)[len(sample) - count]
        if floor > 0:  # else (most of the band scores 0) no fewer to sort: select over the whole band
            above = np.flatnonzero(band >= floor)
            return above[np.argsort(-band[above])[:count]]
    chosen = np.argpartition(band, band.size - count)[band.size - count :]
    return chosen[np.argsort(-band[chosen])]


def _top_indices(flat: np.ndarray, count: int) -> np.ndarray:
    """Indices of the `count` largest scores, best first, with numpy's selection so that ties fall the same way."""
    negated = -flat
    if count == 1:
        return np.array([np.argmax(flat)])
    if len(flat) <= count:
        return np.argsort(negated)
    chosen = np.argpartition(negated, count)[:count]
    return chosen[np.argsort(negated[chosen])]


class _CharSpans:
    """A window's spans of tokens as characters of the context (`span`): with `align_to_words` the start of the
    first token's word to the end of the last token's word where both tokens have one, else the tokens' own
    offsets. A window's best spans share a few tokens, so each token's word is looked up once."""

    __slots__ = ("_align", "_encoding", "_offsets", "_sequence", "_words")

    def __init__(
        self, encoding: Encoding | PlainPairEncoding, align_to_words: bool, sequence: int = CONTEXT_SEQUENCE
    ) -> None:
        self._encoding = encoding
        self._align = align_to_words
        self._sequence = sequence
        self._words: dict[int, tuple[int, int] | None] = {}  # token -> its word's characters (None: no word)
        self._offsets: list[tuple[int, int]] | None = None  # the encoding's, fetched where first needed

    def span(self, start: int, end: int) -> tuple[int, int]:
        if self._align:
            first, last = self._word_chars(start), self._word_chars(end)
            if first is not None and last is not None:
                return first[0], last[1]
        offsets = self._offsets
        if offsets is None:
            offsets = self._offsets = self._encoding.offsets  # a new list at each access
        return offsets[start][0], offsets[end][1]

    def _word_chars(self, token: int) -> tuple[int, int] | None:
        words = self._words
        if token in words:
            return words[token]
        word = self._encoding.token_to_word(token)
        chars = None if word is None else self._encoding.word_to_chars(word, self._sequence)
        words[token] = chars
        return chars
