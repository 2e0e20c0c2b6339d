"""Where the benchmark scripts leave their figures: reports/NAME.json (ignored by git), or a path given."""

from __future__ import annotations

import json
from pathlib import Path

from benchmarks.realdata import ROOT


def write_report(name: str, data: object, path: Path | None = None) -> Path:
    """Writes `data` as indented JSON to `path` (default reports/NAME.json) and says where."""
    out = path or ROOT / "reports" / f"{name}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(data, indent=2) + "\n")
    print(f"\nwritten: {out}")
    return out
