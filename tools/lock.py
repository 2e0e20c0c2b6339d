"""Writes constraints.txt: every package that `make install` and the Docker images install, pinned exactly.

    make lock                     # the newest versions pyproject.toml allows; then `make install` and `make test`
    make lock LOCK_ARGS=--keep    # keep today's pins, resolve only what they leave open (say, a new dependency)

It is one resolution, by pip's own resolver (`pip install --dry-run --ignore-installed --report`), of
`.[cpu,export,dev,loadtest,gpu]` plus `onnxruntime-gpu[cuda,cudnn]` (the CUDA and cuDNN wheels of the gpu image),
for this interpreter (CPython 3.11 on Linux x86_64). How the file is used:

- `make install`: `pip install -c constraints.txt -e '.[cpu,export,dev,loadtest]'`.
- The Dockerfile: `pip install --no-deps -c constraints.txt -r docker/requirements-IMAGE.txt`; those files name
  each image's packages without versions.

A constraints file installs nothing by itself, so it pins both onnxruntime and onnxruntime-gpu (which must never be
installed together: each install names one). torch keeps its local version, `+cpu`: pip then takes the CPU build
(from a find-links directory, or the PyTorch CPU index: `make install TORCH_INDEX_URL=...`) and never PyPI's CUDA
build; the resolution must therefore find the CPU wheel, or this script stops.

tests/test_lock.py checks the file against pyproject.toml, the installed environment and docker/.
"""

from __future__ import annotations

import argparse
import json
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


def normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def resolve(keep: bool) -> dict[str, str]:
    """{name: version} of the whole closure, from pip's resolver (nothing is installed)."""
    with tempfile.TemporaryDirectory(prefix="lock-") as workdir:
        report = Path(workdir) / "report.json"
        command = [sys.executable, "-m", "pip", "install", "--dry-run", "--ignore-installed", "--quiet"]
        command += ["--report", str(report), f".[{EXTRAS}]", *ALSO]
        if keep and LOCK.is_file():
            command += ["-c", str(LOCK)]
        subprocess.run(command, cwd=ROOT, check=True)
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
    args = parser.parse_args()
    pins = resolve(args.keep)
    torch = next(version for name, version in pins.items() if normalize(name) == "torch")
    if not torch.endswith("+cpu"):
        raise SystemExit(
            f"torch resolved to {torch}, not a CPU build: give pip the CPU wheel (PIP_FIND_LINKS=DIR, or "
            "PIP_EXTRA_INDEX_URL=https://download.pytorch.org/whl/cpu) and run again"
        )
    LOCK.write_text(render(pins), encoding="utf-8")
    print(f"{LOCK.relative_to(ROOT)}: {len(pins)} packages", file=sys.stderr)


if __name__ == "__main__":
    main()
