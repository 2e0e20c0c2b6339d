"""The batcher alone: rows are plain sized objects, the runner a Python function."""

from __future__ import annotations

import asyncio
import itertools
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import pytest

from service.engine.batcher import Batcher
from service.engine.buckets import ShapeGrid
from service.errors import (
    ClientClosed,
    DeadlineExceeded,
    InferenceFailed,
    InvalidInput,
    NonFiniteOutput,
    NotReady,
    Overloaded,
)
from service.wire.ticket import Ticket
from tests.service.conftest import wait_for, wait_for_async

# What the batcher's loop and device threads do next (take a queued row, start a batch) takes milliseconds; a wait for
# it that has not come true within this long is a failure, not a slow machine.
PROMISE_S = 5.0


@dataclass(frozen=True)
class FakeRow:
    tag: str
    length: int

    def __len__(self) -> int:
        return self.length


class Recorder:
    def __init__(self, delay: float = 0.0, fail_on: str | None = None) -> None:
        self.batches: list[list[FakeRow]] = []
        self.delay = delay
        self.fail_on = fail_on
        self.gate = threading.Event()
        self.gate.set()

    def __call__(self, rows: list[FakeRow]) -> list[str]:
        self.gate.wait(5)
        self.batches.append(rows)
        time.sleep(self.delay)
        if self.fail_on and any(row.tag == self.fail_on for row in rows):
            raise RuntimeError("kaboom")
        return [f"out:{row.tag}" for row in rows]


class Observer:
    def __init__(self) -> None:
        self.batches: list[tuple[int, int, int]] = []
        self.depths: list[int] = []

    def on_batch(self, rows: int, padded_tokens: int, real_tokens: int, seconds: float) -> None:
        self.batches.append((rows, padded_tokens, real_tokens))

    def on_queue_depth(self, rows: int) -> None:
        self.depths.append(rows)


def run(coroutine_factory, **batcher_options):
    async def main():
        runner = batcher_options.pop("runner", Recorder())
        observer = Observer()
        options = {"max_batch_size": 8, "max_batch_tokens": 1024, "max_wait_s": 0.02, "max_queue_rows": 100}
        options.update(batcher_options)
        batcher = Batcher("test", runner, observer=observer, **options)
        batcher.start()
        try:
            return await coroutine_factory(batcher, runner, observer)
        finally:
            await batcher.stop()

    return asyncio.run(main())


def rows(prefix: str, lengths: list[int]) -> list[FakeRow]:
    return [FakeRow(f"{prefix}{i}", n) for i, n in enumerate(lengths)]


async def until(condition: Callable[[], object], what: str, timeout: float = PROMISE_S) -> None:
    """Wait (the event loop running) until `condition` holds; fail, saying `what` did not happen, after `timeout`."""
    assert await wait_for_async(lambda: bool(condition()), timeout=timeout, every_s=0.01), f"{what}: not in {timeout} s"


def on_device(batcher: Batcher, batches: int) -> Callable[[], bool]:
    """Nothing queued, and `batches` batches handed to the device threads (running, or next to run)."""
    return lambda: not batcher.queued_rows and batcher._batches_on_device() == batches


def test_concurrent_requests_get_their_own_answers_in_order_with_fewer_calls() -> None:
    async def scenario(batcher, runner, _):
        requests = [rows(f"r{k}-", [5 + k, 3, 9]) for k in range(6)]
        answers = await asyncio.gather(*(batcher.submit(r, Ticket.with_timeout(5)) for r in requests))
        return requests, answers, runner.batches

    requests, answers, batches = run(scenario)
    for request, answer in zip(requests, answers, strict=True):
        assert answer == [f"out:{row.tag}" for row in request]
    assert len(batches) < len(requests)
    assert sum(len(b) for b in batches) == 18


def test_batches_respect_token_budget_and_size() -> None:
    async def scenario(batcher, runner, observer):
        lengths = [10, 200, 15, 180, 12, 190, 11, 14, 17, 16, 13, 195]
        await batcher.submit(rows("x", lengths), Ticket.with_timeout(5))
        return runner.batches, observer.batches

    batches, observed = run(scenario, max_batch_size=4, max_batch_tokens=400)
    for batch in batches:
        assert len(batch) <= 4
        assert max(len(r) for r in batch) * len(batch) <= 400
    # length grouping: short rows are not padded to the long ones
    assert all(max(map(len, b)) < 100 or min(map(len, b)) > 100 for b in batches)
    assert sum(real for _, _, real in observed) == 10 + 200 + 15 + 180 + 12 + 190 + 11 + 14 + 17 + 16 + 13 + 195
    assert all(padded >= real for _, padded, real in observed)


