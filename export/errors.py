"""The one error type of the export: a failure with a one-line reason the CLI prints as it is."""


class ExportError(Exception):
    """An export that cannot go on. The message is one line a user can act on."""

    def __init__(self, message: str) -> None:
        super().__init__(" ".join(message.split()))


def first_line(exc: BaseException, limit: int = 240) -> str:
    """A short, one-line description of a third-party exception, for wrapping into an ExportError."""
    text = str(exc).strip().splitlines()
    line = text[0] if text else ""
    if len(line) > limit:
        line = line[: limit - 3] + "..."
    return f"{type(exc).__name__}: {line}" if line else type(exc).__name__
