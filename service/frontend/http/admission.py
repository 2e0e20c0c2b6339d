"""Admission by time: refuse new work (429) once the work already admitted would take longer than a bound.

A queue bounded by a count (rows, requests) holds more or less time depending on the model and the machine: 2,048
rows of MiniLM on 2 cores were 20 s, as long as the whole request deadline. Bounded in time, a request is either
answered within about the bound or refused at once, where the client can retry elsewhere.

`AdmissionGate` is the front door of each HTTP process: by Little's law, requests in flight / the rate at which
the server has been finishing them is the time a new request should expect to spend. It knows nothing of HTTP.
The batcher bounds its own queue in time the same way, from its measured cost per token (service.engine.batcher).
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable

TAIL_FACTOR = 0.4  # the mean wait aimed at, as a share of the bound (see AdmissionGate.limit)


class AdmissionGate:
    """Admit while in flight / recent completion rate <= 0.4 x `max_queue_s`; always admit `min_in_flight`.

    The completion rate is the mean of the last `history` whole seconds: under overload, what the server can do
    (a mean, not the best second: an overestimate would admit more than the bound holds). `min_in_flight` lets
    a cold or idle server, which has no rate yet, learn one."""

    def __init__(
        self,
        max_queue_s: float,
        min_in_flight: int,
        history: int = 3,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.max_queue_s = max_queue_s
        self.min_in_flight = min_in_flight
        self.in_flight = 0
        self._clock = clock
        self._second = math.floor(clock())
        self._current = 0  # completions in the current second
        self._past: deque[int] = deque(maxlen=history)  # completions in each of the last whole seconds

    def rate(self) -> float:
        """Completions per second over the last whole seconds (or the current one, while there are none)."""
        self._roll()
        if not self._past:
            return float(self._current)
        return sum(self._past) / len(self._past)

    def limit(self) -> int:
        """Most requests in flight at once now: those the recent rate answers in 40% of the bound. Little's law
        gives the mean time in the server; the slowest admitted requests (p99, measured on 2 cores, open-loop
        overload at 3x) took 2.3x the median, so 40% keeps them, not only the average, within the bound."""
        return max(self.min_in_flight, int(self.rate() * self.max_queue_s * TAIL_FACTOR))

    def try_enter(self) -> bool:
        if self.in_flight >= self.limit():
            return False
        self.in_flight += 1
        return True

    def leave(self, completed: bool) -> None:
        """A request admitted earlier is over; `completed`: it was answered (its work counts in the rate)."""
        self.in_flight -= 1
        if completed:
            self._roll()
            self._current += 1

    def expected_wait_s(self) -> float:
        """Mean time the requests in flight now should take (Little's law)."""
        rate = self.rate()
        return self.in_flight / rate if rate else self.max_queue_s

    def retry_after_s(self) -> int:
        """A hint for the client: about when the work in flight now will be done."""
        return max(1, min(30, math.ceil(self.expected_wait_s())))

    def _roll(self) -> None:
        now = math.floor(self._clock())
        if now == self._second:
            return
        self._past.append(self._current)
        for _ in range(min(now - self._second - 1, self._past.maxlen or 0)):
            self._past.append(0)  # whole seconds with no completion
        self._second, self._current = now, 0
