"""The admission gate alone, on a clock the test moves."""

from __future__ import annotations

from service.frontend.http.admission import AdmissionGate


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def finish(gate: AdmissionGate, count: int) -> None:
    for _ in range(count):
        assert gate.try_enter()
        gate.leave(completed=True)


def test_a_cold_gate_admits_its_floor_and_no_more() -> None:
    gate = AdmissionGate(max_queue_s=2.0, min_in_flight=4, clock=Clock())
    assert [gate.try_enter() for _ in range(5)] == [True] * 4 + [False]
    assert gate.in_flight == 4


def test_the_limit_is_the_measured_rate_times_the_bound() -> None:
    clock = Clock()
    gate = AdmissionGate(max_queue_s=2.0, min_in_flight=4, clock=clock)
    finish(gate, 50)  # 50 answered in this second
    clock.now += 1
    assert gate.rate() == 50
    assert gate.limit() == 40  # a mean wait of 40% of the bound: the slowest stay within it
    admitted = sum(gate.try_enter() for _ in range(150))
    assert admitted == 40
    assert gate.retry_after_s() == 1  # 40 in flight at 50/s


def test_failed_requests_do_not_count_as_capacity() -> None:
    clock = Clock()
    gate = AdmissionGate(max_queue_s=1.0, min_in_flight=2, clock=clock)
    for _ in range(30):
        assert gate.try_enter()
        gate.leave(completed=False)
    clock.now += 1
    assert gate.rate() == 0 and gate.limit() == 2


def test_the_rate_is_the_mean_of_recent_seconds_and_an_idle_gate_forgets_it() -> None:
    clock = Clock()
    gate = AdmissionGate(max_queue_s=1.0, min_in_flight=1, history=3, clock=clock)
    for count in (40, 20, 30):
        finish(gate, count)
        clock.now += 1
    assert gate.rate() == 30
    finish(gate, 60)
    clock.now += 1
    assert gate.rate() == (20 + 30 + 60) / 3  # the oldest second has left the window
    clock.now += 10  # idle seconds: nothing answered
    assert gate.rate() == 0 and gate.limit() == 1
