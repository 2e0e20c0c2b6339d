"""The benchmarks' CPU-by-role reader against a real process tree: a busy child named like a front-end."""

from __future__ import annotations

import subprocess
import sys
import time

from benchmarks.process_cpu import OtherCpu, ProcessTreeCpu, process_tree, role_of

BUSY = "import time\nend = time.time() + 3\nwhile time.time() < end: pass"


def test_a_busy_front_end_counts_as_a_front_end_and_its_idle_parent_as_the_launcher() -> None:
    # the child's command line names service.frontend; the parent's must not (it is built from two halves)
    spawn = f"import subprocess, sys; subprocess.run([sys.executable, '-c', {BUSY!r}, 'service.' + 'frontend'])"
    parent = subprocess.Popen([sys.executable, "-c", spawn])
    try:
        deadline = time.monotonic() + 10
        while len(process_tree(parent.pid)) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        child = process_tree(parent.pid)[1]
        assert role_of(parent.pid) == "launcher" and role_of(child) == "front-ends"
        with ProcessTreeCpu(parent.pid) as cpu:
            time.sleep(1.0)
        summary = cpu.summary()
    finally:
        parent.kill()
        parent.wait()
    assert summary is not None
    assert summary["front-ends"]["processes"] == 1 and summary["front-ends"]["cores"] > 0.3
    assert summary["launcher"]["cores"] < 0.3  # waiting on its child costs nothing


def test_a_process_that_is_gone_reads_as_nothing() -> None:
    finished = subprocess.run([sys.executable, "-c", "pass"], check=True)
    assert finished.returncode == 0
    with ProcessTreeCpu(2**22 + 7) as cpu:  # no such pid
        pass
    assert cpu.summary() is None


def test_other_work_on_the_machine_is_counted_apart_from_the_server_and_the_benchmark() -> None:
    """A busy program outside the server's tree reads as the machine's other work; the same program as the server
    does not; the benchmark's own busy thread does not either."""
    server = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    busy = subprocess.Popen([sys.executable, "-c", BUSY])
    try:
        time.sleep(0.3)
        with OtherCpu(server.pid) as other:
            time.sleep(1.0)
        with OtherCpu(busy.pid) as as_server:
            end = time.monotonic() + 1.0
            while time.monotonic() < end:  # this process's own work: the load's clients
                pass
    finally:
        for process in (server, busy):
            process.kill()
            process.wait()
    busy_outside, rest = other.cores(), as_server.cores()
    assert busy_outside is not None and busy_outside > 0.5, busy_outside
    # what is left is the rest of the machine: here nothing busy (on a loaded CI machine the test runner's others)
    assert rest is not None and rest < busy_outside, (rest, busy_outside)
