"""The one error a task raises for input it cannot take: a ValueError that names the field to change."""

from __future__ import annotations


class TaskInputError(ValueError):
    """Input or a parameter the task cannot take. `field` names what to change: a parameter ("max_seq_len",
    "aggregation_strategy") or a part of the input ("inputs.3", "question"); None where no one field is at fault.
    The server answers it 422 with that field."""

    def __init__(self, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.field = field