def test_lengths_the_caller_gives_are_the_rows_own_and_must_match_their_count() -> None:
    """The engine passes an infer frame's lengths rather than ask each row its length: the batches and the token
    count are those the rows' own lengths make; a list that does not match the rows is refused before queueing."""
    lengths = [10, 200, 15, 180, 12, 190, 11, 14, 17, 16, 13, 195]

    def scenario(given: bool):
        async def submit(batcher, runner, observer):
            request = rows("x", lengths)
            if given:
                with pytest.raises(ValueError, match="12 rows, 11 lengths"):
                    batcher.enqueue(request, Ticket.with_timeout(5), lengths[:-1])
                assert batcher.queued_rows == 0
            answer = await batcher.enqueue(request, Ticket.with_timeout(5), lengths if given else None)
            return answer, [[row.tag for row in batch] for batch in runner.batches], observer.batches

        return submit

    given = run(scenario(True), max_batch_size=4, max_batch_tokens=400)
    asked = run(scenario(False), max_batch_size=4, max_batch_tokens=400)
    assert given == asked
    answer, batches, observed = given
    assert answer == [f"out:x{i}" for i in range(len(lengths))] and len(batches) > 3
    assert sum(real for _, _, real in observed) == sum(lengths)


def test_many_rows_spread_over_batches_come_back_in_order() -> None:
    async def scenario(batcher, runner, _):
        request = rows("w", [30 - (i % 7) for i in range(40)])
        answer = await batcher.submit(request, Ticket.with_timeout(5))
        return request, answer, runner.batches

    request, answer, batches = run(scenario, max_batch_size=8, max_batch_tokens=4096)
    assert answer == [f"out:{row.tag}" for row in request]
    assert len(batches) == 5


def test_full_queue_is_refused_at_once() -> None:
    async def scenario(batcher, runner, _):
        runner.gate.clear()  # the first batch blocks in the runner; everything else queues
        first = asyncio.create_task(batcher.submit(rows("a", [5]), Ticket.with_timeout(5)))
        await until(on_device(batcher, 1), "the first batch on the device")
        # a full batch is taken (and prepared) while the first one runs; the next one waits in the queue
        prepared = asyncio.create_task(batcher.submit(rows("b", [5] * 8), Ticket.with_timeout(5)))
        await until(on_device(batcher, 2), "the full batch taken while the first runs")
        blocked = asyncio.create_task(batcher.submit(rows("c", [5] * 8), Ticket.with_timeout(5)))
        await until(lambda: batcher.queued_rows == 8, "the next batch queued")
        with pytest.raises(Overloaded) as refused:
            await batcher.submit(rows("d", [5] * 3), Ticket.with_timeout(5))
        runner.gate.set()
        await asyncio.gather(first, prepared, blocked)
        return refused.value

    error = run(scenario, max_queue_rows=10)
    assert error.status_code == 429 and error.headers["Retry-After"]


def test_the_next_batch_starts_on_the_device_thread_while_the_event_loop_is_busy() -> None:
    async def scenario(batcher, runner, _):
        runner.gate.clear()  # the first batch blocks on the device thread
        first = asyncio.create_task(batcher.submit(rows("a", [5]), Ticket.with_timeout(5)))
        await until(on_device(batcher, 1), "the first batch on the device")
        second = asyncio.create_task(batcher.submit(rows("b", [5] * 8), Ticket.with_timeout(5)))  # a full batch
        await until(on_device(batcher, 2), "the full batch handed to the device thread behind the first")
        assert runner.batches == []
        runner.gate.set()
        # the event loop is busy (a server's is, with every request's frames): held, not awaiting, until both ran
        wait_for(lambda: len(runner.batches) == 2, timeout=PROMISE_S, every_s=0.01)
        ran_while_busy = [batch[0].tag for batch in runner.batches]
        await asyncio.gather(first, second)
        return ran_while_busy

    assert run(scenario) == ["a0", "b0"]  # the device thread went from one batch to the next on its own


def test_the_device_reports_how_long_its_batch_has_run() -> None:
    async def scenario(batcher, runner, _):
        assert batcher.device_busy_s() == 0.0
        runner.gate.clear()  # the batch blocks on the device thread
        submitted = time.monotonic()  # the batch starts after this
        request = asyncio.create_task(batcher.submit(rows("a", [5]), Ticket.with_timeout(5)))
        await until(lambda: batcher.device_busy_s() > 0, "the batch on the device")
        running_by = time.monotonic()  # ... and before this
        await asyncio.sleep(0.3)
        before = time.monotonic()
        busy = batcher.device_busy_s()
        after = time.monotonic()
        runner.gate.set()
        await request
        return (before - running_by, busy, after - submitted), batcher.device_busy_s()

    (least, busy, most), after = run(scenario)
    assert 0.2 < least <= busy <= most and after == 0.0, (least, busy, most)


