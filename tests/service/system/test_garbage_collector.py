"""garbage_collector.settle() in a fresh interpreter (it changes the whole process): start-up objects frozen, thresholds
raised, and cyclic garbage made afterwards still collected."""

from __future__ import annotations

import json
import subprocess
import sys

from service.system import garbage_collector

PROBE = """
import gc, json
from service.system import garbage_collector
from service.frontend.http.app import create_app  # start-up: the app's modules and objects
before = gc.get_freeze_count()
garbage_collector.settle()
frozen = gc.get_freeze_count()

class Node:
    pass

for _ in range(200_000):  # cycles made after start-up, more than YOUNG_THRESHOLD of them
    a, b = Node(), Node()
    a.other, b.other = b, a
alive = sum(1 for o in gc.get_objects() if type(o) is Node)
print(json.dumps({"before": before, "frozen": frozen, "threshold": gc.get_threshold(), "nodes_alive": alive}))
"""


def test_settle_freezes_start_up_and_still_collects_later_cycles() -> None:
    done = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=120, check=True)
    figures = json.loads(done.stdout.strip().splitlines()[-1])
    assert figures["before"] == 0
    assert figures["frozen"] > 10_000  # the modules, the app factory, pydantic's schemas...
    assert figures["threshold"] == [
        garbage_collector.YOUNG_THRESHOLD,
        garbage_collector.OLDER_THRESHOLD,
        garbage_collector.OLDER_THRESHOLD,
    ]
    assert figures["nodes_alive"] < 2 * garbage_collector.YOUNG_THRESHOLD  # 400k made: young collections freed most
