"""How many CPUs this process may use, which `os.cpu_count()` does not say inside a container.

`os.cpu_count()` counts the host's CPUs. A container limited with `docker run --cpus 1`, or a Kubernetes pod with a
CPU limit, gets a CFS quota instead: onnxruntime threads sized to the host's CPUs then spin against that quota and
are throttled. Here the count is the process's CPU affinity (cpusets: `--cpuset-cpus`, Kubernetes' static CPU
manager), capped by the tightest CPU quota on its cgroup and the cgroups above it, rounded down, at least 1.
Both cgroup versions are read: v2's `cpu.max` ("QUOTA PERIOD" or "max PERIOD") and v1's `cpu.cfs_quota_us` (-1:
none) over `cpu.cfs_period_us`.
"""

from __future__ import annotations

import functools
import math
import os
from collections.abc import Callable, Iterator
from pathlib import Path, PurePosixPath


@functools.cache
def available_cpus() -> int:
    """This process's CPU budget (see the module's docstring); read once."""
    return cpu_budget(Path("/"))


def cpu_budget(root: Path) -> int:
    """The CPU budget as seen under `root` (the file system root; a test gives a folder of its own)."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    quota = cpu_quota(root)
    return cpus if quota is None else max(1, min(cpus, math.floor(quota)))


def cpu_quota(root: Path) -> float | None:
    """The tightest CPU quota, in CPUs, on this process's cgroups (v1 cpu controller, v2 unified) and their
    ancestors; None where there is none or nothing can be read."""
    try:
        lines = (root / "proc" / "self" / "cgroup").read_text().splitlines()
    except OSError:
        return None
    limits: list[float] = []
    for line in lines:
        _, controllers, path = line.split(":", 2)
        if controllers == "":
            mounts: list[tuple[Path, Callable[[Path], float | None]]] = [(root / "sys/fs/cgroup", _v2_quota)]
        elif "cpu" in controllers.split(","):
            mounts = [(root / "sys/fs/cgroup" / name, _v1_quota) for name in ("cpu", "cpu,cpuacct", "cpuacct,cpu")]
        else:
            continue
        for base, read in mounts:
            if not base.is_dir():
                continue
            limits.extend(limit for folder in _ancestry(base, path) if (limit := read(folder)) is not None)
            break
    return min(limits) if limits else None


def _ancestry(base: Path, cgroup: str) -> Iterator[Path]:
    """The cgroup's folder under the mount and each folder above it, where they exist. In a container the mount is
    often the container's own cgroup, so the host's path named in /proc/self/cgroup is not there, but the mount
    itself (the last one given) is."""
    path = PurePosixPath(cgroup)
    for part in (path, *path.parents):
        folder = base / part.relative_to("/")
        if folder.is_dir():
            yield folder


def _v2_quota(folder: Path) -> float | None:
    try:
        quota, period = (folder / "cpu.max").read_text().split()
        return None if quota == "max" else _ratio(int(quota), int(period))
    except (OSError, ValueError):
        return None


def _v1_quota(folder: Path) -> float | None:
    try:
        return _ratio(int((folder / "cpu.cfs_quota_us").read_text()), int((folder / "cpu.cfs_period_us").read_text()))
    except (OSError, ValueError):
        return None


def _ratio(quota: int, period: int) -> float | None:
    """CPUs from a quota and its period, both in microseconds; None for no quota (v1 writes -1)."""
    return None if quota <= 0 or period <= 0 else quota / period
