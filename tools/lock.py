"""Writes constraints.txt: every package that `make install` and the Docker images install, pinned exactly, each
pin a release that PyPI serves.

    make lock                         # the newest versions pyproject.toml allows; then `make install` and `make test`
    make lock LOCK_ARGS=--keep        # keep today's pins, resolve only what they leave open (say, a new dependency)
    python tools/lock.py --check      # every pin is on PyPI (tests/test_lock.py runs it in `make test`)

It is one resolution, by pip's own resolver (`pip --isolated install --dry-run --ignore-installed --report`), of
`.[cpu,export,dev,loadtest,gpu]` plus `onnxruntime-gpu[cuda,cudnn]` (the CUDA and cuDNN wheels of the gpu image),
for this interpreter (CPython 3.11 on Linux x86_64), against PyPI alone: pip runs with `--isolated` (no PIP_*
environment variables, no per-user configuration) and PIP_CONFIG_FILE=/dev/null (no configuration file at all:
`--isolated` alone still reads the global and virtual-environment ones), so no find-links folder, mirror, extra
index or constraint of this machine counts, and pip reads its default index, PyPI. Only the CA bundle is passed on
(PIP_CERT, else pip's configured `cert`), for machines whose TLS goes through a local certificate authority. The
lock never holds a local version label (`+cpu`): no public index serves one, and this script refuses to write one.

torch: PyPI's torch for Linux is the CUDA build. The lock pins its public version (`torch==2.13.0`) and, from the
same resolution, the CUDA wheels it needs (nvidia-*, cuda-*, triton; onnxruntime-gpu's CUDA and cuDNN wheels are
resolved together with them, so one environment can hold both). PEP 440: `==2.13.0` also matches `2.13.0+cpu`, and
pip prefers the local-labelled build when both are offered. So, with the same lock:

- where the PyTorch CPU index is given (`make install TORCH_INDEX_URL=<its URL>`) or a find-links folder holds the
  CPU wheel (as on this project's machines), pip installs the CPU build: one wheel of 192 MB, no CUDA wheels;
- where PyPI is all there is, pip installs PyPI's CUDA build: torch (527 MB) and 2.2 GB of CUDA wheels (the largest:
  nvidia-cublas 423 MB, nvidia-cudnn-cu13 366 MB), 2.7 GB in all, pinned by the lock too. It runs on a CPU alike.

(Sizes: the wheels for CPython 3.11 on Linux x86_64, measured on 2026-11-26.)

How the file is used:

- `make install`: `pip install -c constraints.txt -e '.[cpu,export,dev,loadtest]'`.
- The Dockerfile: `pip install --no-deps -c constraints.txt -r docker/requirements-IMAGE.txt`; those files name
  each image's packages without versions. The export stage installs torch on its own, from the PyTorch CPU index or a
  local wheel (the Dockerfile says how).

A constraints file installs nothing by itself, so it pins both onnxruntime and onnxruntime-gpu (which must never be
installed together: each install names one).

tests/test_lock.py checks the file against pyproject.toml, the installed environment, docker/ and PyPI (--check).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LOCK = ROOT / "constraints.txt"
EXTRAS = "cpu,export,dev,loadtest,gpu"
ALSO = ("onnxruntime-gpu[cuda,cudnn]",)  # the gpu image installs onnxruntime-gpu's CUDA and cuDNN wheels too
HEADER = """\
# Every package `make install` and the Docker images install, pinned exactly: use it as a pip constraints file
# (-c). Written by `make lock` (tools/lock.py, which says how); do not edit by hand. Checked by tests/test_lock.py.
"""
# A resolution that installs nothing. fast-deps: where the index offers no metadata files (PEP 658; the one this
# project's machines reach does not), pip reads each wheel's metadata with HTTP range requests instead of
# downloading the whole wheel (2.7 GB for torch's CUDA build and its wheels); where it does, pip uses those first.
DRY_RUN = ("install", "--dry-run", "--ignore-installed", "--use-feature=fast-deps", "--quiet")
# Per network request (pip --timeout) and for a whole pip run: an unreachable index fails the run, never hangs it.
REQUEST_TIMEOUT_S = 20
RUN_TIMEOUT_S = 300
CHECK_PROCESSES = 6  # pips checking the lock's pins at once (resolve_on_pypi)


class LockError(Exception):
    """The lock (or a resolution) cannot be what PyPI serves; the message says which pin and why."""


def normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def read_pins(text: str) -> dict[str, str]:
    """{name as written: version} of a lock's text (NAME==VERSION lines; comments and blank lines skipped)."""
    pins: dict[str, str] = {}
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            name, separator, version = line.partition("==")
            if not separator or not version.strip():
                raise LockError(f"{line!r} is not NAME==VERSION")
            pins[name.strip()] = version.strip()
    return pins


