"""Forgotten series (a model no longer served): gone from /metrics in both layouts. In process mode every process
writes its own file and a series cannot be removed from it, so `forget` leaves a mark the merge drops; a process
still reporting the series wins over another's mark whichever file is read first. A process that exited has its
counters and histograms folded into the directory's totals, which the merge reports unchanged."""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from service.metrics import FOLD_LOCK, MULTIPROCESS_DIR, Metrics, fold_exited_process, forget, merged_exposition

ROOT = Path(__file__).resolve().parents[2]

# One process's writes: (model, that process forgets it) for a gauge merged by its lowest value (the admission
# share) and one merged by its highest (model ready)
WRITER = """
import sys
from service.metrics import Metrics, forget
metrics = Metrics()
for model, forgets in (arg.split("=") for arg in sys.argv[1:]):
    metrics.model_admission_share.labels(model).set(0.5)
    metrics.model_ready.labels(model).set(1)
    if forgets == "forget":
        forget(metrics.model_admission_share, model)
        forget(metrics.model_ready, model)
"""


def write(directory: Path, *models: str) -> None:
    env = {**os.environ, MULTIPROCESS_DIR: str(directory), "PYTHONPATH": str(ROOT)}
    subprocess.run([sys.executable, "-c", WRITER, *models], check=True, env=env, cwd=ROOT)


def series(exposition: bytes, name: str) -> dict[str, float]:
    """model -> value of the gauge `name`."""
    return {
        sample.labels["model"]: sample.value
        for family in text_string_to_metric_families(exposition.decode())
        if family.name == name
        for sample in family.samples
    }


def test_a_series_forgotten_by_every_process_is_gone_and_one_still_reported_stays(tmp_path: Path) -> None:
    # "gone": each process forgot it; "kept-1" and "kept-2": one forgot it, the other still reports it, in both
    # orders of the two processes' files (their pids)
    write(tmp_path, "gone=forget", "kept-1=forget", "kept-2=report", "never-forgotten=report")
    write(tmp_path, "gone=forget", "kept-1=report", "kept-2=forget")
    merged = merged_exposition(str(tmp_path))
    for name, value in (("bertserve_model_admission_share", 0.5), ("bertserve_model_ready", 1.0)):
        assert series(merged, name) == {"kept-1": value, "kept-2": value, "never-forgotten": value}, name


def test_in_one_process_a_forgotten_series_is_removed() -> None:
    assert MULTIPROCESS_DIR not in os.environ
    metrics = Metrics()
    metrics.series(metrics.model_admission_share, "gone").set(0.5)
    metrics.forget_series(metrics.model_admission_share, "gone")
    assert "gone" not in series(metrics.exposition(), "bertserve_model_admission_share")
    metrics.series(metrics.model_admission_share, "gone").set(0.7)  # served again: reported again
    assert series(metrics.exposition(), "bertserve_model_admission_share") == {"gone": 0.7}
    forget(metrics.model_ready, "never-set")  # nothing to remove: no error


# One process's requests (a counter), their durations (a histogram) and a live gauge; it prints its pid
COUNTER = """
import os, sys
from service.metrics import Metrics
metrics = Metrics()
for endpoint, n in (arg.split("=") for arg in sys.argv[1:]):
    for _ in range(int(n)):
        metrics.requests.labels("m", endpoint, "200").inc()
        metrics.request_duration.labels("m", endpoint).observe(0.003)
metrics.model_ready.labels("m").set(1)
print(os.getpid())
"""


def count(directory: Path, *requests: str) -> int:
    env = {**os.environ, MULTIPROCESS_DIR: str(directory), "PYTHONPATH": str(ROOT)}
    run = subprocess.run([sys.executable, "-c", COUNTER, *requests], check=True, env=env, cwd=ROOT, capture_output=True)
    return int(run.stdout)


def samples(exposition: bytes) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """The counters' and histograms' samples (a process's live gauges go with it)."""
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(exposition.decode())
        if family.type != "gauge"
        for sample in family.samples
    }


def test_an_exited_process_is_folded_into_the_totals_which_stay_as_they_were(tmp_path: Path) -> None:
    first, second = count(tmp_path, "classify=3", "ner=1"), count(tmp_path, "classify=2")
    before = samples(merged_exposition(str(tmp_path)))
    assert before[("bertserve_requests_total", (("endpoint", "classify"), ("model", "m"), ("status", "200")))] == 5
    fold_exited_process(first, str(tmp_path))
    fold_exited_process(second, str(tmp_path))
    after = samples(merged_exposition(str(tmp_path)))
    assert series(merged_exposition(str(tmp_path)), "bertserve_model_ready") == {}  # a live gauge: gone with them
    assert before == after
    files = sorted(path.name for path in tmp_path.glob("*.db"))
    assert files == ["counter_exited.db", "histogram_exited.db"], files
    # a third process adds to the totals, and is folded on them in turn
    third = count(tmp_path, "ner=4")
    fold_exited_process(third, str(tmp_path))
    totals = samples(merged_exposition(str(tmp_path)))
    ner = (("endpoint", "ner"), ("model", "m"), ("status", "200"))
    assert totals[("bertserve_requests_total", ner)] == 5
    assert (
        totals[("bertserve_request_duration_seconds_bucket", (("endpoint", "ner"), ("le", "0.005"), ("model", "m")))]
        == 5
    )
    assert sorted(path.name for path in tmp_path.glob("*.db")) == files


def test_a_scrape_during_folds_never_sees_a_total_fall_or_jump(tmp_path: Path) -> None:
    # many series a process: a fold long enough for scrapes to fall within it
    pids = [count(tmp_path, "classify=1", *(f"e{i}=1" for i in range(200))) for _ in range(8)]
    key = ("bertserve_requests_total", (("endpoint", "classify"), ("model", "m"), ("status", "200")))
    seen: list[float] = []
    done = threading.Event()

    def scrape() -> None:
        while not done.is_set():
            seen.append(samples(merged_exposition(str(tmp_path)))[key])

    scraper = threading.Thread(target=scrape)
    scraper.start()
    try:
        for pid in pids:
            fold_exited_process(pid, str(tmp_path))
    finally:
        done.set()
        scraper.join()
    assert seen and set(seen) == {8.0}, sorted(set(seen))


def test_a_scrape_that_never_ends_holds_off_the_fold_without_hanging_it(tmp_path: Path) -> None:
    """A front-end stopped in the middle of a scrape holds the directory's lock (shared) until the launcher kills
    it: the launcher's fold gives up within its wait, folds nothing, and folds it all once the lock is free."""
    pid = count(tmp_path, "classify=2")
    before = samples(merged_exposition(str(tmp_path)))
    with open(tmp_path / FOLD_LOCK, "a") as scrape:
        fcntl.flock(scrape, fcntl.LOCK_SH)
        started = time.monotonic()
        assert fold_exited_process(pid, str(tmp_path), wait_s=0.2) is False
        assert 0.2 <= time.monotonic() - started < 5
        assert (tmp_path / f"counter_{pid}.db").exists() and not (tmp_path / "counter_exited.db").exists()
    assert fold_exited_process(pid, str(tmp_path)) is True
    assert not (tmp_path / f"counter_{pid}.db").exists()
    assert samples(merged_exposition(str(tmp_path))) == before