@pytest.mark.parametrize("streams", [1, 2])
def test_streams_run_that_many_batches_at_once(streams: int) -> None:
    together = threading.Barrier(2)  # opens only when two batches are on the device threads at the same time

    def runner(batch: list[FakeRow]) -> list[str]:
        try:
            together.wait(timeout=0.5)
        except threading.BrokenBarrierError:
            raise RuntimeError("this batch ran alone") from None
        return [f"out:{row.tag}" for row in batch]

    async def scenario(batcher, runner, _):
        short, long = rows("short", [5]), rows("long", [50])  # unlike lengths: two batches
        return await asyncio.gather(
            batcher.submit(short, Ticket.with_timeout(5)),
            batcher.submit(long, Ticket.with_timeout(5)),
            return_exceptions=True,
        )

    answers = run(scenario, runner=runner, streams=streams, max_padding_ratio=1.0)
    if streams == 2:
        assert answers == [["out:short0"], ["out:long0"]]
    else:  # one stream: the first batch waits alone, the second finds the barrier broken
        assert [type(answer) for answer in answers] == [InferenceFailed, InferenceFailed]


def test_the_expected_wait_shares_the_queued_work_among_the_streams() -> None:
    waits = {}
    for streams in (1, 2, 4):
        batcher = Batcher(
            "t", Recorder(), max_batch_size=8, max_batch_tokens=64, max_wait_s=0, max_queue_rows=10, streams=streams
        )
        batcher.seconds_per_token = 0.001  # each batch's own time per token; the streams run batches side by side
        waits[streams] = batcher.expected_wait_s(1000)
    assert waits == {1: 1.0, 2: 0.5, 4: 0.25}
    with pytest.raises(ValueError, match="streams must be at least 1"):
        Batcher("t", Recorder(), max_batch_size=8, max_batch_tokens=64, max_wait_s=0, max_queue_rows=10, streams=0)


def test_queue_is_bounded_in_time_at_the_measured_cost_per_token() -> None:
    class PerToken(Recorder):  # 1 ms per token
        def __call__(self, batch: list[FakeRow]) -> list[str]:
            self.delay = 0.001 * sum(len(row) for row in batch)
            return super().__call__(batch)

    async def scenario(batcher, runner, _):
        assert batcher.expected_wait_s(10_000) == 0  # nothing measured yet: only the row cap applies
        await batcher.submit(rows("warm", [10] * 8), Ticket.with_timeout(5))
        measured = batcher.seconds_per_token
        batcher.max_queue_s = 300 * measured  # 300 tokens of work may wait
        runner.gate.clear()  # hold the device: one batch runs, one is taken early, the rest queue
        held = []
        for k in range(5):  # one at a time, so that the loop takes its batches as a server's would
            held.append(asyncio.create_task(batcher.submit(rows(f"q{k}-", [10] * 8), Ticket.with_timeout(20))))
            await until(  # q0 runs, q1 is taken early, the rest queue
                lambda k=k: batcher._batches_on_device() == min(k + 1, 2) and batcher.queued_rows == 8 * max(0, k - 1),
                f"q{k} taken or queued",
            )
        queued_tokens = batcher.expected_wait_s() / measured
        with pytest.raises(Overloaded, match=r"s of work, over the .* s bound") as refused:
            await batcher.submit(rows("late", [10] * 8), Ticket.with_timeout(20))
        small = asyncio.create_task(batcher.submit(rows("small", [10] * 5), Ticket.with_timeout(20)))  # 290: fits
        runner.gate.set()
        answers = await asyncio.gather(*held, small)
        return measured, queued_tokens, refused.value, answers

    measured, queued_tokens, error, answers = run(
        scenario, runner=PerToken(), max_batch_size=8, max_batch_tokens=80, max_queue_rows=1000
    )
    assert 0.0009 <= measured <= 0.003  # 1 ms per token, plus the runner's overhead
    assert round(queued_tokens) == 240
    assert error.status_code == 429 and int(error.headers["Retry-After"]) >= 1
    assert [len(answer) for answer in answers] == [8] * 5 + [5]  # everything admitted is answered


