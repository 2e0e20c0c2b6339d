"""The layers of docs/architecture.md, as import-linter checks them in `make test` (pyproject.toml's contracts), and no
import circle anywhere. Each check is also shown to fail: a copy of the packages with one forbidden import added."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import grimp
import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("bertcore", "export", "service")
LINT_IMPORTS = Path(sys.executable).with_name("lint-imports")


def lint_imports(root: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(LINT_IMPORTS), "--config", str(root / "pyproject.toml"), "--no-cache"],
        cwd=root,
        capture_output=True,
        text=True,
        env={"PYTHONPATH": str(root), "PATH": "/usr/bin:/bin"},
        timeout=300,
    )


def copy_of_packages(tmp_path: Path) -> Path:
    for package in PACKAGES:
        shutil.copytree(ROOT / package, tmp_path / package, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    return tmp_path


def cycles(*packages: str) -> list[list[str]]:
    """Every import circle among the packages' modules (strongly connected components of more than one module, or a
    module importing itself), annotations left out as import-linter leaves them out."""
    graph = grimp.build_graph(*packages, exclude_type_checking_imports=True)
    modules = sorted(m for m in graph.modules if m.split(".")[0] in packages)
    edges = {m: sorted(d for d in graph.find_modules_directly_imported_by(m) if d in graph.modules) for m in modules}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(module: str) -> None:  # Tarjan's algorithm; the graph is small
        index[module] = low[module] = len(index)
        stack.append(module)
        on_stack.add(module)
        for target in edges.get(module, []):
            if target not in index:
                visit(target)
                low[module] = min(low[module], low[target])
            elif target in on_stack:
                low[module] = min(low[module], index[target])
        if low[module] == index[module]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == module:
                    break
            if len(component) > 1 or module in edges.get(module, []):
                found.append(sorted(component))

    for module in modules:
        if module not in index:
            visit(module)
    return found


def test_every_layer_contract_is_kept() -> None:
    result = lint_imports(ROOT)
    assert result.returncode == 0, result.stdout[-3000:]
    assert "0 broken" in result.stdout


def test_no_import_circle_anywhere() -> None:
    assert cycles(*PACKAGES) == []


@pytest.mark.parametrize(
    ("module", "line", "contract"),
    [
        ("service/engine/core.py", "import service.frontend.registry", "the engine never imports the front-end"),
        ("service/engine/runtime.py", "import tokenizers", "the engine never imports the front-end"),
        ("service/frontend/pipeline.py", "import onnxruntime", "the front-end never imports onnxruntime"),
        ("export/pipeline.py", "import service.settings", "export and service never import each other"),
        ("bertcore/tasks/qa.py", "import export.errors", "bertcore sits below export and service"),
        ("service/wire/ticket.py", "import service.engine.batcher", "service: a process's folder above"),
    ],
)
def test_a_forbidden_import_breaks_its_contract(tmp_path: Path, module: str, line: str, contract: str) -> None:
    root = copy_of_packages(tmp_path)
    path = root / module
    path.write_text(path.read_text(encoding="utf-8") + f"\n{line}  # added by the test\n", encoding="utf-8")
    result = lint_imports(root)
    assert result.returncode != 0
    broken = result.stdout.split("Broken contracts")[-1]
    assert contract in " ".join(broken.split()), result.stdout[-3000:]


def test_a_circle_is_found(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = copy_of_packages(tmp_path)
    settings = root / "service/settings.py"
    settings.write_text(settings.read_text(encoding="utf-8") + "\nimport service.repository  # a circle\n")
    monkeypatch.syspath_prepend(str(root))
    for name in [n for n in sys.modules if n.split(".")[0] in PACKAGES]:
        monkeypatch.delitem(sys.modules, name)
    assert ["service.repository", "service.settings"] in cycles(*PACKAGES)
