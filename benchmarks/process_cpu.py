"""CPU time of a server's processes while a load runs, by role (launcher, engine, front-ends), from /proc.

Where the GPU is not the limit, this says what is: front-ends near one core each are saturated, an engine near
one core is bound by its interpreter lock. Linux only; elsewhere the summary is None.

Beside it, what the rest of the machine did meanwhile (`OtherCpu`): on two shared cores, another program's work
moves every figure (an overload run beside a test read a p99 of 6.58 s where quiet runs read 1.3 s), and a
benchmark that does not say so reports a busy machine as the server's fault.
"""

from __future__ import annotations

import os
import resource
import time
from pathlib import Path

PROC = Path("/proc")
ROLES = (("service.engine", "engine"), ("service.frontend", "front-ends"))  # by command line; else "launcher"
# Cores the rest of the machine may use while a benchmark measures before its figures are called a busy machine's:
# a quiet 2-core machine here read 0.03 (system daemons, the terminal), one with a busy loop beside it 0.56
BUSY_MACHINE_CORES = 0.25


def _cpu_seconds(pid: int) -> float | None:
    """User + system CPU seconds of a process (all its threads), or None once it is gone."""
    try:
        fields = (PROC / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime


def _children(pid: int) -> list[int]:
    found = []
    for task in (PROC / str(pid) / "task").glob("*/children"):
        try:
            found += [int(child) for child in task.read_text().split()]
        except OSError:
            continue
    return found


def process_tree(root: int) -> list[int]:
    """`root` and every process below it."""
    tree, stack = [], [root]
    while stack:
        pid = stack.pop()
        tree.append(pid)
        stack += _children(pid)
    return tree


def role_of(pid: int) -> str:
    try:
        command = (PROC / str(pid) / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return "gone"
    return next((role for needle, role in ROLES if needle in command), "launcher")


class ProcessTreeCpu:
    """`with ProcessTreeCpu(server_pid) as cpu: ...` then `cpu.summary()`: cores used per role over the window,
    and the process count of each role. A process that starts inside the window counts from its start; one that
    ends inside it is not counted."""

    def __init__(self, root: int) -> None:
        self.root = root
        self._before: dict[int, float] = {}
        self._after: dict[int, float] = {}
        self._roles: dict[int, str] = {}
        self._seconds = 0.0

    def _read(self) -> dict[int, float]:
        times = {}
        for pid in process_tree(self.root):
            seconds = _cpu_seconds(pid)
            if seconds is not None:
                times[pid] = seconds
                self._roles.setdefault(pid, role_of(pid))
        return times

    def __enter__(self) -> ProcessTreeCpu:
        self._started = time.monotonic()
        self._before = self._read() if PROC.is_dir() else {}
        return self

    def __exit__(self, *_: object) -> None:
        self._seconds = time.monotonic() - self._started
        self._after = self._read() if PROC.is_dir() else {}

    def seconds(self) -> dict[str, float] | None:
        """CPU seconds (utime + stime) each role used over the window, unrounded: to divide by the work done."""
        if not self._after or self._seconds <= 0:
            return None
        used: dict[str, float] = {}
        for pid, seconds in self._after.items():
            role = self._roles[pid]
            used[role] = used.get(role, 0.0) + seconds - self._before.get(pid, 0.0)
        return used

    def summary(self) -> dict[str, dict[str, float]] | None:
        if not self._after or self._seconds <= 0:
            return None
        roles: dict[str, dict[str, float]] = {}
        for pid, seconds in self._after.items():
            role = roles.setdefault(self._roles[pid], {"cores": 0.0, "processes": 0})
            role["cores"] += (seconds - self._before.get(pid, 0.0)) / self._seconds
            role["processes"] += 1
        return {role: {"cores": round(v["cores"], 2), "processes": v["processes"]} for role, v in roles.items()}


def _machine_busy_seconds() -> float | None:
    """CPU seconds every core of the machine spent on anything but idling and waiting for I/O, from /proc/stat."""
    try:
        fields = (PROC / "stat").read_text().split("\n", 1)[0].split()
    except (OSError, IndexError):
        return None
    if not fields or fields[0] != "cpu":
        return None
    # user nice system idle iowait irq softirq steal (guest time is inside user)
    ticks = [int(value) for value in fields[1:9]]
    return (sum(ticks) - ticks[3] - ticks[4]) / os.sysconf("SC_CLK_TCK")


def _own_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)  # every thread of this process: the load's clients
    return usage.ru_utime + usage.ru_stime


class OtherCpu(ProcessTreeCpu):
    """`with OtherCpu(server_pid) as cpu: ...`: the server's CPU by role over the window (`ProcessTreeCpu`), and
    `cpu.cores()`, the cores the rest of the machine used meanwhile, beyond the server's process tree and this
    process (the benchmark's own clients). A figure taken while that is well above zero measured the machine's
    other work too (`busy_warning`)."""

    def __init__(self, root: int) -> None:
        super().__init__(root)
        self._machine: float | None = None  # the machine's busy seconds: at the start, then over the window
        self._own = 0.0

    def __enter__(self) -> OtherCpu:
        self._machine, self._own = _machine_busy_seconds(), _own_seconds()
        super().__enter__()
        return self

    def __exit__(self, *_: object) -> None:
        super().__exit__()
        machine = _machine_busy_seconds()
        self._machine = None if machine is None or self._machine is None else machine - self._machine
        self._own = _own_seconds() - self._own

    def cores(self) -> float | None:
        """Cores used by everything else over the window (None where /proc cannot tell)."""
        used = self.seconds()
        if self._machine is None or used is None:
            return None
        return max(0.0, self._machine - sum(used.values()) - self._own) / self._seconds


def busy_warning(other_cores: float | None) -> str | None:
    """What a report prints under a figure taken while the rest of the machine used over BUSY_MACHINE_CORES; None
    for a quiet one, or where /proc could not tell (or a report older than the reading)."""
    if other_cores is None or other_cores <= BUSY_MACHINE_CORES:
        return None
    return (
        f"WARNING: other programs used {other_cores:.2f} cores of this machine while it was measured (beyond the "
        f"server and this benchmark): the figures hold that work too; rerun on a quiet machine"
    )
