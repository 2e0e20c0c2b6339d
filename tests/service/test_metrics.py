"""Forgotten series (a model no longer served): gone from /metrics in both layouts. In process mode every process
writes its own file and a series cannot be removed from it, so `forget` leaves a mark the merge drops; a process
still reporting the series wins over another's mark whichever file is read first."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

from service.metrics import MULTIPROCESS_DIR, Metrics, forget, merged_exposition

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
