"""Admission by time: refuse new work (429) once the work already admitted would take longer than a bound.

A queue bounded by a count (rows, requests) holds more or less time depending on the model, the request and the
machine: 2,048 rows of MiniLM on 2 cores were 20 s, as long as the whole request deadline; 32 requests of a long QA
context (3 windows of 384 tokens each) were 4 s where 32 single sentences were 50 ms. Bounded in time, a request
is either answered within about the bound or refused at once, where the client can retry elsewhere.

`AdmissionGate` is the front door of each front-end process. It counts work in tokens: by Little's law, the tokens
in flight / the tokens per second the server has been finishing is the time a new request should expect to spend.
At the door, before the body is read, a request's tokens are estimated from its size (`estimate_tokens`); once it
is tokenized it is charged what it really is (`Admission.charge`: every row, every window). It knows nothing of
HTTP. The batcher bounds its own queue in time the same way, from its measured cost per token
(service.engine.batcher).

Little's law gives the mean; the promise is about the slowest. How far the slowest lie from the mean depends on the
request shape and the process layout (long NER texts in process mode, on 2 cores, took 2.4x their median: their
front-end work competes with the engine for the cores), and the floor admits one batch of tokens whatever the rate,
which on a slow model is more than the bound. So the gate also checks what admitted requests really took: an
answer later than 70% of the bound, or a request at work that long already, shrinks what the gate admits
(`scale`), in proportion; answers well within it let it grow back, a tenth a second.

A gate that admits a request only where its own tokens fit would, under overload of mixed sizes, let the small
requests take every gap as it opens and refuse the large ones nearly always (measured: one sentence a request beside
long QA contexts at 3x capacity, 75% of the sentences answered and 1.5% of the questions). So a refused request holds
its room for a while (`claim`): until a request of its size (at least half its tokens) is admitted, or the bound's
time has passed, smaller ones are admitted only where they fit beside it. The bound on the work admitted is as
before; which request gets the next gap no longer depends on its size.

The door counts every model's tokens alike, and one rate for all. But the engine runs each model's batches on
streams of its own, and the cores (or the GPU) are shared between the models at work by the operating system, not in
proportion to what the door admitted for each: measured on 2 cores, one sentence a request to MiniLM beside one to a
model of 4x its cost per token, both at 1.5x their own capacity, the larger model's answers took 0.72 s at the median
and 2.26 s at p99 (the bound plus its own time: 2.03 s) where MiniLM's took 0.11 s. So each model also has a gate of
its own (`ModelGates`), the same kind: a request is admitted against its model's own finishing rate and its own
answers' times too, or it gets 429 naming the model; a model whose answers are late admits less of its own work,
not less of the others' (the door's gate counts every model's tokens, but leaves the answers' times to the models'
gates). Where the request names its model before its body (a path, a gRPC call), the `Door`
asks both gates at once, and the request's time counts from there to its answer; where it names it in its body
(OpenAI's embeddings, Cohere's rerank), the pipeline asks the model's gate once the request is tokenized, and its
time counts from the door all the same (`Ticket.admitted_at`) to the engine's answer.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections import deque
from collections.abc import Callable, Iterable

from service import tracing
from service.errors import Overloaded

SCOPE_ADMISSION = "bertserve.admission"  # where an admitted request's Passage rides in the ASGI scope
TAIL_FACTOR = 0.4  # the mean wait aimed at, as a share of the bound (see AdmissionGate.limit)
# A request body's bytes per token, for the estimate at the door: English WordPiece and BPE give ~4 characters a
# token (measured: SST-2 sentences 4.3, SQuAD contexts 4.6 with MiniLM's vocabulary), JSON adds a few bytes a
# request. The estimate is replaced by the real count as soon as the request is tokenized.
BYTES_PER_TOKEN = 4.0
MIN_ESTIMATE = 8.0  # the least a request is taken to cost at the door (special tokens, a short text)
# The feedback from answers' times (AdmissionGate.scale): a request admitted after the last cut that took longer than
# LATE x the bound cuts the scale to aim its like at CUT_AIM of the bound (at most halving it at once, never below
# MIN_SCALE); a second whose slowest answer took under GROW_BELOW of the bound, or with nothing in flight, grows it by
# GROWTH, up to 1. The margin under the bound is for what the gate does not see: the time before a request reaches
# it (the listen backlog, a busy event loop) and after its answer leaves.
LATE = 0.7
CUT_AIM = 0.5
MAX_CUT = 0.5
MIN_SCALE = 0.05
GROW_BELOW = 0.4
GROWTH = 1.1
# A refused request's claim (AdmissionGate.claim) is met by the next admitted request of at least this share of its
# tokens: requests of one shape vary in size (one sentence is 8 tokens, the next 60), and any of them may take it.
CLAIM_SHARE = 0.5


def estimate_tokens(body_bytes: int | None, recent_mean: float) -> float:
    """A request's tokens before its body is read: from its declared size, or, without one (a chunked body), the
    mean of recent requests."""
    if body_bytes is None:
        return max(MIN_ESTIMATE, recent_mean)
    return max(MIN_ESTIMATE, body_bytes / BYTES_PER_TOKEN)


class Admission:
    """One admitted request's share of the gate: its work in tokens, estimated at the door, charged once known."""

    def __init__(self, gate: AdmissionGate, tokens: float, admitted_at: float) -> None:
        self._gate = gate
        self.tokens = tokens
        self.admitted_at = admitted_at
        self.charged = False
        self._left = False

    def charge(self, tokens: int) -> None:
        """The request's real work, once tokenized: every row it sends to the engine."""
        if self._left:
            return
        self._gate.tokens_in_flight += tokens - self.tokens
        if not self.charged and self._gate.timed:
            self._gate.working[id(self)] = self.admitted_at
        self.tokens, self.charged = float(tokens), True

    def leave(self, completed: bool) -> None:
        """The request is over; `completed`: it was answered (its work counts in the rate)."""
        if not self._left:
            self._left = True
            self._gate.leave(self.tokens, completed and self.charged)
            if self.charged and self._gate.timed:  # it did its work: how long it took says how much may be admitted
                self._gate.working.pop(id(self), None)
                self._gate.took(self._gate.clock() - self.admitted_at, self.admitted_at)


