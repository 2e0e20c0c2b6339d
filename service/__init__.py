"""The server: every model of a repository over HTTP, in one process or as front-end processes and an engine process.

Each subfolder is what one process loads: `engine/` (sessions and batching; the engine process, or inside the
server in in-process mode), `frontend/` (the request pipeline and its HTTP edge; a front-end process), `supervisor/`
(the launcher of process mode). `wire/` is what crosses between front-ends and the engine; `system/` the OS helpers;
the modules here (settings, errors, logs, metrics, repository, probes) are used by every process. Text and tasks sit
in `bertcore`, below both this package and `export`. docs/architecture.md has the map.
"""

import bertcore.no_telemetry  # noqa: F401  (before any onnxruntime import: it calls home unless told not to)