def test_small_batches_do_not_teach_the_cost_per_token() -> None:
    # a lone short row's fixed cost over its few tokens would make every token look dear (a cold burst refused)
    async def scenario(batcher, runner, _):
        await batcher.submit(rows("lone", [5]), Ticket.with_timeout(5))
        after_small = batcher.seconds_per_token
        await batcher.submit(rows("full", [20] * 8), Ticket.with_timeout(5))  # 160 tokens: 1/8 of the budget
        return after_small, batcher.seconds_per_token

    after_small, after_full = run(scenario, runner=Recorder(delay=0.01), max_batch_tokens=1024)
    assert after_small is None
    assert after_full is not None and after_full < 0.01 / 100


def test_an_empty_queue_admits_a_request_longer_than_the_bound() -> None:
    async def scenario(batcher, runner, _):
        await batcher.submit(rows("warm", [10] * 8), Ticket.with_timeout(5))
        return await batcher.submit(rows("big", [10] * 40), Ticket.with_timeout(10))  # ~0.4 s of work

    runner = Recorder(delay=0.01)
    assert len(run(scenario, runner=runner, max_batch_size=8, max_batch_tokens=80, max_queue_s=0.05)) == 40


def test_a_request_larger_than_the_whole_queue_is_refused_as_invalid() -> None:
    async def scenario(batcher, runner, _):
        with pytest.raises(InvalidInput, match="holds at most 10"):
            await batcher.submit(rows("big", [5] * 11), Ticket.with_timeout(5))
        return await batcher.submit(rows("ok", [5] * 10), Ticket.with_timeout(5))

    assert len(run(scenario, max_queue_rows=10)) == 10


def test_deadline_drops_work_that_has_not_run() -> None:
    async def scenario(batcher, runner, _):
        runner.gate.clear()
        first = asyncio.create_task(batcher.submit(rows("slow", [5]), Ticket.with_timeout(5)))
        await until(on_device(batcher, 1), "the first batch on the device")
        with pytest.raises(DeadlineExceeded):
            await batcher.submit(rows("late", [5, 5]), Ticket.with_timeout(0.1))
        runner.gate.set()
        await first
        after = await batcher.submit(rows("next", [5]), Ticket.with_timeout(5))
        return after, runner.batches

    after, batches = run(scenario)
    assert after == ["out:next0"]
    assert not any(row.tag.startswith("late") for batch in batches for row in batch)


async def queued_behind_a_batch(batcher, runner, gone: Ticket) -> tuple[asyncio.Task, asyncio.Task]:
    """A batch held on the device (the runner's gate closed) and, queued behind it, two rows of `gone`'s request:
    the task of each."""
    runner.gate.clear()
    first = asyncio.create_task(batcher.submit(rows("a", [5]), Ticket.with_timeout(5)))
    await until(on_device(batcher, 1), "the first batch on the device")
    abandoned = asyncio.create_task(batcher.submit(rows("gone", [5, 6]), gone))
    await until(lambda: batcher.queued_rows == 2, "its rows queued")
    return first, abandoned


def test_cancelled_tickets_are_skipped() -> None:
    async def scenario(batcher, runner, _):
        gone = Ticket.with_timeout(5)
        first, abandoned = await queued_behind_a_batch(batcher, runner, gone)
        gone.cancelled = True  # the client went away
        abandoned.cancel()
        runner.gate.set()
        await first
        await batcher.submit(rows("b", [5]), Ticket.with_timeout(5))
        return runner.batches

    batches = run(scenario)
    assert not any(row.tag.startswith("gone") for batch in batches for row in batch)


def test_a_request_whose_client_went_away_is_over_at_the_next_batch_not_at_its_deadline() -> None:
    """Its rows not run yet are dropped, and its answer is ClientClosed (499) then: it waited for its deadline (a
    504 at --request-timeout-s, its admission share held all that time)."""

    async def scenario(batcher, runner, _):
        gone = Ticket.with_timeout(30)
        first, abandoned = await queued_behind_a_batch(batcher, runner, gone)
        gone.cancel()  # the client went away (the HTTP layer's http.disconnect)
        runner.gate.set()
        await first
        started = time.monotonic()
        with pytest.raises(ClientClosed):
            await asyncio.wait_for(abandoned, 5)
        return time.monotonic() - started, runner.batches

    seconds, batches = run(scenario)
    assert seconds < 1.0
    assert not any(row.tag.startswith("gone") for batch in batches for row in batch)


