"""huggingface_hub's InferenceClient (or AsyncInferenceClient) against a server, in a process of its own.

huggingface_hub refuses every request, a loopback URL included, while HF_HUB_OFFLINE or TRANSFORMERS_OFFLINE is set (it
reads them once, on import); the tests set both for everything else. So the client runs here, started without either:

    python -m tests.harness.hf_client '{"url": ..., "calls": [[method, args, kwargs], ...], "async": false}'

prints one JSON line: per call, {"result": ...} or {"error": type, "status": HTTP status, "message": ...}.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.harness.environment import OFFLINE_VARIABLES, online_env

ROOT = Path(__file__).resolve().parents[2]


def call_hf_client(
    url: str, calls: list[tuple[str, list, dict]], use_async: bool = False, token: str | None = None
) -> list[dict[str, Any]]:
    """Run `calls` (method name, positional args, keyword args) on a client of `url`; their outcomes, in order.
    `token`: the bearer key the client sends (None: none; a token of the environment is not passed on)."""
    env = online_env("HF_TOKEN")
    request = json.dumps({"url": url, "calls": calls, "async": use_async, "token": token})
    done = subprocess.run(
        [sys.executable, "-m", "tests.harness.hf_client", request],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    if done.returncode != 0:
        raise RuntimeError(f"hf client failed ({done.returncode}):\n{done.stderr}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def _plain(value: Any) -> Any:
    """The client's output dataclasses (dict subclasses) as plain JSON values."""
    if isinstance(value, list):
        return [_plain(item) for item in value]
    if isinstance(value, dict):
        return {key: _plain(item) for key, item in value.items()}
    return value


def _outcome(result: Any = None, error: BaseException | None = None) -> dict[str, Any]:
    if error is None:
        return {"result": _plain(result)}
    response = getattr(error, "response", None)
    return {
        "error": type(error).__name__,
        "status": getattr(response, "status_code", None),
        "message": str(error),
        "body": response.text if response is not None else None,
    }


def _run_sync(spec: dict[str, Any]) -> list[dict[str, Any]]:
    from huggingface_hub import InferenceClient

    client = InferenceClient(model=spec["url"], token=spec.get("token"))
    outcomes = []
    for method, args, kwargs in spec["calls"]:
        try:
            outcomes.append(_outcome(getattr(client, method)(*args, **kwargs)))
        except Exception as exc:  # the outcome is the test's to judge
            outcomes.append(_outcome(error=exc))
    return outcomes


async def _run_async(spec: dict[str, Any]) -> list[dict[str, Any]]:
    from huggingface_hub import AsyncInferenceClient

    outcomes = []
    async with AsyncInferenceClient(model=spec["url"], token=spec.get("token")) as client:
        for method, args, kwargs in spec["calls"]:
            try:
                outcomes.append(_outcome(await getattr(client, method)(*args, **kwargs)))
            except Exception as exc:
                outcomes.append(_outcome(error=exc))
    return outcomes


def main() -> None:
    spec = json.loads(sys.argv[1])
    offline = [name for name in OFFLINE_VARIABLES if os.environ.get(name)]
    if offline:
        raise SystemExit(f"run without {' and '.join(offline)}: huggingface_hub refuses every request while it is set")
    outcomes = asyncio.run(_run_async(spec)) if spec["async"] else _run_sync(spec)
    print(json.dumps(outcomes))


if __name__ == "__main__":
    main()
