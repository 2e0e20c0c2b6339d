"""A front-end process: HTTP, validation, tokenization and post-processing, in front of an engine process.

`python -m service.frontend --engine-socket PATH` (settings from BERTSERVE_* variables, as the launcher passes
them). Several run side by side on one port (SO_REUSEPORT); each has its own GIL, so tokenization and JSON of
many requests proceed in parallel while one engine process keeps the device busy.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from service.frontend.http.app import create_app
from service.frontend.http.server import serve, shared_port_socket
from service.settings import Settings
from service.system.exit import exit_now


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m service.frontend", description=__doc__)
    parser.add_argument("--engine-socket", type=Path, required=True, help="the engine process's unix socket")
    parser.add_argument("--heartbeat", type=Path, help="a heartbeat file to keep writing (probes.HeartbeatFile)")
    args = parser.parse_args(argv)
    settings = Settings()
    settings.configure_logging()
    sock = shared_port_socket(settings.host, settings.port)
    app = create_app(settings, engine_socket=args.engine_socket, heartbeat=args.heartbeat)
    started = serve(app, settings, sockets=[sock])
    return 0 if started else 3


if __name__ == "__main__":
    exit_now(main())
