"""Every `from <project module> import <name>` in the project names something that exists, also the
imports inside functions that only run deep in a run (an engine's worker, a weight push), so a moved
name fails here and not in the middle of a training run."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("agentrl", "envs", "rewards")


def project_imports() -> list[tuple[str, int, str, str]]:
    found = []
    for top in (*PACKAGES, "tests", "bench"):
        for path in sorted((ROOT / top).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module \
                        and node.module.split(".")[0] in PACKAGES:
                    found += [(str(path.relative_to(ROOT)), node.lineno, node.module, a.name) for a in node.names]
    return found


def test_every_imported_project_name_exists():
    missing = []
    for where, line, module, name in project_imports():
        mod = importlib.import_module(module)
        if name != "*" and not hasattr(mod, name):
            try:
                importlib.import_module(f"{module}.{name}")
            except ModuleNotFoundError:
                missing.append(f"{where}:{line}: from {module} import {name}")
    assert missing == []
