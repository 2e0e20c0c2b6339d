"""Dynamic batching per model. Knows nothing of HTTP or ONNX: rows in, a runner called on batches, outputs back.

- Queued rows are grouped by length: a batch forms around the oldest row, taking the rows nearest to it in
  length, while the padded cost (longest row x rows) stays within `max_batch_tokens`, the row count within
  `max_batch_size`, and padded / real tokens within `max_padding_ratio` (padding is computed for nothing: on
  a CPU a smaller batch of like lengths beats a bigger one padded to its longest row).
- A partial batch waits at most `max_wait_s` after its oldest row arrived, unless the queue can already fill one.
- The queue is bounded in time (`max_queue_s`): a request whose rows, behind those queued, would take longer
  than that at the measured cost per token (a running average over batches) gets `Overloaded` at once, unless
  the queue is empty; and in rows (`max_queue_rows`), a hard cap. Every request has a deadline: past it
  the request gets `DeadlineExceeded` and its rows that have not run are dropped. Rows of requests whose client
  went away (ticket cancelled) are dropped too.
- The runner runs on worker threads of its own (one per stream), so the event loop never blocks; while the
  streams are busy, the next batch queues. The batch is padded (`prepare`) on a thread of its own, which queues
  it on the device thread itself. With one stream (CUDA), the next batch is taken just before the running one is
  due to end, so that it is there when the device is free. A runner failure fails each request of that batch with
  `InferenceFailed`; the loop goes on. A runner's output for a row may be an exception instead (the model answered
  NaN for it): that row's request fails with it, the batch's others are answered.
- `streams` batches run at once (default 1). On a CPU, two streams with half the threads each keep both cores in
  arithmetic where one small batch on two threads spends much of its time handing each operator's halves out and
  waiting for them; the runner must be safe to call from several threads (onnxruntime sessions are).
- Traces (`service.tracing`): for each request whose ticket carries a sampled span, its time here is two kinds of
  child spans of that span, `queue` (queued until its first batch ran) and `inference` (each batch it had rows in,
  linked to the batch's span); each batch is one `batch` span, linked to every traced request it served.
"""

from __future__ import annotations

import asyncio
import bisect
import itertools
import logging
import math
import operator
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Protocol

from opentelemetry.trace import Link, Span, StatusCode

from service import tracing
from service.errors import ClientClosed, DeadlineExceeded, InferenceFailed, InvalidInput, NotReady, Overloaded
from service.wire.ticket import Ticket

log = logging.getLogger("service.engine.batcher")
_LENGTH = operator.attrgetter("length")
_ENQUEUED = operator.attrgetter("enqueued")
_REQUEST = operator.attrgetter("request")
# With one stream, the next batch is aimed to reach the device thread this long before the running one ends: late,
# the device idles; early, the rows that arrive meanwhile wait for the batch after.
EARLY_TAKE_SLACK_S = 0.0003
DEPTH_REPORT_S = 0.01  # a submit reports the queue's depth at most this often (each batch taken reports it too)


@dataclass
class _DeviceRun:
    outputs: Sequence[Any]  # empty where the run failed
    error: Exception | None
    queued: float  # time.monotonic() when it was queued on the device thread
    started: float  # ... when the device thread began it
    seconds: float
    skipped: bool = False  # not run: every request of the batch was over before the device thread came to it

    @property
    def ended(self) -> float:
        return self.started + self.seconds


class Sized(Protocol):
    def __len__(self) -> int: ...


class BatchObserver(Protocol):
    def on_batch(self, rows: int, padded_tokens: int, real_tokens: int, seconds: float) -> None: ...
    def on_queue_depth(self, rows: int) -> None: ...


