"""The CPU budget (service.system.cpus) read from cgroup trees laid out as a container, a Kubernetes node and a plain
host show them: cgroup v1 and v2, a quota on the process's own cgroup or on one above it, none at all."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from service.settings import Settings
from service.system.cpus import cpu_budget, cpu_quota

AFFINITY = len(os.sched_getaffinity(0))


def tree(root: Path, cgroup: str, files: dict[str, str]) -> Path:
    """A file system root with /proc/self/cgroup and the given files under it."""
    (root / "proc" / "self").mkdir(parents=True)
    (root / "proc" / "self" / "cgroup").write_text(cgroup)
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return root


V1_CONTAINER = (
    "5:devices:/libpod_parent/libpod-ef53\n1:cpu,cpuacct:/libpod_parent/libpod-ef53\n0::/libpod_parent/libpod-ef53\n"
)


def test_a_v1_container_sees_its_quota_on_its_own_mount(tmp_path: Path) -> None:
    """`docker run --cpus 1.5` on cgroup v1: the container's cgroup is mounted at the controller's root, so the
    host's path named in /proc/self/cgroup is not there; 1.5 CPUs rounds down to 1."""
    files = {
        "sys/fs/cgroup/cpu,cpuacct/cpu.cfs_quota_us": "150000\n",
        "sys/fs/cgroup/cpu,cpuacct/cpu.cfs_period_us": "100000\n",
    }
    root = tree(tmp_path, V1_CONTAINER, files)
    assert cpu_quota(root) == 1.5
    assert cpu_budget(root) == 1


def test_the_tightest_quota_on_the_way_up_counts(tmp_path: Path) -> None:
    """A Kubernetes pod's limit sits on the pod's cgroup; the container's own has none (-1), v1 and v2 alike."""
    v1 = tree(
        tmp_path / "v1",
        "1:cpu:/kubepods/pod1/ctr\n",
        {
            "sys/fs/cgroup/cpu/kubepods/pod1/ctr/cpu.cfs_quota_us": "-1",
            "sys/fs/cgroup/cpu/kubepods/pod1/ctr/cpu.cfs_period_us": "100000",
            "sys/fs/cgroup/cpu/kubepods/pod1/cpu.cfs_quota_us": "300000",
            "sys/fs/cgroup/cpu/kubepods/pod1/cpu.cfs_period_us": "100000",
            "sys/fs/cgroup/cpu/kubepods/cpu.cfs_quota_us": "800000",
            "sys/fs/cgroup/cpu/kubepods/cpu.cfs_period_us": "100000",
        },
    )
    assert cpu_quota(v1) == 3.0
    v2 = tree(
        tmp_path / "v2",
        "0::/kubepods.slice/pod1.slice/ctr.scope\n",
        {
            "sys/fs/cgroup/kubepods.slice/pod1.slice/ctr.scope/cpu.max": "max 100000\n",
            "sys/fs/cgroup/kubepods.slice/pod1.slice/cpu.max": "50000 100000\n",
            "sys/fs/cgroup/cpu.max": "max 100000\n",
        },
    )
    assert cpu_quota(v2) == 0.5
    assert cpu_budget(v2) == 1  # never below one
    assert cpu_budget(v1) == min(AFFINITY, 3)


def test_no_quota_leaves_the_affinity(tmp_path: Path) -> None:
    host = tree(
        tmp_path / "host",
        "1:cpu:/\n0::/\n",
        {"sys/fs/cgroup/cpu/cpu.cfs_quota_us": "-1", "sys/fs/cgroup/cpu/cpu.cfs_period_us": "100000"},
    )
    assert cpu_quota(host) is None and cpu_budget(host) == AFFINITY
    v2 = tree(tmp_path / "v2", "0::/user.slice\n", {"sys/fs/cgroup/user.slice/cpu.max": "max 100000\n"})
    assert cpu_quota(v2) is None and cpu_budget(v2) == AFFINITY
    nothing = tmp_path / "nothing"
    nothing.mkdir()
    assert cpu_quota(nothing) is None and cpu_budget(nothing) == AFFINITY


@pytest.mark.parametrize("text", ["", "lots 100000", "100000 0", "200000"])
def test_files_that_cannot_be_read_as_a_quota_are_no_quota(tmp_path: Path, text: str) -> None:
    root = tree(tmp_path, "0::/\n", {"sys/fs/cgroup/cpu.max": text})
    assert cpu_quota(root) is None


def test_a_quota_above_the_affinity_leaves_the_affinity(tmp_path: Path) -> None:
    root = tree(tmp_path, "0::/\n", {"sys/fs/cgroup/cpu.max": f"{(AFFINITY + 4) * 100000} 100000"})
    assert cpu_quota(root) == AFFINITY + 4 and cpu_budget(root) == AFFINITY


def test_the_defaults_follow_the_budget_and_a_setting_overrides_it() -> None:
    budget = cpu_budget(Path("/"))
    assert Settings().session_threads == budget
    assert Settings().frontend_count == max(1, min(12, budget * 3 // 4))
    assert Settings(threads=7).session_threads == 7
