"""CPU time of a server's processes while a load runs, by role (launcher, engine, front-ends), from /proc.

Where the GPU is not the limit, this says what is: front-ends near one core each are saturated, an engine near
one core is bound by its interpreter lock. Linux only; elsewhere the summary is None.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

PROC = Path("/proc")
ROLES = (("service.engine", "engine"), ("service.frontend", "front-ends"))  # by command line; else "launcher"


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