class _Request:
    """One submit call's rows: their outputs gathered in order, one future for the whole request.

    Cheaper than a future per row plus gather and wait_for: at thousands of requests a second that is the
    engine's event loop."""

    __slots__ = ("enqueued", "future", "outputs", "queued", "queued_ns", "remaining", "ticket", "timer")

    def __init__(self, future: asyncio.Future, rows: int, ticket: Ticket, enqueued: float) -> None:
        self.future = future
        self.ticket = ticket
        self.enqueued = enqueued  # time.monotonic(): every row of the request was queued then
        self.queued = rows  # rows not taken into a batch yet
        self.outputs: list[Any] = [None] * rows
        self.remaining = rows
        self.timer: asyncio.TimerHandle | None = None  # the deadline's; cancelled once answered
        self.queued_ns = 0  # traced requests: when queued (time.time_ns()), until its queue span is made; then 0

    def done(self) -> bool:
        return self.future.done()

    def set_output(self, index: int, output: Any) -> None:
        if self.future.done():
            return
        self.outputs[index] = output
        self.remaining -= 1
        if self.remaining == 0:
            self.future.set_result(self.outputs)
            self.cancel_timer()

    def set_exception(self, exc: BaseException) -> None:
        if not self.future.done():
            self.future.set_exception(exc)
            self.cancel_timer()

    def cancel_timer(self) -> None:
        if self.timer is not None:
            self.timer.cancel()


class _Item:
    """One queued row. A plain class with slots: the engine makes one per row, tens of thousands a second."""

    __slots__ = ("gone", "index", "length", "request", "row")

    def __init__(self, row: Any, length: int, request: _Request, index: int) -> None:
        self.row = row
        self.length = length
        self.request = request  # its ticket and the time it was queued are the request's
        self.index = index
        self.gone = False  # taken into a batch, or dropped (its request answered, cancelled or past its deadline)


class _CostsByWidth(dict[int, list[int]]):
    """A batch's padded cost by its width, then its row count: `costs[width][count]`, each width's row of counts
    made on its first use. The batch that grows row by row looks two costs up a row it considers; as list items they
    cost a subscript each, where a call of the cost function (a shape grid's table reads behind a method) cost ~10x
    as much, at hundreds of rows a batch and hundreds of batches a second.

    A cost over the budget is kept as budget + 1 (one int shared by the row): the batch only asks whether a cost fits
    and, of two that fit, which is more. One row per width seen (the model's lengths): 512 widths of 257 counts is
    ~1 MiB."""

    def __init__(self, cost: Callable[[int, int], int], max_rows: int, budget: int) -> None:
        super().__init__()
        self._cost = cost
        self._max_rows = max_rows
        self._over = budget + 1

    def __missing__(self, width: int) -> list[int]:
        over = self._over
        row = [0, *(min(self._cost(count, width), over) for count in range(1, self._max_rows + 1))]
        self[width] = row
        return row


