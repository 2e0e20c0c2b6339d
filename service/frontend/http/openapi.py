"""Write the OpenAPI schema the server serves at /openapi.json (and /docs) to docs/openapi.json.

python -m service.frontend.http.openapi [PATH]   # default docs/openapi.json; a test checks the copy is current
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from service.frontend.http.app import create_app
from service.settings import Settings

DEFAULT_PATH = Path(__file__).resolve().parents[3] / "docs" / "openapi.json"


def schema_text() -> str:
    return json.dumps(create_app(Settings()).openapi(), indent=2, sort_keys=True) + "\n"


def main(argv: list[str]) -> int:
    path = Path(argv[0]) if argv else DEFAULT_PATH
    path.write_text(schema_text(), encoding="utf-8")
    print(f"written: {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
