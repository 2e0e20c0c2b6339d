"""The one error type of the export: a failure with a one-line reason the CLI prints as it is."""


class ExportError(Exception):
    """An export that cannot go on. The message is one line a user can act on."""

    def __init__(self, message: str) -> None:
        super().__init__(" ".join(message.split()))
