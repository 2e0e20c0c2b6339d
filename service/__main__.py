"""`python -m service --repository models [--host ...] [--port ...] [settings]`; `--help` lists every setting."""

from __future__ import annotations

import logging
import sys

import uvicorn
from pydantic import ValidationError

from service.app import create_app
from service.metrics import Metrics
from service.registry import ModelRegistry, StartupError
from service.settings import settings_from_cli


class DrainingServer(uvicorn.Server):
    """On SIGTERM/SIGINT: stop admitting (readyz 503, new work 503), finish what is in flight, then exit."""

    def handle_exit(self, sig: int, frame: object) -> None:
        state = _find_state(self.config.loaded_app)  # loaded_app may be wrapped in uvicorn's middleware
        if state is not None:
            state.draining = True
        super().handle_exit(sig, frame)


def _find_state(app: object) -> object | None:
    for _ in range(10):
        if app is None:
            return None
        server = getattr(getattr(app, "state", None), "server", None)
        if server is not None:
            return server
        app = getattr(app, "app", None)
    return None


def main(argv: list[str] | None = None) -> int:
    try:
        settings = settings_from_cli(sys.argv[1:] if argv is None else argv)
        ModelRegistry(settings, Metrics()).discover()  # refuse at once, with the reason, what cannot be served
    except ValidationError as exc:
        for error in exc.errors():
            where = ".".join(str(part) for part in error["loc"]) or "settings"
            print(f"error: invalid setting {where}: {error['msg']}", file=sys.stderr)
        return 2
    except StartupError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    logging.basicConfig(level=settings.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    config = uvicorn.Config(
        create_app(settings),
        host=settings.host,
        port=settings.port,
        log_level=settings.log_level,
        timeout_graceful_shutdown=int(settings.drain_timeout_s) or None,
        proxy_headers=False,
        server_header=False,
    )
    server = DrainingServer(config)
    server.run()
    return 0 if server.started else 1


if __name__ == "__main__":
    sys.exit(main())