class AdmissionGate:
    """Admit while tokens in flight / recent tokens finished a second <= 0.4 x `max_queue_s`, or within the floor: up
    to `cold_requests` requests and `floor_tokens` tokens in flight; both times `scale`, the share that the answers'
    own times leave (`took`).

    The rate is the mean of the last `history` whole seconds: under overload, what the server can do (a mean, not the
    best second: an overestimate would admit more than the bound holds). A model and request shape that finish few
    tokens a second get few in flight beyond the floor. A request is always admitted while nothing is in flight: it
    cannot be answered sooner by waiting."""

    def __init__(
        self,
        max_queue_s: float,
        floor_tokens: int,
        cold_requests: int = 1,
        history: int = 3,
        clock: Callable[[], float] = time.monotonic,
        on_scale: Callable[[float], None] = lambda scale: None,
        subject: str = "the server",
        idle: bool = False,
    ) -> None:
        self.subject = subject  # what is at capacity, in the 429's message: the server, or a model (`ModelGates`)
        self.max_queue_s = max_queue_s
        self.floor_tokens = floor_tokens
        self.cold_requests = cold_requests
        self.in_flight = 0  # requests
        self.tokens_in_flight = 0.0
        self.mean_request_tokens = MIN_ESTIMATE  # of recent completed requests (an exponential mean)
        self.scale = 1.0  # the share of the limit and the floor admitted now (`took`)
        # Whether its admitted requests' times cut its scale (`took`): not the door's, whose every request that does
        # work meets its model's gate, which judges its time (`Door`).
        self.timed = True
        self.on_scale = on_scale  # told each new scale (the metric bertserve_admission_share)
        self.clock = clock
        self._cut_at = -math.inf  # when the scale was last cut
        self._slowest = 0.0  # the longest time an answer admitted since the cut took, in the current second
        self._had_work = False  # whether any request was in flight in the current second
        # charged requests in flight (tokenized: their work is in the engine) -> when each was admitted, oldest first
        self.working: dict[int, float] = {}
        # Tokens held for the largest request refused lately (0: none), until a request of its size is admitted or
        # `_claim_until` passes: smaller requests are admitted only where they fit beside it.
        self.claim = 0.0
        self._claim_until = -math.inf
        self._refused_beside_claim = False  # the last refusal was of a request that fitted but for the claim
        self._refused_needing = 0.0  # the tokens the last refused request needed room for (its own, and a claim's)
        self._second = math.floor(clock())
        self._current = 0.0  # tokens finished in the current second
        # Tokens finished in each of the last whole seconds. A gate made `idle` starts as after `history` seconds that
        # finished nothing, where the rate counts as unknown (the floor admits), as a front-end's gate, made seconds
        # before its first request, does: a model's gate may be made at the model's first request, and one answer in its
        # first second is not a rate (a long request's tokens in that second would stand for all it can do).
        self._past: deque[float] = deque([0.0] * history if idle else [], maxlen=history)
        # The time with work in flight, in the current second (`_busy`, counted up to `_busy_mark`) and in each of the
        # last whole seconds: whether the rate was measured under load (`_rate_measured`).
        self._busy = 0.0
        self._busy_mark = clock()
        self._busy_past: deque[float] = deque([0.0] * history if idle else [], maxlen=history)

    def rate(self) -> float:
        """Tokens finished a second over the last whole seconds (or the current one, while there are none)."""
        self._roll()
        if not self._past:
            return self._current
        return sum(self._past) / len(self._past)

    def limit(self) -> float:
        """Most tokens in flight at once now: what the recent rate finishes in 40% of the bound. Little's law gives
        the mean time in the server; the slowest admitted requests (p99, measured on 2 cores, open-loop overload at
        3x) took 2.3x the median, so 40% keeps them, not only the average, within the bound; where they lie further
        out, `scale` (from what answers took) shrinks it.

        Beside it, the floor (`_floor_room`)."""
        rate = self.rate()
        if rate <= 0:
            return self.floor_tokens * self.scale
        return rate * self.max_queue_s * TAIL_FACTOR * self.scale

    def try_enter(self, tokens: float, since: float | None = None) -> Admission | None:
        """An admission for `tokens`, or None (refused: `overloaded` says why). `since`: when the request came in at
        the door, where that was before this gate (a model's gate met once the request is tokenized): its time is
        counted from there, not from here."""
        self._overdue()
        now = self.clock()
        if now >= self._claim_until:
            self.claim = 0.0
        claimant = tokens >= CLAIM_SHARE * self.claim  # of the claim's size: it may take the room held
        needed = tokens if claimant else tokens + self.claim
        limit = self.limit()
        if self.in_flight and self.tokens_in_flight + needed > limit and not self._floor_room(needed):
            # Its room is held from now on, against smaller requests; not for a request larger than all the gate
            # admits (the floor included): it waits for an empty gate, as before, rather than close the door to
            # every smaller request until the gate has emptied.
            if claimant and tokens <= max(limit, self.floor_tokens * self.scale):
                self.claim, self._claim_until = max(tokens, self.claim), now + self.max_queue_s
            self._refused_beside_claim = not claimant and (
                self.tokens_in_flight + tokens <= limit or self._floor_room(tokens)
            )
            self._refused_needing = needed
            return None
        if claimant:
            self.claim = 0.0
        self._roll()
        self._accrue()
        self.in_flight += 1
        self.tokens_in_flight += tokens
        self._had_work = True
        return Admission(self, tokens, now if since is None else since)

    def _floor_room(self, tokens: float) -> bool:
        """The floor, whatever the measured rate: up to `cold_requests` requests and one batch of tokens
        (`floor_tokens`) in flight, so that a burst after a quiet spell (whose completion rate says little of what
        the server can do) fills a batch, and a closed loop of a few clients at saturation is not refused as the
        rate wobbles; heavy requests stop at one batch: 7 long QA contexts of MiniLM, not the 32 (4 s of work on 2
        cores) that a floor counted in requests admitted (issue 30). Where no rate is known at all (a cold or idle
        server), `cold_requests` are admitted whatever they cost."""
        if self.in_flight >= max(1, math.ceil(self.cold_requests * self.scale)):
            return False
        return self.tokens_in_flight + tokens <= self.floor_tokens * self.scale or self.rate() <= 0

    def leave(self, tokens: float, completed: bool) -> None:
        self._roll()
        self._accrue()
        self.in_flight -= 1
        self.tokens_in_flight = max(0.0, self.tokens_in_flight - tokens) if self.in_flight else 0.0
        if completed:
            self._roll()
            self._current += tokens
            self.mean_request_tokens += 0.1 * (tokens - self.mean_request_tokens)

    def took(self, seconds: float, admitted_at: float) -> None:
        """An admitted request that did its work took `seconds` from the door to its answer. Later than LATE x the
        bound, it cuts the scale, once for all the requests admitted before the cut: their answers show the scale
        they were admitted under, not the one now (as TCP halves its window once a round trip)."""
        if admitted_at < self._cut_at:
            return
        self._roll()
        self._slowest = max(self._slowest, seconds)
        if seconds > LATE * self.max_queue_s:
            cut = max(MAX_CUT, CUT_AIM * self.max_queue_s / seconds)
            self._set_scale(max(MIN_SCALE, self.scale * cut))
            self._cut_at = self.clock()
            self._slowest = 0.0

    def _overdue(self) -> None:
        """The oldest request still at work, already later than LATE x the bound, is a late answer known before it
        comes: the cut need not wait for it (on long NER texts, a second or more)."""
        oldest = next(iter(self.working.values()), None)
        if oldest is not None and oldest >= self._cut_at:
            age = self.clock() - oldest
            if age > LATE * self.max_queue_s:
                self.took(age, oldest)

    def _set_scale(self, scale: float) -> None:
        self.scale = scale
        self.on_scale(scale)

    def expected_wait_s(self) -> float | None:
        """Mean time the work in flight now should take (Little's law); None before a rate is measured under load
        (`_rate_measured`)."""
        rate = self.rate()
        return self.tokens_in_flight / rate if rate and self._rate_measured() else None

    def retry_after_s(self) -> int:
        """A hint for the client: about when the request refused last would fit, as the work in flight now is done
        at the recent rate (1 s where no rate is measured under load yet: one is, a second from now); not when all
        that work is done, which is later by up to the limit's own time (40% of the bound) less the request's."""
        rate = self.rate()
        if rate <= 0 or not self._rate_measured():
            return 1
        excess = self.tokens_in_flight + self._refused_needing - self.limit()
        return max(1, min(30, math.ceil(excess / rate)))

    def _rate_measured(self) -> bool:
        """Whether the rate says how fast the server finishes work: measured over seconds that had work in flight
        for half their time at least, or from one full batch of tokens (`floor_tokens`). A few requests in a quiet
        spell finish few tokens a second because few came, not because the server is slow: two one-sentence
        requests in the 3 s before a burst of 64-row requests put the burst's work at 41,984 s in the 429's message
        and its Retry-After at the cap (30 s), where the work took about 2 s."""
        self._roll()
        self._accrue()
        if self._past:
            tokens, busy, seconds = sum(self._past), sum(self._busy_past), float(len(self._past))
        else:
            tokens, busy, seconds = self._current, self._busy, self.clock() - self._second
        return tokens >= self.floor_tokens or busy >= 0.5 * seconds

    def refusal(self) -> str:
        """Why a request is refused now, for the 429's message."""
        wait = self.expected_wait_s()
        if wait is None:
            return (
                f"{self.subject} is at capacity: {self.in_flight} requests in flight, "
                f"{self.tokens_in_flight:.0f} tokens, the most it admits before it has measured its speed under load "
                f"(a cold or idle server); retry shortly"
            )
        slow = (
            f" (answers lately took longer than that: it admits {self.scale:.0%} of its usual share)"
            if self.scale < 1
            else ""
        )
        if self._refused_beside_claim:
            slow += f" (and {self.claim:.0f} tokens are held for a larger request refused before this one)"
        return (
            f"{self.subject} is at capacity: {self.in_flight} requests in flight, about {wait:.1f} s of work, would "
            f"leave a new one no chance to be answered within --max-queue-s {self.max_queue_s:g}{slow}; retry shortly"
        )

    def overloaded(self) -> Overloaded:
        """The 429 for a request this gate refuses now: why (`refusal`) and when to retry (`retry_after_s`)."""
        return Overloaded(self.refusal(), retry_after_s=self.retry_after_s())

    def _roll(self) -> None:
        now = math.floor(self.clock())
        if now == self._second:
            return
        # Growth: the second that closes, where its answers were well within the bound or it had no work; and the
        # whole seconds since, where nothing is in flight (nothing entered or left since the last roll).
        quick = 0 < self._slowest < GROW_BELOW * self.max_queue_s
        seconds = int(quick or not self._had_work) + (0 if self.in_flight else now - self._second - 1)
        if seconds and self.scale < 1:
            self._set_scale(min(1.0, self.scale * GROWTH**seconds))
        self._slowest, self._had_work = 0.0, self.in_flight > 0
        self._past.append(self._current)
        self._accrue(until=self._second + 1.0)  # the second that closes: its busy time to its end
        self._busy_past.append(self._busy)
        for _ in range(min(now - self._second - 1, self._past.maxlen or 0)):
            self._past.append(0.0)  # whole seconds with nothing finished
            self._busy_past.append(1.0 if self.in_flight else 0.0)  # nothing entered or left: busy all or none of it
        self._second, self._current = now, 0.0
        self._busy, self._busy_mark = 0.0, float(now)

    def _accrue(self, until: float | None = None) -> None:
        """The current second's busy time, up to now (or `until`): the time since the last count, where work was in
        flight all along (nothing entered or left since: each does this first)."""
        until = self.clock() if until is None else until
        if self.in_flight:
            self._busy += max(0.0, until - self._busy_mark)
        self._busy_mark = until