@pytest.mark.parametrize("prepared", [False, True], ids=["rows", "prepared"])
def test_a_batch_waiting_on_the_device_thread_whose_clients_went_away_does_not_run(prepared: bool) -> None:
    """A full batch is taken early and waits on the device thread behind the running one (seconds, for long NER
    batches on two streams); its client went away meanwhile: a probe saw those rows run and the request answered
    200 to nobody. The device thread skips it now, and the request is over then: ClientClosed (499)."""

    async def scenario(batcher, runner, _):
        runner.gate.clear()
        first = asyncio.create_task(batcher.submit(rows("a", [5]), Ticket.with_timeout(5)))
        await until(on_device(batcher, 1), "the first batch on the device")
        gone = Ticket.with_timeout(30)
        abandoned = asyncio.create_task(batcher.submit(rows("gone", [5] * 8), gone))  # a full batch: taken early
        await until(on_device(batcher, 2), "the full batch handed to the device thread")
        gone.cancel()  # the client went away (the HTTP layer's disconnect)
        runner.gate.set()
        with pytest.raises(ClientClosed):
            await asyncio.wait_for(abandoned, 5)
        after = await batcher.submit(rows("next", [5]), Ticket.with_timeout(5))  # the batcher goes on
        return await first, after, runner.batches

    options = {"prepare": (lambda batch: batch)} if prepared else {}
    first, after, batches = run(scenario, **options)
    assert first == ["out:a0"] and after == ["out:next0"]
    assert not any(row.tag.startswith("gone") for batch in batches for row in batch)


def test_a_failing_batch_fails_its_requests_and_the_batcher_goes_on() -> None:
    async def scenario(batcher, runner, _):
        with pytest.raises(InferenceFailed):
            await batcher.submit(rows("bad", [5]), Ticket.with_timeout(5))
        return await batcher.submit(rows("good", [5]), Ticket.with_timeout(5))

    assert run(scenario, runner=Recorder(fail_on="bad0")) == ["out:good0"]


def test_a_rows_own_error_fails_its_request_alone_and_its_other_rows_are_dropped() -> None:
    class RefusesOne(Recorder):
        def __call__(self, rows: list[FakeRow]) -> list:
            outputs: list = super().__call__(rows)
            return [
                NonFiniteOutput(NonFiniteOutput.MESSAGE) if row.tag == "bad1" else out
                for row, out in zip(rows, outputs, strict=True)
            ]

    async def scenario(batcher, runner, _):
        runner.gate.clear()  # every request queued before the first batch runs: they share it
        bad = asyncio.ensure_future(batcher.submit(rows("bad", [5, 5, 5]), Ticket.with_timeout(5)))
        good = asyncio.ensure_future(batcher.submit(rows("good", [5, 5]), Ticket.with_timeout(5)))
        await asyncio.sleep(0.05)
        runner.gate.set()
        with pytest.raises(NonFiniteOutput, match="NaN or an infinity"):
            await bad
        return await good, runner.batches

    answer, batches = run(scenario, runner=RefusesOne(), max_wait_s=0.2)
    assert answer == ["out:good0", "out:good1"]
    assert [row.tag for row in batches[0]] == ["bad0", "bad1", "bad2", "good0", "good1"]  # one batch held them all


def test_a_batch_failing_on_the_device_thread_does_not_touch_the_batch_queued_behind_it() -> None:
    async def scenario(batcher, runner, observer):
        runner.gate.clear()
        bad = asyncio.create_task(batcher.submit(rows("bad", [5]), Ticket.with_timeout(5)))
        await until(on_device(batcher, 1), "the failing batch on the device")
        good = asyncio.create_task(batcher.submit(rows("good", [5] * 8), Ticket.with_timeout(5)))  # queued behind
        await until(on_device(batcher, 2), "the good batch handed to the device thread behind it")
        runner.gate.set()
        with pytest.raises(InferenceFailed):
            await bad
        return await good, len(observer.batches)

    answers, batches = run(scenario, runner=Recorder(fail_on="bad0"))
    assert answers == [f"out:good{i}" for i in range(8)] and batches == 2


def test_stopping_answers_both_batches_on_the_device_thread() -> None:
    async def main():
        runner = Recorder()
        batcher = Batcher("test", runner, max_batch_size=8, max_batch_tokens=1024, max_wait_s=0.02, max_queue_rows=100)
        batcher.start()
        runner.gate.clear()
        first = asyncio.create_task(batcher.submit(rows("a", [5]), Ticket.with_timeout(5)))
        await until(on_device(batcher, 1), "the first batch on the device")
        second = asyncio.create_task(batcher.submit(rows("b", [5] * 8), Ticket.with_timeout(5)))
        await until(on_device(batcher, 2), "the second batch handed to the device thread")
        stopping = asyncio.create_task(batcher.stop())
        await until(lambda: batcher._task is not None and batcher._task.done(), "stop() ended the batcher's loop")
        await asyncio.sleep(0.05)  # time to end, had it not waited for the device (which the gate holds)
        assert not stopping.done()  # it waits for the batches on the device
        runner.gate.set()
        await stopping
        return await first, await second

    first, second = asyncio.run(main())
    assert first == ["out:a0"] and second == [f"out:b{i}" for i in range(8)]


