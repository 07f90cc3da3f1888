"""pyflakes over the project's Python, through flake8 so a deliberate exception (a re-export, a fixture
imported from another test module) is marked where it is with `# noqa: F401` and the like: an undefined
name, an unused import or variable, a redefinition or a `%`-format that does not match its arguments fails
here instead of in a run. Only the F (pyflakes) checks: style is DESIGN.md's, not a linter's."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from check_layout import PROJECT

ROOT = Path(__file__).resolve().parents[1]
PYTHON_DIRS = (*PROJECT, "scripts")  # the layout check's project folders, and the install scripts


def test_pyflakes_finds_nothing_in_the_project() -> None:
    dirs = [d for d in PYTHON_DIRS if (ROOT / d).is_dir()]
    proc = subprocess.run([sys.executable, "-m", "flake8", "--isolated", "--select=F", *dirs], cwd=ROOT,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, f"flake8 --select=F:\n{proc.stdout}{proc.stderr}"