class Batcher:
    def __init__(
        self,
        name: str,
        runner: Callable[[Any], Sequence[Any]],  # takes prepare's output where prepare is given, else the items
        *,
        max_batch_size: int,
        max_batch_tokens: int,
        max_wait_s: float,
        max_queue_rows: int,
        max_queue_s: float = float("inf"),
        max_padding_ratio: float = float("inf"),
        observer: BatchObserver | None = None,
        prepare: Callable[[list[Any]], Any] | None = None,
        padded_cost: Callable[[int, int], int] | None = None,
        streams: int = 1,
        trace_attributes: dict[str, Any] | None = None,
    ) -> None:
        if streams < 1:
            raise ValueError(f"streams must be at least 1, not {streams}")
        self.name = name
        self._runner = runner
        self._prepare = prepare
        self._padded_cost = padded_cost or (lambda count, width: count * width)
        self.max_batch_size = max_batch_size
        self.max_batch_tokens = max_batch_tokens
        self._costs = _CostsByWidth(self._padded_cost, max_batch_size, max_batch_tokens)
        self.max_wait_s = max_wait_s
        self.max_queue_rows = max_queue_rows
        self.max_queue_s = max_queue_s
        self.seconds_per_token: float | None = None  # running average of batch time / real tokens, once measured
        self._pending_tokens = 0
        self.max_padding_ratio = max_padding_ratio
        self._observer = observer
        # The queue, three views of one set of rows, kept in step so that taking a batch costs the batch, not the
        # queue (at saturation the queue holds thousands of rows, and a batch is taken hundreds of times a second):
        # - arrival order, for the oldest row: rows taken or dropped stay until they reach the head (`gone`);
        # - by length, stable (arrival order within a length), for the oldest row's neighbours: rows that arrived
        #   since the last batch wait unsorted, and join in one sort when a batch is taken (the sorted part is one
        #   run, so that sort is a merge, in C);
        # - the requests with rows queued (each counts its own), to find the dead ones without a pass over every
        #   row.
        self._arrivals: deque[_Item] = deque()
        self._by_length: list[_Item] = []
        self._unsorted: list[_Item] = []
        self._queued: set[_Request] = set()  # the requests with rows queued
        self._queued_rows = 0
        self._wakeup = asyncio.Event()
        self.streams = streams
        # batches on the device threads at once: one running per stream, and the next, ready to start
        self._device_queue = streams + 1
        self._executor = ThreadPoolExecutor(streams, thread_name_prefix=f"infer-{name}")
        self._prepare_executor = ThreadPoolExecutor(1, thread_name_prefix=f"prepare-{name}")
        self._task: asyncio.Task | None = None
        self._runs: list[asyncio.Task] = []  # batches handed to the device threads, oldest first: _device_queue at most
        self._taken: list[_Item] = []  # the batch taken from the queue and being prepared, not on the device yet
        self._running_since: dict[int, float] = {}  # device thread -> when the batch it runs started
        # One stream: the next batch is taken `_lead_s` before the running one is due to end (`_batch_s`, a running
        # average), so that it is on the device thread by then; `_last_ended`: when the last batch ended.
        self._batch_s: float | None = None
        self._lead_s = 0.0
        self._last_ended: float | None = None
        self._depth_reported_at = -math.inf
        self._trace_attributes = {"bertserve.model": name, **(trace_attributes or {})}  # every batch span's

    async def run_on_worker(self, work: Callable[[], Any]) -> Any:
        """Run `work` on a thread that runs the batches (warm-up must happen there: CUDA caches are per thread; CUDA
        runs one stream, so that is its only thread)."""
        return await asyncio.get_running_loop().run_in_executor(self._executor, work)

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._loop(), name=f"batcher-{self.name}")

    @property
    def queued_rows(self) -> int:
        """Rows queued, not taken into a batch yet (dead ones too, until the next batch is taken drops them)."""
        return self._queued_rows

    def idle(self) -> bool:
        """No row queued, none being prepared, no batch on the device: stopping now answers nothing with an error
        (how the engine drains an old version of a model before it closes it)."""
        return not self._queued_rows and not self._taken and self._batches_on_device() == 0

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        if self._runs:  # the batches on the device finish and answer their requests
            await asyncio.gather(*self._runs, return_exceptions=True)
        queued = [item for item in self._arrivals if not item.gone]
        for item in (*self._taken, *queued):  # a batch stopped while being prepared is answered too
            item.request.set_exception(NotReady("the server is shutting down"))
        self._arrivals.clear()
        self._by_length = []
        self._unsorted = []
        self._queued.clear()
        self._queued_rows = 0
        self._pending_tokens = 0
        self._taken = []
        self._executor.shutdown(wait=True)
        self._prepare_executor.shutdown(wait=True)

    async def submit(self, rows: Sequence[Sized], ticket: Ticket) -> list[Any]:
        """Queue the rows, wait for all their outputs (in order) or the ticket's deadline."""
        if not rows:
            return []
        request = self._enqueue(rows, ticket)
        try:
            return await request.future
        finally:  # cancelled too (the client went away): the deadline's timer goes with it
            request.cancel_timer()

    def enqueue(
        self, rows: Sequence[Sized], ticket: Ticket, lengths: Sequence[int] | None = None
    ) -> asyncio.Future[list[Any]]:
        """Queue the rows; the future gets all their outputs (in order), or the domain error of the first that
        failed, or DeadlineExceeded at the ticket's deadline. A refusal (queue full, not running) raises at once.
        An engine answers thousands of requests a second from this future's callback: no task per request.
        `lengths`: the rows' lengths where the caller has them already (an infer frame's head)."""
        if not rows:
            done: asyncio.Future[list[Any]] = asyncio.get_running_loop().create_future()
            done.set_result([])
            return done
        return self._enqueue(rows, ticket, lengths).future

    def _enqueue(self, rows: Sequence[Sized], ticket: Ticket, lengths: Sequence[int] | None = None) -> _Request:
        loop = asyncio.get_running_loop()
        if self._task is None or self._task.done():
            raise NotReady(f"model {self.name} is not running")
        if len(rows) > self.max_queue_rows:  # it would never fit: waiting and retrying cannot help
            raise InvalidInput(
                f"this request needs {len(rows)} model rows (inputs and windows); the queue of model {self.name} "
                f"holds at most {self.max_queue_rows}: send fewer or shorter inputs"
            )
        if self._queued_rows + len(rows) > self.max_queue_rows:
            raise Overloaded(f"model {self.name} has {self._queued_rows} rows queued; try again shortly")
        if lengths is None:
            lengths = [len(row) for row in rows]
        elif len(lengths) != len(rows):
            raise ValueError(f"{len(rows)} rows, {len(lengths)} lengths")
        tokens = sum(lengths)
        wait = self.expected_wait_s(tokens)
        if self._queued_rows and wait > self.max_queue_s:
            raise Overloaded(
                f"model {self.name} has {self._queued_rows} rows queued: with this request about {wait:.1f} s of "
                f"work, over the {self.max_queue_s:g} s bound (--max-queue-s); try again shortly",
                retry_after_s=max(1, min(30, math.ceil(wait - self.max_queue_s))),
            )
        now = time.monotonic()
        request = _Request(loop.create_future(), len(rows), ticket, now)
        if ticket.trace is not None:
            request.queued_ns = time.time_ns()
        items = list(map(_Item, rows, lengths, itertools.repeat(request), itertools.count()))
        self._arrivals.extend(items)
        self._unsorted.extend(items)
        self._queued.add(request)
        self._queued_rows += len(items)
        self._pending_tokens += tokens
        if now >= self._depth_reported_at + DEPTH_REPORT_S:
            self._report_depth()
        self._wakeup.set()
        request.timer = loop.call_later(max(0.0, ticket.deadline - now), self._expire, request, ticket)
        return request

    def expected_wait_s(self, more_tokens: int = 0) -> float:
        """Time to run the queued rows and `more_tokens` besides at the measured cost; 0 before any batch ran. The
        cost is each batch's own run time, and the streams run that many batches at once."""
        return (self._pending_tokens + more_tokens) * (self.seconds_per_token or 0.0) / self.streams

    def _expire(self, request: _Request, ticket: Ticket) -> None:
        if request.done():
            return
        ticket.cancel()
        rows = len(request.outputs)
        request.set_exception(
            DeadlineExceeded(
                f"the request was not answered within its deadline (model {self.name}, "
                f"{rows} rows, {self._queued_rows} rows queued)"
            )
        )

    async def _loop(self) -> None:
        """Take a batch, prepare it (padding) while the previous batch still runs, and hand it to the device thread.

        While a batch runs, the next one is taken early when a full batch is already waiting, or, with one stream,
        just before the running batch is due to end (learnt: `_learn_lead`); otherwise rows keep gathering, so
        batches stay as large as the load allows. A batch taken early waits on the device thread itself, which
        starts it the moment the one before ends: the device does not wait for this event loop, which under load
        is busy with every request's frames."""
        while True:
            try:
                await self._wait_for_work()
                await self._wait_for_device_queue()
                if self._device_busy():
                    await self._wait_for_full_batch_or_free_device()
                if not self._device_busy():
                    await self._wait_to_fill()
                batch = self._taken = self._take_batch()
                if not batch:
                    continue
                device_run = await self._hand_to_device(batch)
                if device_run is not None:
                    self._runs.append(asyncio.get_running_loop().create_task(self._finish(batch, device_run)))
                self._taken = []
            except asyncio.CancelledError:
                raise
            except Exception:  # never let the loop die: log, and keep serving
                log.exception("batcher %s: unexpected error", self.name)

    def _batches_on_device(self) -> int:
        """Batches handed to the device threads and not answered yet (the answered ones leave the list)."""
        self._runs = [run for run in self._runs if not run.done()]
        return len(self._runs)

    def _device_busy(self) -> bool:
        """Every stream has a batch: a new one would have to wait for one of them."""
        return self._batches_on_device() >= self.streams

    async def _wait_for_full_batch_or_free_device(self) -> None:
        """Until a full batch waits, the device is free, or (one stream) the running batch is about to end."""
        while self._device_busy() and not self._can_fill():
            self._wakeup.clear()
            take_in = self._seconds_to_early_take()
            if take_in is None:
                await self._wakeup.wait()
                continue
            if take_in <= 0:
                return
            try:
                await asyncio.wait_for(self._wakeup.wait(), take_in)
            except TimeoutError:
                return

    def _seconds_to_early_take(self) -> float | None:
        """With one stream: how long until the queued rows should be taken, so that their batch is on the device
        thread when the running one ends (None: not now). Taken when the device is free instead, the batch waited
        for this event loop to hear of it, take it and hand it over: under 1-input load on an H100 the device idled
        longer between batches than it ran them."""
        if self.streams != 1 or self._batch_s is None or not self._queued_rows:
            return None
        started = list(self._running_since.values())
        if not started:  # queued, not running yet: nothing is about to end
            return None
        return started[0] + self._batch_s - self._lead_s - time.monotonic()

    def _learn_lead(self, run: _DeviceRun, requests: Iterable[_Request]) -> None:
        """After a batch (one stream), move the lead towards the point where the next batch reaches the device
        thread just as the one before ends: later by how long it waited there, earlier by how long the device
        idled while its rows were queued."""
        if self._batch_s is None:
            self._batch_s = run.seconds
        self._batch_s += 0.2 * (run.seconds - self._batch_s)
        previous, self._last_ended = self._last_ended, run.ended
        if self.streams != 1 or previous is None or min(map(_ENQUEUED, requests)) >= previous:
            return  # no rows waited while the device was free: nothing to learn
        error = EARLY_TAKE_SLACK_S + (run.started - previous if run.queued > previous else run.queued - previous)
        self._lead_s = min(max(0.0, self._lead_s + 0.25 * error), self._batch_s)

    async def _wait_for_device_queue(self) -> None:
        """Until a batch could start next (fewer than one per stream and one behind them on the device threads): no
        batch is taken from the queue before that, so rows that arrive meanwhile can still join it."""
        while self._batches_on_device() >= self._device_queue:
            self._wakeup.clear()
            await self._wakeup.wait()

    async def _hand_to_device(self, batch: list[_Item]) -> asyncio.Future | None:
        """Queue the batch on the device thread, prepared (padded) on the prepare thread first where there is a
        `prepare`; the device's run as a future, or None where preparing failed (its requests are answered).

        The prepare thread queues the batch on the device thread itself, the moment the padding is done: handed
        back to this event loop first, the batch waited for it, and under load the loop is busy with every
        request's frames while the device may be idle."""
        rows = [item.row for item in batch]

        def nobody_waits() -> bool:
            """Every request of the batch is over (its client gone, its deadline past, or answered): read on the
            device thread, where a batch taken early may wait behind the running ones for seconds. A live batch's
            first row already says no."""
            now = time.monotonic()
            return all(r.ticket.cancelled or now > r.ticket.deadline or r.future.done() for r in map(_REQUEST, batch))

        if self._prepare is None:
            return asyncio.wrap_future(self._executor.submit(self._on_device, rows, time.monotonic(), nobody_waits))
        try:
            queued = await asyncio.wrap_future(
                self._prepare_executor.submit(self._prepare_and_queue, rows, nobody_waits)
            )
        except Exception:
            log.exception(
                "batcher %s: preparing a batch of %d rows failed (requests %s)", self.name, len(batch), _ids(batch)
            )
            self._fail(batch)
            return None
        return asyncio.wrap_future(queued)

    def _prepare_and_queue(self, rows: list[Any], nobody_waits: Callable[[], bool]) -> Future[_DeviceRun]:
        """On the prepare thread: pad the batch, then queue it on the device thread."""
        assert self._prepare is not None
        prepared = self._prepare(rows)
        return self._executor.submit(self._on_device, prepared, time.monotonic(), nobody_waits)

    async def _wait_for_work(self) -> None:
        while not self._queued_rows:
            self._wakeup.clear()
            await self._wakeup.wait()

    async def _wait_to_fill(self) -> None:
        oldest = self._oldest()
        if oldest is None:
            return
        deadline = oldest.request.enqueued + self.max_wait_s
        while not self._can_fill() and (remaining := deadline - time.monotonic()) > 0:
            self._wakeup.clear()
            try:
                await asyncio.wait_for(self._wakeup.wait(), remaining)
            except TimeoutError:
                return

    def _can_fill(self) -> bool:
        return self._queued_rows >= self.max_batch_size or self._pending_tokens >= self.max_batch_tokens

    def _take_batch(self) -> list[_Item]:
        """Drop dead rows; then the oldest row plus its nearest neighbours in length, within the budgets.

        Runs once per batch on the engine's event loop, at saturation hundreds of times a second over thousands
        of queued rows: its cost is the queued requests' (one look at each for a dead one) and the batch's, not a
        pass over every queued row. The oldest row is the first of its length in the by-length view, which keeps
        rows of one length in arrival order."""
        by_length = self._by_length
        if self._unsorted:  # newer than every sorted row: a stable sort keeps arrival order within a length
            by_length += self._unsorted
            by_length.sort(key=_LENGTH)
            self._unsorted = []
        now = time.monotonic()
        # The rows that need not run: their request is answered already (another row failed, the deadline passed),
        # its client went away, or its deadline is past. Written out: a call per queued request, at every batch, was
        # a tenth of this method's cost.
        dead = [
            request
            for request in self._queued
            if request.future.done() or request.ticket.cancelled or now > request.ticket.deadline
        ]
        if dead:
            self._drop(dead)
        oldest = self._oldest()
        if oldest is None:
            self._report_depth()
            return []
        by_length = self._by_length  # _drop may have replaced it
        low = high = bisect.bisect_left(by_length, oldest.length, key=_LENGTH)
        if by_length[low] is not oldest:  # cannot happen while the views are in step; kept correct regardless
            low = high = by_length.index(oldest)
        # The batch grows one row at a time (up to a few hundred a batch), the nearer neighbour in length first.
        # A side fits within the token budget at the cost the runtime really pays (its bucket's, with shape buckets)
        # and within the padding ratio, judged on the batch's own longest row (its rightmost: the rows are sorted),
        # before any bucket. The budgets are locals, the costs list items (`_CostsByWidth`), each looked up once a
        # step, and the test is written out here: this loop is most of the method's cost a row at 256-row batches.
        costs, budget, ratio = self._costs, self.max_batch_tokens, self.max_padding_ratio
        target = width = real = oldest.length
        by_width = costs[width]  # the batch's costs by row count, at its width
        last, size = len(by_length) - 1, self.max_batch_size
        while high - low + 1 < size:
            count = high - low + 2
            cost_now = by_width[count]
            left = by_length[low - 1].length if low > 0 else 0
            fits_left = low > 0 and cost_now <= budget and width * count <= ratio * (real + left)
            fits_right = False
            if high < last:  # `right` and its cost are read below only where it fits
                right = by_length[high + 1].length
                by_right = costs[right]
                cost_right = by_right[count]
                fits_right = cost_right <= budget and right * count <= ratio * (real + right)
            if fits_left and (
                not fits_right
                or target - left <= right - target
                # the nearer row on the right would widen the batch's padded shape: fill the one it has first
                or cost_right > cost_now
            ):
                low -= 1
                real += left
            elif fits_right:
                high += 1
                real += right
                width, by_width = right, by_right
            else:
                break
        batch = by_length[low : high + 1]
        del by_length[low : high + 1]
        queued = self._queued
        for item in batch:
            item.gone = True
            request = item.request
            request.queued -= 1
            if request.queued == 0:
                queued.discard(request)
        self._queued_rows -= len(batch)
        self._pending_tokens -= real
        self._report_depth()
        return batch

    def _oldest(self) -> _Item | None:
        """The oldest queued row (dead or not: dead rows are dropped when a batch is taken), or None."""
        arrivals = self._arrivals
        while arrivals and arrivals[0].gone:
            arrivals.popleft()
        return arrivals[0] if arrivals else None

    def _drop(self, requests: list[_Request]) -> None:
        """Drop the queued rows of these requests (answered already, cancelled, or past their deadline). A request
        whose client went away is over now (ClientClosed): it waited for its deadline, a 504 that held its share
        of the admission gate for --request-timeout-s."""
        for request in requests:
            self._queued.discard(request)
        self._drop_taken(requests)
        dropped = set(requests)
        kept: list[_Item] = []
        for item in self._by_length:
            if item.request in dropped:
                item.gone = True
                self._queued_rows -= 1
                self._pending_tokens -= item.length
            else:
                kept.append(item)
        self._by_length = kept

    def _drop_taken(self, requests: Iterable[_Request]) -> None:
        """The requests of a batch that was taken and not run: a client gone is over now (ClientClosed), as where
        its rows are dropped from the queue; a deadline past has its timer's answer."""
        for request in requests:
            if request.ticket.cancelled and not request.future.done():
                request.set_exception(ClientClosed("the client went away before the answer; its rows were dropped"))

    def _on_device(self, prepared: Any, queued: float, nobody_waits: Callable[[], bool] | None = None) -> _DeviceRun:
        """On the device thread: run one batch, timed there (queueing behind the batch before is not its time);
        not at all where nobody waits for it any more (a batch taken early, its clients gone while it waited)."""
        started = time.monotonic()
        if nobody_waits is not None and nobody_waits():
            return _DeviceRun((), None, queued, started, 0.0, skipped=True)
        thread = threading.get_ident()
        self._running_since[thread] = started
        try:
            outputs, error = self._runner(prepared), None
        except Exception as exc:
            outputs, error = (), exc
        finally:
            del self._running_since[thread]
        return _DeviceRun(outputs, error, queued, started, time.monotonic() - started)

    def device_busy_s(self) -> float:
        """How long the batch that has been on the device longest is running by now; 0 where none is."""
        started = list(self._running_since.values())
        return time.monotonic() - min(started) if started else 0.0

    async def _finish(self, batch: list[_Item], device_run: asyncio.Future) -> None:
        """Answer a batch's rows once the device thread has run it."""
        try:
            run: _DeviceRun = await device_run
            requests = dict.fromkeys(map(_REQUEST, batch))  # each once: a request's rows were queued at once
            if run.skipped:  # as rows dropped from the queue: nothing ran, nothing to learn or count
                self._drop_taken(requests)
                return
            self._learn_lead(run, requests)
            # The loop may be waiting for a free device: wake it before the rows' answers are queued on this event
            # loop, so that it hands the device its next batch first. Woken after them, it ran only once every
            # answer of the batch had been encoded (~80 at 1-input load on an H100), the device idle meanwhile.
            self._wakeup.set()
            for request in requests:
                ticket = request.ticket
                ticket.queue_seconds = max(ticket.queue_seconds, run.started - request.enqueued)
            error = run.error
            if error is None and len(run.outputs) != len(batch):
                error = RuntimeError(f"runner returned {len(run.outputs)} outputs for {len(batch)} rows")
            if error is not None:
                log.error(
                    "batcher %s: a batch of %d rows failed (requests %s)",
                    self.name,
                    len(batch),
                    _ids(batch),
                    exc_info=error,
                )
                self._fail(batch)
            else:
                for item, output in zip(batch, run.outputs, strict=True):
                    if isinstance(output, BaseException):  # this row's alone (the model's NaN): its request fails
                        self._fail_row(item, output, len(batch))
                    else:
                        item.request.set_output(item.index, output)
        finally:
            self._wakeup.set()  # the device (or its queue) is free: the loop may be waiting for that
        seconds = run.seconds
        lengths = list(map(_LENGTH, batch))
        width, real = max(lengths), sum(lengths)
        self._learn_cost(seconds, real)
        for ticket in {id(request.ticket): request.ticket for request in requests}.values():
            ticket.inference_seconds += seconds
            ticket.inference_calls += 1
        if self._observer is not None:
            self._observer.on_batch(len(batch), self._padded_cost(len(batch), width), real, seconds)
        if tracing.ENABLED:
            self._trace(batch, run, width, real)

    def _trace(self, batch: list[_Item], run: _DeviceRun, width: int, real_tokens: int) -> None:
        """The batch's span, linked to each traced request it served, and those requests' queue and inference
        spans (after the answers are queued: they do not wait for this)."""
        traced: dict[int, list[Any]] = {}  # id(request) -> [request, its span, its rows in this batch]
        for item in batch:
            if item.request.ticket.trace is not None:
                entry = traced.get(id(item.request))
                if entry is None:
                    traced[id(item.request)] = [item.request, item.request.ticket.trace, 1]
                else:
                    entry[2] += 1
        if not traced:
            return
        offset_ns = time.time_ns() - time.monotonic_ns()  # the device's monotonic times as wall-clock ones
        start_ns = int(run.started * 1e9) + offset_ns
        end_ns = start_ns + int(run.seconds * 1e9)
        attributes = {
            **self._trace_attributes,
            "bertserve.batch.rows": len(batch),
            "bertserve.batch.tokens": real_tokens,
            "bertserve.batch.width": width,
            "bertserve.batch.padded_tokens": self._padded_cost(len(batch), width),
            "bertserve.batch.requests": len({id(item.request) for item in batch}),
        }
        links = [Link(context) for _, context, _ in traced.values()]
        batch_span = tracing.start_span("batch", attributes=attributes, start_ns=start_ns, links=links)
        _failed(batch_span, run.error)
        batch_span.end(end_ns)
        to_batch = [Link(batch_span.get_span_context())]
        for request, context, rows in traced.values():
            if request.queued_ns:
                queue = tracing.start_span(
                    "queue", context, attributes={"bertserve.rows": len(request.outputs)}, start_ns=request.queued_ns
                )
                queue.end(max(start_ns, request.queued_ns))
                request.queued_ns = 0
            share = {"bertserve.rows": rows, "bertserve.batch.rows": len(batch)}
            inference = tracing.start_span("inference", context, attributes=share, start_ns=start_ns, links=to_batch)
            _failed(inference, run.error)
            inference.end(end_ns)

    def _learn_cost(self, seconds: float, real_tokens: int) -> None:
        """Running average of seconds per real token (padding included in the cost), weighted by batch size, so
        that the many small batches of a quiet server do not outweigh the full ones that matter under load.

        Only batches of at least 1/8 of the token budget count: a batch's fixed cost spread over a few tokens
        (the self-test's, a lone short sentence's) made a token look ten times dearer than in a full batch, and a
        burst on a cold server was refused for work it would have done in a fraction of the bound."""
        if real_tokens <= 0 or real_tokens * 8 < self.max_batch_tokens:
            return
        cost = seconds / real_tokens
        weight = min(1.0, real_tokens / max(self.max_batch_tokens, 1))
        if self.seconds_per_token is None:
            self.seconds_per_token = cost
        else:
            self.seconds_per_token += 0.2 * weight * (cost - self.seconds_per_token)

    def _fail_row(self, item: _Item, error: BaseException, batch_rows: int) -> None:
        if not item.request.done():
            log.warning(
                "batcher %s: a row of a batch of %d failed: %s (request %s)",
                self.name,
                batch_rows,
                error,
                item.request.ticket.request_id or "-",
            )
        item.request.set_exception(error)

    @staticmethod
    def _fail(batch: list[_Item]) -> None:
        for item in batch:
            item.request.set_exception(InferenceFailed("inference failed for this request's batch"))

    def _report_depth(self) -> None:
        """The queue depth to the observer: on every batch taken, and on a submit at most every DEPTH_REPORT_S (in
        process mode the gauge is a file write, a tenth of the engine's own work per 1-input request)."""
        self._depth_reported_at = time.monotonic()
        if self._observer is not None:
            self._observer.on_queue_depth(self._queued_rows)


def _failed(span: Span, error: BaseException | None) -> None:
    if error is not None:
        span.set_attribute("error.type", type(error).__name__)
        span.set_status(StatusCode.ERROR, "inference failed")


def _ids(batch: list[_Item]) -> str:
    """The request ids of a batch's rows, each once, for a log line about the batch (which spans requests)."""
    return ", ".join(dict.fromkeys(item.request.ticket.request_id or "-" for item in batch))
