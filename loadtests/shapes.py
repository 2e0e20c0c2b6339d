"""Load schedules, as pure functions of the time since the start (the locustfile's LoadTestShape wraps them).

- `step`: closed loop, users send back to back; `step_users` more users every `step_seconds` up to `max_users`,
  then the test stops. The offered load of a stage is its user count (concurrency).
- `rate`: a fixed arrival rate per stage (requests/s over all users), each user pacing its requests at
  users / rate seconds apart; several `rates` make a sweep. The offered load of a stage is its target rate.
  The pacing holds while a user's request takes less than its interval: give enough `users`.

Both stop at `max_seconds` whatever the stages.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

ShapeKind = Literal["step", "rate"]
# Locust's --stop-timeout: how long the users' requests in flight at the end of the load may take to finish; one
# still unanswered then is a failure (one cut short sooner, by --max-requests, is left out, as Locust leaves it)
STOP_TIMEOUT_S = 10.0
UNANSWERED = f"no answer {STOP_TIMEOUT_S:g} s after the load stopped"  # such a request's error in requests.csv


@dataclass(frozen=True)
class Stage:
    index: int
    start_s: float
    end_s: float
    users: int
    rate: float | None = None  # requests/s over all users; None: closed loop, no wait

    @property
    def offered(self) -> float:
        return self.rate if self.rate is not None else float(self.users)


@dataclass(frozen=True)
class Schedule:
    kind: ShapeKind
    stages: tuple[Stage, ...]

    @property
    def duration_s(self) -> float:
        return self.stages[-1].end_s if self.stages else 0.0

    @property
    def offered_unit(self) -> str:
        return "users (concurrent, closed loop)" if self.kind == "step" else "target requests/s"

    def stage_at(self, elapsed_s: float) -> Stage | None:
        for stage in self.stages:
            if stage.start_s <= elapsed_s < stage.end_s:
                return stage
        return None


def _clip(stages: list[Stage], max_seconds: float) -> tuple[Stage, ...]:
    if max_seconds <= 0:
        raise ValueError("max_seconds must be positive")
    kept = [stage for stage in stages if stage.start_s < max_seconds]
    if kept and kept[-1].end_s > max_seconds:
        last = kept[-1]
        kept[-1] = Stage(last.index, last.start_s, max_seconds, last.users, last.rate)
    return tuple(kept)


def step_schedule(step_users: int, step_seconds: float, max_users: int, max_seconds: float) -> Schedule:
    if step_users < 1 or max_users < step_users or not 0 < step_seconds < math.inf:  # NaN too: no stage at all
        raise ValueError("step load: need 1 <= step_users <= max_users and a finite step_seconds > 0")
    count = math.ceil(max_users / step_users)
    stages = [
        Stage(i, i * step_seconds, (i + 1) * step_seconds, min(step_users * (i + 1), max_users)) for i in range(count)
    ]
    return Schedule("step", _clip(stages, max_seconds))


def default_rate_users(rates: list[float]) -> int:
    """Enough users that each may wait up to half a second per request and still keep the pace (4 to 256)."""
    return min(256, max(4, math.ceil(max(rates) * 0.5)))


def rate_schedule(rates: list[float], stage_seconds: float, users: int | None, max_seconds: float) -> Schedule:
    if not rates or not all(0 < rate < math.inf for rate in rates) or not 0 < stage_seconds < math.inf:
        raise ValueError("rate load: need finite positive rates and a finite stage_seconds > 0")  # NaN, inf too
    users = users or default_rate_users(rates)
    if users < 1:
        raise ValueError("rate load: need at least one user")
    stages = [Stage(i, i * stage_seconds, (i + 1) * stage_seconds, users, float(rate)) for i, rate in enumerate(rates)]
    return Schedule("rate", _clip(stages, max_seconds))


def pacing_wait(interval_s: float, now: float, last_start: float | None, phase: float) -> float:
    """Seconds to wait before a user's next request so its requests start `interval_s` apart.

    The first request waits `phase` (a random fraction of the interval, so users do not fire together); a
    user that fell behind (a slow answer) goes again at once rather than bursting to catch up.
    """
    if last_start is None:
        return max(0.0, phase)
    return max(0.0, last_start + interval_s - now)


def parse_rates(text: str) -> list[float]:
    """--rates' numbers; ValueError naming the option and the value that is not one."""
    rates = []
    for part in text.split(","):
        if not part.strip():
            continue
        try:
            rates.append(float(part))
        except ValueError:
            raise ValueError(f"--rates: {part.strip()[:40]!r} is not a number (requests/s, comma-separated)") from None
    return rates