class Passage:
    """An admitted request's shares: the front-end gate's, and its model's where the door knew the model."""

    def __init__(self, door: Admission, model: Admission | None, model_name: str | None) -> None:
        self.door = door
        self.model = model
        self.model_name = model_name  # whose gate admitted it at the door (None: the pipeline's charge asks it)

    def charge(self, tokens: int) -> None:
        self.door.charge(tokens)
        if self.model is not None:
            self.model.charge(tokens)

    def leave(self, completed: bool) -> None:
        self.door.leave(completed)
        if self.model is not None:
            self.model.leave(completed)


class Door:
    """A front-end's admission, before a request's body is read: its own gate for every request, and the model's
    gate where the request names its model before its body (a path's name, a gRPC call's model_name) and this
    front-end serves it; a request naming its model in the body (OpenAI's embeddings, Cohere's rerank) meets its
    model's gate once tokenized (RequestPipeline). `refused_by` is the gate that turned the last refused request
    away: its 429 says why."""

    def __init__(self, gate: AdmissionGate, models: ModelGates, serves: Callable[[str], bool]) -> None:
        # Every request that does work meets its model's gate (here, or in the pipeline once tokenized), and that gate
        # judges its time: a late answer cuts its own model's share. Cut here too, it cut every model's (one slow
        # 64-passage rerank: the door's share 0.12 while the model's own read 1.0, measured).
        gate.timed = False
        self.gate = gate
        self.models = models
        self._serves = serves  # whether a model is served here: a gate is made only for a model that is
        self.refused_by = gate

    def try_enter(self, body_bytes: int | None, model: str | None = None) -> Passage | None:
        """The passage, or None (refused: `overloaded` says why); in an `admission` span of the request's trace, on
        every protocol (`bertserve.admitted` false for a 429)."""
        with tracing.span("admission") as span:
            passage = self._try_enter(body_bytes, model)
            span.set_attribute("bertserve.admitted", passage is not None)
            if passage is None:  # the step's error, as a step an Overloaded raised in is marked: a 429, no ERROR
                tracing.set_error(span, "Overloaded", 429)
        return passage

    def _try_enter(self, body_bytes: int | None, model: str | None) -> Passage | None:
        tokens = estimate_tokens(body_bytes, self.gate.mean_request_tokens)
        admission = self.gate.try_enter(tokens)
        if admission is None:
            self.refused_by = self.gate
            return None
        if model is None or not self._serves(model):
            return Passage(admission, None, None)
        model_gate = self.models.gate(model)
        share = model_gate.try_enter(tokens)
        if share is None:
            admission.leave(completed=False)
            self.refused_by = model_gate
            return None
        return Passage(admission, share, model)

    def overloaded(self) -> Overloaded:
        """The 429 for the request refused last: the refusing gate's reason and retry hint."""
        return self.refused_by.overloaded()

    def tick(self) -> None:
        """Bring every gate up to now: an idle one's share grows back as the seconds pass, not only at the next
        request, so that its metric (a dashboard's, the lowest over the front-ends) does not read a cut long over."""
        self.gate.rate()
        self.models.tick()

    async def keep_ticking(self, every_s: float = 1.0) -> None:
        while True:
            await asyncio.sleep(every_s)
            self.tick()


