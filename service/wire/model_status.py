"""A served model's status, as the engine reports it to the front-ends and the front-end to its clients."""

from __future__ import annotations

from enum import StrEnum


class ModelStatus(StrEnum):
    """loading -> (checking: the front-end's self-test) -> ready | failed; unloading: an unload was asked for, its
    requests in flight finish, new ones get 404. A StrEnum: it crosses the process boundary and reaches /v1/models
    as its plain value."""

    LOADING = "loading"
    CHECKING = "checking"
    READY = "ready"
    FAILED = "failed"
    UNLOADING = "unloading"
