"""GPU utilisation and memory, sampled by `nvidia-smi -lms` in the background while a load runs."""

from __future__ import annotations

import shutil
import statistics
import subprocess
import threading

QUERY = ["--query-gpu=utilization.gpu,memory.used", "--format=csv,noheader,nounits"]


class GpuSampler:
    """`with GpuSampler() as gpu: ...` then `gpu.summary()`: None where nvidia-smi is absent or said nothing."""

    def __init__(self, interval_ms: int = 200) -> None:
        self.interval_ms = interval_ms
        self.samples: list[tuple[float, float]] = []
        self.process: subprocess.Popen | None = None
        self.reader: threading.Thread | None = None

    @staticmethod
    def available() -> bool:
        return shutil.which("nvidia-smi") is not None

    def __enter__(self) -> GpuSampler:
        if self.available():
            self.process = subprocess.Popen(
                ["nvidia-smi", *QUERY, "-lms", str(self.interval_ms)],
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
                text=True,
            )
            self.reader = threading.Thread(target=self._read, daemon=True)
            self.reader.start()
        return self

    def _read(self) -> None:
        assert self.process is not None and self.process.stdout is not None
        for line in self.process.stdout:
            parts = [p.strip() for p in line.split(",")]
            try:
                self.samples.append((float(parts[0]), float(parts[1])))
            except (ValueError, IndexError):
                continue  # "[N/A]" or a partial line

    def __exit__(self, *_: object) -> None:
        if self.process is not None:
            self.process.terminate()
            try:
                self.process.wait(5)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(5)
        if self.reader is not None:
            self.reader.join(5)

    def summary(self) -> dict | None:
        if not self.samples:
            return None
        utilisation = [u for u, _ in self.samples]
        return {
            "samples": len(self.samples),
            "util_mean_pct": round(statistics.mean(utilisation), 1),
            "util_max_pct": max(utilisation),
            "memory_max_mib": max(m for _, m in self.samples),
        }