class ModelGates:
    """A gate per model (the module's docstring says why), made when the model is served (`follow`) or at its first
    request, whichever comes first, and dropped when it is no longer served."""

    def __init__(
        self,
        max_queue_s: float,
        floor_tokens: int,
        cold_requests: int = 1,
        clock: Callable[[], float] = time.monotonic,
        on_scale: Callable[[str, float], None] = lambda model, scale: None,
        on_forget: Callable[[str], None] = lambda model: None,
    ) -> None:
        self._settings = (max_queue_s, floor_tokens, cold_requests)
        self._clock = clock
        self._on_scale = on_scale  # told each model's new share (bertserve_model_admission_share)
        self._on_forget = on_forget  # told a model's gate is gone (its share's series is dropped)
        self._gates: dict[str, AdmissionGate] = {}

    def lowest(self) -> float:
        """The least share any model's gate admits now (1 without a gate): the front-end's, as its metric shows it."""
        return min((gate.scale for gate in self._gates.values()), default=1.0)

    def gate(self, model: str) -> AdmissionGate:
        gate = self._gates.get(model)
        if gate is None:
            max_queue_s, floor_tokens, cold_requests = self._settings
            gate = self._gates[model] = AdmissionGate(
                max_queue_s,
                floor_tokens,
                cold_requests=cold_requests,
                clock=self._clock,
                on_scale=lambda scale: self._on_scale(model, scale),
                subject=f"model {model}",
                idle=True,
            )
            self._on_scale(model, gate.scale)  # the model's share is shown from the gate's making on
        return gate

    def tick(self) -> None:
        for gate in self._gates.values():
            gate.rate()

    def follow(self, served: Iterable[str]) -> None:
        """A gate for each model `served` (its share shown from its load on, by every front-end), none for a model
        no longer served (unloaded): a model loaded again under its name starts cold, as a new one would. A request
        still in flight leaves its dropped gate as it would have; that gate's share is no longer reported."""
        served = set(served)
        for model in [model for model in self._gates if model not in served]:
            self._gates.pop(model).on_scale = lambda scale: None  # its share, reported nowhere from now on
            self._on_forget(model)
        for model in served:
            self.gate(model)
