"""Exceptions as the one-line reasons that logs, the export's CLI and `/v1/models` show."""

from __future__ import annotations

import re
from pathlib import Path


def one_line(exc: BaseException, limit: int = 300, hide: str | Path | None = None) -> str:
    """`Type: first line of the message`, cut to `limit` characters, with `hide` (a path the reader need not see,
    such as where the model repository sits on disk) taken out."""
    lines = str(exc).strip().splitlines()
    line = lines[0] if lines else ""
    if hide is not None:  # a path under it reads as relative to it ("entry/model.fp32.onnx"), not as "/entry/..."
        line = _without_path(line, str(hide)).strip()
    line = cut(line, limit)
    return f"{type(exc).__name__}: {line}" if line else type(exc).__name__


def _without_path(line: str, path: str) -> str:
    """`line` with `path` taken out where it begins a path ("models/entry/x" -> "entry/x"), and where it stands alone
    if it holds a "/" (a bare "models" may be a word). Only at a path's start: the repository "." was taken out of
    every "model.json" ("modeljson")."""
    prefix = path.rstrip("/") or "/"
    alone = r"|(?![\w./-])" if "/" in prefix else ""
    return re.sub(r"(?<![\w./-])" + re.escape(prefix) + r"(?:/" + alone + ")", "", line)


def cut(text: str, limit: int) -> str:
    """`text`, or its first `limit` characters ending in "..." where it is longer."""
    return text if len(text) <= limit else text[: limit - 3] + "..."


def shown(value: object, limit: int = 60) -> str:
    """A value as an error message quotes it: its repr, cut to `limit` characters. A message echoes what the client
    sent, and it must stay short whatever that was: gRPC carries it in a trailer that clients refuse past 8-16 KB
    (tritonclient then reports RESOURCE_EXHAUSTED, not the error), and a log line or an HTTP body has no use for
    20,000 characters of it either."""
    return cut(repr(value), limit)


def natural_order(name: str) -> list[str | int]:
    """A sort key for names as people count them: layer.10 after layer.9, inputs.10 after inputs.2 (strings and
    numbers alternate, so two keys always compare)."""
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", name)]


def article(name: str) -> str:
    """The article before a class name as it is read aloud: an ElectraFor..., an XLNetFor... ("ex"), a BertFor..."""
    return "an" if name[:1] in ("A", "E", "I", "O", "U") or name.startswith("XL") else "a"
