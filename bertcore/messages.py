"""Exceptions as the one-line reasons that logs, the export's CLI and `/v1/models` show."""

from __future__ import annotations

from pathlib import Path


def one_line(exc: BaseException, limit: int = 300, hide: str | Path | None = None) -> str:
    """`Type: first line of the message`, cut to `limit` characters, with `hide` (a path the reader need not see,
    such as where the model repository sits on disk) taken out."""
    lines = str(exc).strip().splitlines()
    line = lines[0] if lines else ""
    if hide is not None:
        line = line.replace(str(hide), "")
    if len(line) > limit:
        line = line[: limit - 3] + "..."
    return f"{type(exc).__name__}: {line}" if line else type(exc).__name__
