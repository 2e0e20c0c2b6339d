"""How the launcher judges a child process stuck, on real child processes: from the state file it keeps writing."""

from __future__ import annotations

import sys
import time
from pathlib import Path

from service.probes import ALIVE, HeartbeatFile
from service.supervisor.launcher import Child

SILENT = [sys.executable, "-c", "import time; time.sleep(60)"]  # starts, and never writes its state file


def test_a_child_is_stuck_when_it_does_not_begin_to_serve_or_its_state_goes_stale(tmp_path: Path) -> None:
    child = Child("silent", SILENT, HeartbeatFile(tmp_path / "silent.state"), start_s=0.5)
    child.heartbeat.write(live=ALIVE)  # a state file left by the process before it
    child.start({})
    try:
        assert not child.heartbeat.path.exists()  # that earlier state does not stand for this process
        assert child.stuck(stall_s=1.0) is None  # starting, within its start bound
        time.sleep(0.7)
        assert child.stuck(stall_s=1.0) == "it has not begun to serve 1 s after its start"
        child.heartbeat.write(live=ALIVE)  # as a process whose app has started
        assert child.stuck(stall_s=1.0) is None
        time.sleep(1.2)  # no new beat: its event loop stopped
        why = child.stuck(stall_s=1.0)
        assert why is not None and why.startswith("the event loop has not run for 1.")
        child.heartbeat.write(live=(503, {"error": "not alive: model m: a batch has been on the device for 41 s"}))
        assert child.stuck(stall_s=1.0) == "not alive: model m: a batch has been on the device for 41 s"
    finally:
        child.signal(9)
        assert child.wait(5) == -9
