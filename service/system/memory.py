"""Giving memory back once large work is over.

Two things keep the memory of the largest batch or request long after it was answered:
- onnxruntime's CPU arena grows to the largest batch shape a session ran (about 0.4 GB for MiniLM at 16 x 512
  tokens: attention scores are rows x heads x width x width floats) and never shrinks by itself;
- glibc's malloc keeps freed heap memory (tokenizer outputs, numpy buffers) for reuse instead of returning it.
Measured on the real MiniLM models: 0.59 GB at start, 2.0 GB after one maximum-size request to each of three
models, and it stayed there (benchmarks/memory_benchmark.py).

`IdleRelease` calls a release function once work marked large is over and nothing has run for `idle_s`: under
sustained load nothing is released (the next batch would only page the memory back in: shrinking the arena after
every batch was measured 8-13% more CPU per batch), and when the burst is over the memory goes back to the system.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import threading
import time
from collections.abc import Callable

log = logging.getLogger("service.system.memory")


def _load_malloc_trim() -> Callable[[int], int] | None:
    """glibc's malloc_trim, None where the C library has none (musl, macOS)."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        trim = libc.malloc_trim
    except (OSError, AttributeError):
        return None
    trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    return trim


_MALLOC_TRIM = _load_malloc_trim()


def malloc_trim() -> bool:
    """Return the free memory at the top of glibc's heaps (and whole free pages inside them) to the system.
    False where there is no glibc."""
    if _MALLOC_TRIM is None:
        return False
    _MALLOC_TRIM(0)
    return True


class IdleRelease:
    """Call `release` once, `idle_s` after the last of some work marked large, when no work is in flight.

    Work is bracketed by `begin()` and `end(large)`, from any thread; `release` runs on a daemon thread of its own
    (started with the first large work), when nothing is in flight; work may begin while it runs (it must be safe
    for that: onnxruntime sessions and malloc_trim are). `idle_s` 0 turns it off."""

    def __init__(self, name: str, idle_s: float, release: Callable[[], object]) -> None:
        self.name = name
        self.idle_s = idle_s
        self._release = release
        self._condition = threading.Condition()
        self._in_flight = 0
        self._pending = False  # large work ended since the last release
        self._last_end = 0.0
        self._thread: threading.Thread | None = None
        self._closed = False
        self.releases = 0  # how many times `release` ran (for tests and logs)

    def close(self) -> None:
        """No more releases: the watcher thread ends (and lets go of `release`, and of what it holds: a session)."""
        with self._condition:
            self._closed = True
            self._release = lambda: None
            self._condition.notify()

    @property
    def enabled(self) -> bool:
        return self.idle_s > 0

    def begin(self) -> None:
        if not self.enabled:
            return
        with self._condition:
            self._in_flight += 1

    def end(self, large: bool) -> None:
        if not self.enabled:
            return
        with self._condition:
            self._in_flight = max(0, self._in_flight - 1)
            self._last_end = time.monotonic()
            if large:
                self._pending = True
                if self._thread is None:
                    self._thread = threading.Thread(target=self._watch, name=f"release-{self.name}", daemon=True)
                    self._thread.start()
            self._condition.notify()

    def _watch(self) -> None:
        while True:
            with self._condition:
                while True:
                    if self._closed:
                        return
                    if not self._pending or self._in_flight:
                        self._condition.wait()
                        continue
                    remaining = self._last_end + self.idle_s - time.monotonic()
                    if remaining <= 0:
                        break
                    self._condition.wait(remaining)
                self._pending = False
            try:
                self._release()
                self.releases += 1
            except Exception:  # never let a failed release stop the watcher: log it, and keep serving
                log.exception("%s: releasing memory failed", self.name)
