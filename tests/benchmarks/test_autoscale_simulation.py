"""The simulated HPA's replica arithmetic, as the Kubernetes documentation gives it (no server needed)."""

from __future__ import annotations

from benchmarks.autoscale_simulation import Hpa, HpaSpec, queued_rows

UP = [{"type": "Percent", "value": 100, "periodSeconds": 15}, {"type": "Pods", "value": 4, "periodSeconds": 15}]
DOWN = [{"type": "Percent", "value": 50, "periodSeconds": 60}]


def spec(**changes) -> HpaSpec:
    base = HpaSpec("bertserve_engine_busy", 0.5, 2, 10, 0, 300, UP, DOWN)
    return HpaSpec(**{**base.__dict__, **changes})


def test_desired_is_ceil_of_ready_times_ratio_outside_the_tolerance() -> None:
    hpa = Hpa(spec())
    assert hpa.desired(0, ready=2, current=2, metric=0.54) == 2  # 8% over target: within the 10% tolerance
    assert hpa.desired(15, ready=2, current=2, metric=0.8) == 4  # ceil(2 x 1.6)
    assert hpa.desired(30, ready=4, current=4, metric=0.6) == 5  # ceil(4 x 1.2)


def test_scale_up_is_capped_by_the_policies() -> None:
    hpa = Hpa(spec())
    # ceil(3 x 10) = 30, 10 by maxReplicas, 7 by the policies (the larger of 100% -> 6 and +4 -> 7).
    assert hpa.desired(0, ready=3, current=3, metric=5.0) == 7
    # Within the same 15 s period the start of the period (3) still bounds it.
    assert hpa.desired(5, ready=3, current=7, metric=5.0) == 7
    assert hpa.desired(20, ready=7, current=7, metric=5.0) == 10


def test_scale_down_waits_for_the_stabilisation_window_and_halves_at_most() -> None:
    hpa = Hpa(spec())
    assert hpa.desired(0, ready=8, current=8, metric=0.5) == 8
    assert hpa.desired(15, ready=8, current=8, metric=0.05) == 8  # the 8 of t=0 is in the 300 s window
    assert hpa.desired(299, ready=8, current=8, metric=0.05) == 8
    assert hpa.desired(316, ready=8, current=8, metric=0.05) == 4  # 8 -> 2 wanted, 50% per 60 s: 4
    assert hpa.desired(330, ready=4, current=4, metric=0.05) == 4  # still within that 60 s period
    assert hpa.desired(377, ready=4, current=4, metric=0.05) == 2  # the minimum


def test_spec_reads_the_overlay_and_scales_its_time_constants() -> None:
    manifest = HpaSpec.from_manifest()
    scaled = manifest.scaled(0.1)
    assert scaled.target == manifest.target and scaled.sync_s == manifest.sync_s / 10
    assert scaled.down_window_s == manifest.down_window_s / 10
    assert [p["periodSeconds"] for p in scaled.up_policies] == [p["periodSeconds"] / 10 for p in manifest.up_policies]


def test_queued_rows_averages_the_gauge_over_the_window() -> None:
    samples = [(t, {"bertserve_queue_depth": depth}) for t, depth in ((0, 100), (10, 2), (11, 4), (12, 6))]
    assert queued_rows(samples, window=5) == 4
