"""A request's ticket: created by the front-end when a request is admitted, carried to the engine (in this process or
across the socket, as its deadline), filled in with the request's timings by the batcher."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from opentelemetry.trace import SpanContext


@dataclass(eq=False)
class Ticket:
    """One request's stake in the queue: its deadline, whether its client is still there, and its timings."""

    deadline: float  # time.monotonic() seconds
    cancelled: bool = False
    started: float = 0.0  # time.perf_counter() at admission, for the total time
    queue_seconds: float = 0.0  # longest wait of any of its rows
    inference_seconds: float = 0.0  # run time of the batches its rows were in
    inference_calls: int = 0
    on_cancel: list[Callable[[], None]] = field(default_factory=list)
    on_done: list[Callable[[], None]] = field(default_factory=list)  # at `done()`: the request is over
    on_charge: list[Callable[[int], None]] = field(default_factory=list)  # told the request's tokens, once known
    admitted_model: str | None = None  # the model whose own gate admitted the request at the door (its on_charge)
    admitted_at: float | None = None  # when the door admitted it (time.monotonic(), the admission gates' clock)
    request_id: str | None = None  # the HTTP request's x-request-id, for the log lines about its rows
    # Traces on and the request sampled: the span its time in the engine belongs to (its queue, its share of each
    # batch): an OpenTelemetry SpanContext, remote in an engine process
    trace: SpanContext | None = None

    @classmethod
    def with_timeout(cls, seconds: float, request_id: str | None = None) -> Ticket:
        return cls(deadline=time.monotonic() + seconds, request_id=request_id)

    def done(self) -> None:
        """The request is over (answered, failed or gone): tell whoever listens, once."""
        callbacks, self.on_done = self.on_done, []
        for callback in callbacks:
            callback()

    def cancel(self) -> None:
        """The client went away (or the deadline passed): drop the rows not run yet, tell whoever listens."""
        if not self.cancelled:
            self.cancelled = True
            for callback in self.on_cancel:
                callback()

    def charge(self, tokens: int) -> None:
        """The request's real work, once tokenized (every row it sends the engine): for the admission gate."""
        for callback in self.on_charge:
            callback(tokens)