def test_stopping_while_a_batch_is_prepared_answers_it_at_once() -> None:
    entered, release = threading.Event(), threading.Event()

    def prepare(rows: list[FakeRow]) -> list[FakeRow]:
        entered.set()
        release.wait(5)
        return rows

    async def scenario(batcher, runner, _):
        request = asyncio.create_task(batcher.submit(rows("a", [5]), Ticket.with_timeout(30)))
        await until(entered.is_set, "the batch taken to be prepared")
        threading.Timer(0.2, release.set).start()  # stop() waits for the prepare thread, blocking this loop
        started = time.monotonic()
        await batcher.stop()
        with pytest.raises(NotReady):
            await request
        return time.monotonic() - started

    assert run(scenario, prepare=prepare, max_wait_s=0.0) < 2  # not left to its 30 s deadline


def test_when_a_batch_ends_the_next_goes_to_the_device_before_its_rows_are_answered() -> None:
    """The device waits for the loop to hand it the next batch, not for the loop to answer the last one's rows."""
    on_device_when_answered: dict[str, int] = {}

    async def scenario(batcher, runner, _):
        async def request(tag: str) -> None:
            await batcher.submit(rows(tag, [5]), Ticket.with_timeout(5))
            on_device_when_answered[tag] = batcher._batches_on_device()

        runner.gate.clear()  # "d" must come while the batch of "a", "b" and "c" runs: it is held until then
        first = [asyncio.create_task(request(tag)) for tag in "abc"]
        await until(lambda: batcher.device_busy_s() > 0, "the first batch on the device")
        last = asyncio.create_task(request("d"))
        await until(lambda: batcher.queued_rows == 1, '"d" queued')
        runner.gate.set()
        await asyncio.gather(*first, last)  # "d" waits for the device; it is on it before "a" is answered

    run(scenario, runner=Recorder(delay=0.2), max_wait_s=0.0)
    assert on_device_when_answered == {"a": 1, "b": 1, "c": 1, "d": 0}


def test_requests_close_in_time_share_a_batch() -> None:
    async def scenario(batcher, runner, _):
        first = asyncio.create_task(batcher.submit(rows("a", [5]), Ticket.with_timeout(5)))
        await asyncio.sleep(0.01)
        second = asyncio.create_task(batcher.submit(rows("b", [6]), Ticket.with_timeout(5)))
        await asyncio.gather(first, second)
        return runner.batches

    batches = run(scenario, max_wait_s=0.2)
    assert len(batches) == 1 and len(batches[0]) == 2


def test_without_a_wait_a_lone_row_starts_at_once_and_rows_gather_while_the_device_is_busy() -> None:
    async def scenario(batcher, runner, _):
        first = asyncio.create_task(batcher.submit(rows("a", [5]), Ticket.with_timeout(5)))
        await until(lambda: runner.batches, "a lone row started, no company coming")
        started_alone = [[row.tag for row in batch] for batch in runner.batches]
        later = [asyncio.create_task(batcher.submit(rows(k, [5]), Ticket.with_timeout(5))) for k in "bcd"]
        await asyncio.gather(first, *later)
        return started_alone, [[row.tag for row in batch] for batch in runner.batches]

    started_alone, batches = run(scenario, runner=Recorder(delay=0.2), max_wait_s=0.0)
    assert started_alone == [["a0"]]  # on the device with no company coming
    assert batches == [["a0"], ["b0", "c0", "d0"]]  # the three that came while it ran went together


def test_ticket_timings() -> None:
    async def scenario(batcher, runner, _):
        ticket = Ticket.with_timeout(5)
        await batcher.submit(rows("t", [5] * 20), ticket)
        return ticket

    ticket = run(scenario, runner=Recorder(delay=0.01), max_batch_size=8)
    assert ticket.inference_calls == 3
    assert ticket.inference_seconds >= 0.03
    assert ticket.queue_seconds > 0