def local_labels(pins: dict[str, str]) -> list[str]:
    """The pins with a PEP 440 local version label (`torch==2.13.0+cpu`): no public index serves such a release,
    PyPI included (it refuses uploads with one), so a lock holding one cannot be installed from PyPI."""
    return [f"{name}=={version}" for name, version in pins.items() if "+" in version]


def isolated_pip(*args: str) -> list[str]:
    """A pip command that reads PyPI alone when run with ISOLATED_ENV: this machine's pip configuration and PIP_*
    environment are ignored, except for its CA bundle (PIP_CERT, else pip's configured `cert`), passed explicitly."""
    command = [sys.executable, "-m", "pip", "--isolated", "--disable-pip-version-check", *args]
    cert = os.environ.get("PIP_CERT") or configured_cert()
    return [*command, "--cert", cert] if cert else command


def isolated_env() -> dict[str, str]:
    """The environment for isolated_pip: PIP_CONFIG_FILE=/dev/null makes pip skip every configuration file (the
    global and virtual-environment ones too, which --isolated alone still reads)."""
    return {**os.environ, "PIP_CONFIG_FILE": os.devnull}


def configured_cert() -> str | None:
    result = subprocess.run(
        [sys.executable, "-m", "pip", "config", "get", "global.cert"], capture_output=True, text=True, timeout=60
    )
    return (result.stdout.strip() or None) if result.returncode == 0 else None


def run_pip(command: list[str], what: str) -> None:
    try:
        result = subprocess.run(
            command, cwd=ROOT, env=isolated_env(), capture_output=True, text=True, timeout=RUN_TIMEOUT_S
        )
    except subprocess.TimeoutExpired as error:
        raise LockError(f"{what}: pip ran past {RUN_TIMEOUT_S} s: is the index (PyPI) reachable?") from error
    if result.returncode != 0:
        errors = [line for line in result.stderr.splitlines() if line.startswith("ERROR")]
        # "No matching distribution found for NAME==X" names the pin; the line before it lists every version.
        lines = [line for line in errors if "No matching distribution" in line] or errors
        unreachable = [line.strip() for line in result.stderr.splitlines() if "connection" in line.lower()]
        if unreachable:  # pip stops at the first requirement it cannot find: it never waits on every pin
            raise LockError(
                f"could not reach the index (PyPI unless another is given), nothing checked: {unreachable[-1]}"
            )
        raise LockError(f"{what}: {'; '.join(lines or result.stderr.strip().splitlines()[-3:])}")


def check_on_pypi(pins: dict[str, str], index_url: str | None = None) -> dict[str, dict[str, object]]:
    """Raises LockError naming a pin that PyPI (or `index_url`) does not serve for this interpreter (pip stops at
    the first).

    First by parsing (local version labels), then by pip: `install --dry-run --no-deps --ignore-installed` of every
    pin, isolated from this machine's pip configuration, so no local wheel folder or mirror can answer for PyPI;
    pip's report must then hold exactly the pinned versions. Costs one index page per pin and its metadata (a
    metadata file, or a few range requests into the wheel): about 30 s for the lock, no wheel downloaded.
    """
    labelled = local_labels(pins)
    if labelled:
        raise LockError(f"local version labels, which PyPI never serves: {', '.join(labelled)}")
    return resolve_on_pypi(pins, index_url)


