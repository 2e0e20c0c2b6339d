"""`python -m service --repository models [--host ...] [--port ...] [settings]`; `--help` lists every setting.

In-process mode runs the whole server here; process mode (`--engine-mode process`, the default where a GPU is
used) hands over to the launcher: one engine process and `--frontends` front-end processes on the port.
"""

from __future__ import annotations

import logging
import os
import signal
import sys

from pydantic import ValidationError

from service.errors import StartupError
from service.frontend.http.app import create_app
from service.frontend.http.auth import ApiKeys, open_paths
from service.frontend.http.repository_api import AdminKeys
from service.frontend.http.server import serve
from service.repository import discover
from service.settings import ENV_PREFIX, Settings, flag_of, settings_from_cli, unknown_flag, unknown_variables
from service.supervisor.launcher import Launcher, listen_problem, resolve_engine_mode, uses_gpu
from service.system.exit import exit_now

log = logging.getLogger("service")


def source_of(setting: str, arguments: list[str]) -> str:
    """Where a setting's value came from, for its refusal: its flag, or its environment variable where that is set
    and the flag was not given (the refusal had named the setting alone, and a user looked for a flag never typed)."""
    flag, variable = flag_of(setting), f"{ENV_PREFIX}{setting.upper()}"
    given = any(argument == flag or argument.startswith(flag + "=") for argument in arguments)
    return f"from {variable}" if variable in os.environ and not given else flag


def main(argv: list[str] | None = None) -> int:
    arguments = sys.argv[1:] if argv is None else argv
    refusal, warnings = unknown_variables(os.environ)
    refusal = refusal if not {"-h", "--help"} & set(arguments) else None  # --help whatever the environment holds
    refusal = refusal or unknown_flag(arguments)
    if refusal:
        print(f"error: {refusal}", file=sys.stderr)
        return 2
    try:
        settings = settings_from_cli(arguments)
        discover(settings)  # refuse at once, with the reason, what cannot be served
        keys = ApiKeys.from_settings(settings)  # and a key file that cannot be used
        if settings.model_control == "explicit":
            AdminKeys(settings)  # and an admin key file that cannot be used, or shares a key with the inference ones
    except ValidationError as exc:
        for error in exc.errors():
            where = ".".join(str(part) for part in error["loc"])
            message = error["msg"].removeprefix("Value error, ")  # pydantic's prefix for a validator's refusal
            if where in Settings.model_fields:
                where += f" ({source_of(where, arguments)})"
            print(f"error: invalid setting {where}: {message}" if where else f"error: {message}", file=sys.stderr)
        return 2
    except StartupError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    settings.configure_logging()
    for warning in warnings:
        log.warning(warning)
    gpu, mode = uses_gpu(settings), resolve_engine_mode(settings)
    if settings.devices and not gpu:  # started as asked (the tests run two CPU engines so), said
        log.warning(
            "devices %s lists CUDA devices and none can be used here (no NVIDIA device, no onnxruntime-gpu, or "
            "--device cpu): %d engine(s) on the CPU, each holding every model",
            settings.devices,
            len(settings.devices),
        )
    for warning in settings.ineffective(mode, gpu):
        log.warning(warning)
    if keys.enabled:
        log.info(
            "API keys: %d in force; open without a key: %s", keys.count, ", ".join(sorted(open_paths(settings)[0]))
        )
    if mode == "process":
        signal.signal(signal.SIGTERM, signal.SIG_DFL)  # the launcher takes it at once
        return Launcher(settings).run()
    if problem := listen_problem(settings):
        print(f"error: {problem}", file=sys.stderr)
        return 2
    app = create_app(settings)
    try:
        app.state.server.load()  # before serving: a model that must load and cannot is one line, not a traceback
    except StartupError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # uvicorn takes it now: a drain from here on
    return 0 if serve(app, settings) else 1


class Terminated(BaseException):
    """SIGTERM before the server took the signals (`interruptible_main`); not an Exception, as KeyboardInterrupt is
    not: the load's `except Exception` must not take it for a model's failure, nor swallow it."""


def _terminated(signum: int, frame: object) -> None:
    raise Terminated


def interruptible_main() -> int:
    """`main`, where a Ctrl-C before uvicorn takes the signals (settings, discovery, the models' load, which can take
    minutes) is one line and exit 130, as the export's is, not a KeyboardInterrupt traceback from onnxruntime; and a
    SIGTERM then (an orchestrator's stop) one line and exit 143, where it ended the process with no word."""
    signal.signal(signal.SIGTERM, _terminated)
    try:
        return main()
    except KeyboardInterrupt:
        print("error: interrupted before the server started; nothing was served", file=sys.stderr)
        return 130
    except Terminated:
        print("error: stopped (SIGTERM) before the server started; nothing was served", file=sys.stderr)
        return 143


if __name__ == "__main__":
    exit_now(interruptible_main())