def test_padding_ratio_keeps_unlike_lengths_apart() -> None:
    async def scenario(batcher, runner, observer):
        runner.gate.clear()  # hold the runner so that everything is queued before batches form
        first = asyncio.create_task(batcher.submit(rows("hold", [4]), Ticket.with_timeout(5)))
        await until(on_device(batcher, 1), "the held batch on the device")
        await asyncio.gather(
            batcher.submit(rows("s", [10, 11, 10, 30, 31, 29, 10]), Ticket.with_timeout(5)),
            asyncio.sleep(0.01, result=runner.gate.set()),
        )
        await first
        return observer.batches[1:]

    batches = run(scenario, max_batch_size=8, max_padding_ratio=1.1)
    assert sorted(rows_ for rows_, _, _ in batches) == [3, 4]
    assert all(padded <= 1.1 * real for _, padded, real in batches)


def test_a_batch_fills_its_bucket_before_a_nearer_row_widens_it() -> None:
    """On a grid of widths 8, 16, 24, 32: the oldest row is 23 tokens long; 24 is nearer than 20 and 19, and so is
    25, but 25 would make the batch pay for 32-token rows. The shorter rows go first, in the 24-token bucket."""
    grid = ShapeGrid(max_rows=4, max_width=32, max_tokens=1024, width_step=8)

    async def scenario(batcher, runner, observer):
        runner.gate.clear()  # hold the runner so that everything is queued before batches form
        first = asyncio.create_task(batcher.submit(rows("hold", [4]), Ticket.with_timeout(5)))
        await until(on_device(batcher, 1), "the held batch on the device")
        await asyncio.gather(
            batcher.submit(rows("s", [23, 25, 24, 20, 19, 18]), Ticket.with_timeout(5)),
            asyncio.sleep(0.01, result=runner.gate.set()),
        )
        await first
        return runner.batches[1:], observer.batches[1:]

    batches, observed = run(scenario, max_batch_size=4, padded_cost=grid.padded_cost)
    assert sorted(row.length for row in batches[0]) == [19, 20, 23, 24]
    assert observed[0][1] == 4 * 24  # the bucket's padded tokens: no row of 25 pulled it up to 32
    assert sorted(row.length for row in batches[1]) == [18, 25]


