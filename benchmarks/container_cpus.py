"""A serving image under a CPU quota (`docker run --cpus N`): what the server chose, and what it serves. Prints figures.

The real MiniLM SST-2 checkpoint, exported (fp32) once into a work folder and mounted read-only; closed loops of
SST-2 sentences from outside the container (1-input: 16 clients; 16-input: 8 clients; `--seconds` each). Each
configuration is an image and BERTSERVE_* variables, run `--rounds` times in turn:

    python -m benchmarks.container_cpus [--image bertserve:cpu] [--cpus 1] [--rounds 2] [--seconds 10]
        [--config default=] [--config threads1=BERTSERVE_THREADS=1] [--config threads16=BERTSERVE_THREADS=16]

A config is NAME=[IMAGE;]VAR=VALUE,... (IMAGE defaults to --image). Needs `docker` on PATH (here:
../shared/container/setup.sh, then PATH=$PWD/../shared/container/bin:$PATH). The line the server logs for each
model ("1 stream(s) of 1 intra-op thread(s)", from this commit on) is printed beside the figures.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

from benchmarks.loadclient import run_load
from benchmarks.realdata import sst2
from benchmarks.reliability import CHECKPOINT, PATH, exported_repository
from benchmarks.reports import write_report
from tests.harness.serving import free_port


@dataclass
class Config:
    name: str
    image: str
    env: dict[str, str]

    @classmethod
    def parse(cls, text: str, image: str) -> Config:
        name, _, rest = text.partition("=")
        if ";" in rest:
            image, rest = rest.split(";", 1)
        env = dict(item.split("=", 1) for item in rest.split(",") if item)
        return cls(name, image, env)


def run(config: Config, cpus: str, repository: Path, seconds: float) -> dict:
    name = f"bertserve-cpus-{config.name}-{free_port()}"
    port = free_port()
    env = [
        arg for key, value in {"BERTSERVE_ACCESS_LOG": "off", **config.env}.items() for arg in ("-e", f"{key}={value}")
    ]
    volume = f"{repository}:/models:ro"
    command = ["docker", "run", "-d", "--name", name, "--cpus", cpus, "-p", f"127.0.0.1:{port}:8000", "-v", volume]
    subprocess.run([*command, *env, config.image], check=True, capture_output=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline:
            try:
                if httpx.get(url + "/readyz", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        else:
            raise RuntimeError(f"{config.name}: not ready in 240 s")
        logs = subprocess.run(["docker", "logs", name], capture_output=True, text=True)
        chosen = re.findall(rf"model {CHECKPOINT}: (.*)", logs.stdout + logs.stderr)
        texts = [text for text, _ in sst2()]
        run_load(url, PATH, [{"inputs": [t]} for t in texts[:64]], [1] * 64, clients=8, seconds=3)  # warm
        result: dict = {"config": config.name, "chosen": chosen[0] if chosen else None}
        groups = [texts[i : i + 16] for i in range(0, len(texts) - 15, 16)]
        for label, bodies, sizes, clients in (
            ("1-input", [{"inputs": [t]} for t in texts], [1] * len(texts), 16),
            ("16-input", [{"inputs": group} for group in groups], [16] * len(groups), 8),
        ):
            load = run_load(url, PATH, bodies, sizes, clients=clients, seconds=seconds)
            result[label] = {
                "sequences_per_s": round(load.sequences_per_s, 1),
                "p50_ms": round(load.percentile_ms(0.5), 1),
                "p99_ms": round(load.percentile_ms(0.99), 1),
            }
        return result
    finally:
        subprocess.run(["docker", "rm", "-f", name], capture_output=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.container_cpus", description=__doc__.split("\n\n")[0])
    parser.add_argument("--image", default="bertserve:cpu")
    parser.add_argument("--cpus", default="1", help="docker run --cpus")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--config", action="append", help="NAME=[IMAGE;]VAR=VALUE,... (default: default=)")
    parser.add_argument("--workdir", type=Path, default=Path(tempfile.gettempdir()) / "bertserve-reliability")
    args = parser.parse_args(argv)
    configs = [Config.parse(text, args.image) for text in args.config or ["default="]]
    repository = exported_repository(args.workdir)
    results = []
    for round_ in range(1, args.rounds + 1):
        for config in configs:
            result = {"round": round_, **run(config, args.cpus, repository, args.seconds)}
            results.append(result)
            one, sixteen = result["1-input"], result["16-input"]
            print(
                f"round {round_} {config.name:>12}:"
                f" 1-input {one['sequences_per_s']:7.1f} seq/s (p50 {one['p50_ms']} ms)"
                f"  16-input {sixteen['sequences_per_s']:7.1f} seq/s (p99 {sixteen['p99_ms']} ms)"
                f"  [{result['chosen']}]",
                flush=True,
            )
    write_report("container_cpus", {"cpus": args.cpus, "results": results})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
