"""The environment a test gives the processes it starts: its own choice of the hub's offline variables, never the
caller's shell's.

huggingface_hub is offline when either HF_HUB_OFFLINE or TRANSFORMERS_OFFLINE is true (it reads them once, on import)
and then refuses every request, a loopback URL included. The suite is offline (tests/conftest.py sets both); a client
that talks to a local server runs with both removed, whatever the shell that started pytest exported.
"""

from __future__ import annotations

import os

OFFLINE_VARIABLES = ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")


def offline_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """This process's environment plus `extra`, with the hub's offline variables both set."""
    return {**os.environ, **(extra or {}), **dict.fromkeys(OFFLINE_VARIABLES, "1")}


def online_env(*dropped: str) -> dict[str, str]:
    """This process's environment without the hub's offline variables (and `dropped`): for a hub client that talks
    to a server on this machine."""
    removed = {*OFFLINE_VARIABLES, *dropped}
    return {key: value for key, value in os.environ.items() if key not in removed}