class TimedRunner:
    """Runs each batch for `seconds` and notes when, on the device thread's clock."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.spans: list[tuple[float, float]] = []  # (started, ended) per batch

    def __call__(self, rows: list[FakeRow]) -> list[str]:
        started = time.monotonic()
        time.sleep(self.seconds)
        self.spans.append((started, time.monotonic()))
        return [f"out:{row.tag}" for row in rows]


def test_a_prepared_batch_reaches_the_device_while_the_event_loop_is_busy() -> None:
    """The prepare thread queues the padded batch on the device thread itself: the device does not wait for an event
    loop busy with other work (an engine's loop, with every request's frames) to hand the batch over."""
    loop_of: dict[str, asyncio.AbstractEventLoop] = {}
    prepared_at: list[float] = []
    held = threading.Event()

    def hold_the_loop() -> None:
        held.set()
        time.sleep(0.5)

    def prepare(rows: list[FakeRow]) -> list[FakeRow]:
        loop_of["loop"].call_soon_threadsafe(hold_the_loop)  # the event loop is held for half a second
        held.wait(PROMISE_S)  # ... and is held by now
        prepared_at.append(time.monotonic())
        return rows

    async def scenario(batcher, runner, _):
        loop_of["loop"] = asyncio.get_running_loop()
        return await batcher.submit(rows("a", [5]), Ticket.with_timeout(5))

    runner = TimedRunner(0.01)
    assert run(scenario, runner=runner, prepare=prepare, max_wait_s=0.0) == ["out:a0"]
    assert runner.spans[0][0] - prepared_at[0] < 0.25  # handed back to the held loop first, it waited ~0.45 s


def test_with_one_stream_the_next_batch_is_on_the_device_thread_when_the_running_one_ends() -> None:
    """Rows arrive steadily, no batch fills, and handing a batch over takes 40 ms (padding here; on a GPU server,
    mostly an event loop busy with frames). Taken once the device was free, every batch left the device idle that
    long; the batcher learns to take it early enough that the device goes from one batch to the next."""

    def prepare(rows: list[FakeRow]) -> list[FakeRow]:
        time.sleep(0.04)
        return rows

    async def scenario(batcher, runner, _):
        requests, until = [], time.monotonic() + 2.0
        while time.monotonic() < until:
            request = rows(f"r{len(requests)}-", [5])
            requests.append(asyncio.create_task(batcher.submit(request, Ticket.with_timeout(10))))
            await asyncio.sleep(0.01)
        answers = await asyncio.gather(*requests)
        assert answers == [[f"out:r{i}-0"] for i in range(len(requests))]
        return until

    runner = TimedRunner(0.1)
    until = run(scenario, runner=runner, prepare=prepare, max_wait_s=0.0, max_batch_size=64, max_queue_rows=1000)
    spans = runner.spans
    # the gaps before the batches of the second second, while rows still came: the lead is learnt by then
    gaps = [after[0] - before[1] for before, after in itertools.pairwise(spans) if until - 1 < after[0] < until]
    assert len(gaps) >= 6
    assert sorted(gaps)[len(gaps) // 2] < 0.02, gaps  # taken once the device was free: 0.04 s or more each


def _plain_take(options: dict, live: list[FakeRow]) -> list[str]:
    """The batch the rule takes from just these rows (in arrival order), written plainly: the rows sorted by length
    (stably), the oldest row's neighbours added one at a time, the nearer in length first, each cost asked of the
    cost function itself. The batcher keeps its queue in views updated per request and per batch, and its costs in
    a table: it must take what this takes."""
    cost = options.get("padded_cost") or (lambda count, width: count * width)
    budget, size = options["max_batch_tokens"], options["max_batch_size"]
    ratio = options.get("max_padding_ratio", float("inf"))
    if not live:
        return []
    ordered = sorted(live, key=lambda row: row.length)
    low = high = ordered.index(live[0])  # the first of its length: sorting is stable
    target = width = real = live[0].length
    while high - low + 1 < size:
        count = high - low + 2
        left = ordered[low - 1].length if low > 0 else None
        right = ordered[high + 1].length if high < len(ordered) - 1 else None
        fits_left = left is not None and cost(count, width) <= budget and width * count <= ratio * (real + left)
        fits_right = right is not None and cost(count, right) <= budget and right * count <= ratio * (real + right)
        if fits_left and (not fits_right or target - left <= right - target or cost(count, right) > cost(count, width)):
            low, real = low - 1, real + left
        elif fits_right:
            high, real, width = high + 1, real + right, right
        else:
            break
    return [row.tag for row in ordered[low : high + 1]]


@pytest.mark.parametrize(
    "options",
    [
        {"max_batch_size": 8, "max_batch_tokens": 256},
        {"max_batch_size": 32, "max_batch_tokens": 512, "max_padding_ratio": 1.5},
        {"max_batch_size": 16, "max_batch_tokens": 400, "padded_cost": lambda count, width: count * -(-width // 8) * 8},
        {"max_batch_size": 64, "max_batch_tokens": 1024, "padded_cost": ShapeGrid(64, 64, 1024, 8).padded_cost},
        {
            "max_batch_size": 32,
            "max_batch_tokens": 700,
            "max_padding_ratio": 1.25,
            "padded_cost": ShapeGrid(32, 64, 700, 4).padded_cost,
        },
    ],
)
def test_batches_taken_match_a_plain_sort_of_the_queue(options):
    """The queue is kept in views updated per request and per batch (no pass over every row per batch), the costs in
    a table; what a batch takes must be what the rule, applied plainly to the live rows each time, gives, through
    enqueues, cancelled requests and takes."""

    async def main():
        batcher = Batcher("test", Recorder(), max_wait_s=0.02, max_queue_rows=10_000, **options)
        batcher._task = asyncio.get_running_loop().create_future()  # "running", without the loop taking batches
        rng = random.Random(7)
        pending: list = []  # (request number, row), arrival order
        tickets: dict[int, Ticket] = {}
        dead: set[int] = set()
        taken = 0
        for step in range(3000):
            action = rng.random()
            if action < 0.45:
                number = step
                tickets[number] = Ticket.with_timeout(600)
                lengths = [rng.choice([3, 5, 5, 8, 9, 12, 16, 17, 24, 31, 40, 64]) for _ in range(rng.randint(1, 16))]
                batch_rows = rows(f"r{number}.", lengths)
                batcher.enqueue(batch_rows, tickets[number])
                pending += [(number, row) for row in batch_rows]
            elif action < 0.55 and pending:
                number = rng.choice(pending)[0]
                tickets[number].cancel()  # the client went away: its rows are dropped when the next batch is taken
                dead.add(number)
            else:
                pending = [(number, row) for number, row in pending if number not in dead]
                expected = _plain_take(options, [row for _, row in pending])
                batch = batcher._take_batch()
                assert [item.row.tag for item in batch] == expected, f"step {step}"
                chosen = set(expected)
                pending = [(number, row) for number, row in pending if row.tag not in chosen]
                taken += bool(batch)
                assert batcher.queued_rows == len(pending)
                assert batcher._pending_tokens == sum(row.length for _, row in pending)
        assert taken > 100
        batcher._task.cancel()
        batcher._task = None
        await batcher.stop()

    asyncio.run(main())