def resolve_on_pypi(pins: dict[str, str], index_url: str | None = None) -> dict[str, dict[str, object]]:
    """pip's dry-run of every pin on PyPI alone (no local-label check first); {normalized name: its metadata as
    PyPI serves it}. Raises LockError naming what pip could not find.

    The pins are split among CHECK_PROCESSES pips at once: each pin costs a few requests in turn, so one pip spends
    the check waiting on the network (92 s for the lock of 165 pins on a loaded test machine)."""
    names = list(pins)
    chunks = [names[start::CHECK_PROCESSES] for start in range(CHECK_PROCESSES)]
    with concurrent.futures.ThreadPoolExecutor(CHECK_PROCESSES) as pool:
        parts = list(pool.map(lambda chunk: _dry_run({name: pins[name] for name in chunk}, index_url), chunks))
    found = {name: metadata for part in parts for name, metadata in part.items()}
    wrong = [
        f"{name}=={version} (pip found {found[normalize(name)]['version'] if normalize(name) in found else 'nothing'})"
        for name, version in pins.items()
        if normalize(name) not in found or found[normalize(name)]["version"] != version
    ]
    if wrong:
        raise LockError(f"not on PyPI as pinned: {', '.join(wrong)}")
    return found


def _dry_run(pins: dict[str, str], index_url: str | None) -> dict[str, dict[str, object]]:
    """One pip's dry-run of `pins`, --no-deps: {normalized name: its metadata as the index serves it}."""
    if not pins:
        return {}
    with tempfile.TemporaryDirectory(prefix="lock-check-") as workdir:
        requirements = Path(workdir) / "pins.txt"
        requirements.write_text("".join(f"{name}=={version}\n" for name, version in pins.items()), encoding="utf-8")
        report = Path(workdir) / "report.json"
        command = isolated_pip(*DRY_RUN, "--no-deps", "--report", str(report))
        command += ["--timeout", str(REQUEST_TIMEOUT_S), "--retries", "1"]
        command += ["-r", str(requirements)]
        if index_url:
            command += ["--index-url", index_url]
        run_pip(command, "not on PyPI")
        installs = json.loads(report.read_text(encoding="utf-8"))["install"]
    return {normalize(item["metadata"]["name"]): item["metadata"] for item in installs}


def resolve(keep: bool) -> dict[str, str]:
    """{name: version} of the whole closure, from pip's resolver against PyPI alone (nothing is installed)."""
    with tempfile.TemporaryDirectory(prefix="lock-") as workdir:
        report = Path(workdir) / "report.json"
        command = isolated_pip(*DRY_RUN, "--report", str(report))
        command += ["--timeout", str(REQUEST_TIMEOUT_S), f".[{EXTRAS}]", *ALSO]
        if keep and LOCK.is_file():
            command += ["-c", str(LOCK)]
        subprocess.run(command, cwd=ROOT, env=isolated_env(), check=True)
        installs = json.loads(report.read_text(encoding="utf-8"))["install"]
    pins = {item["metadata"]["name"]: item["metadata"]["version"] for item in installs}
    pins.pop("bertserve")
    return pins


def render(pins: dict[str, str]) -> str:
    lines = [f"{name}=={pins[name]}" for name in sorted(pins, key=normalize)]
    return HEADER + "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--keep", action="store_true", help="resolve with the current pins as constraints")
    parser.add_argument(
        "--check",
        nargs="?",
        const=LOCK,
        type=Path,
        metavar="FILE",
        help="check that PyPI serves every pin of FILE (the lock by default) for this interpreter; write nothing",
    )
    args = parser.parse_args()
    if args.check:
        pins = read_pins(args.check.read_text(encoding="utf-8"))
        try:
            check_on_pypi(pins)
        except LockError as error:
            raise SystemExit(f"{args.check}: {error}") from None
        print(f"{args.check}: all {len(pins)} pins are on PyPI", file=sys.stderr)
        return
    pins = resolve(args.keep)
    labelled = local_labels(pins)
    if labelled:
        raise SystemExit(f"the resolution holds local version labels, which PyPI never serves: {labelled}")
    LOCK.write_text(render(pins), encoding="utf-8")
    print(f"{LOCK.relative_to(ROOT)}: {len(pins)} packages", file=sys.stderr)


if __name__ == "__main__":
    main()
