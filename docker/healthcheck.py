"""The image's HEALTHCHECK: exit 0 when GET /readyz answers 200 (every model loaded and warmed up, not draining).

Standard library only (the images carry no curl). Asks the probe port (BERTSERVE_PROBE_PORT, answered by a
thread of its own, fast under any load) where one is set, else the main port (BERTSERVE_PORT), as the server.
"""

import os
import sys
import urllib.error
import urllib.request

port = os.environ.get("BERTSERVE_PROBE_PORT", "0").strip()
if port in ("", "0"):
    port = os.environ.get("BERTSERVE_PORT", "8000")
try:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=4) as response:
        sys.exit(0 if response.status == 200 else 1)
except (urllib.error.URLError, OSError) as exc:
    print(f"not ready: {exc}", file=sys.stderr)
    sys.exit(1)
