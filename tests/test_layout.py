"""The import arrows and file sizes of tests/check_layout.py hold for the repository, and the checker
finds each kind of violation when one is planted."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from check_layout import violations

REPO = Path(__file__).resolve().parents[1]


def test_the_repository_keeps_its_layout():
    assert violations(REPO) == []


def test_the_checker_runs_as_a_script():
    proc = subprocess.run([sys.executable, "tests/check_layout.py"], cwd=REPO, capture_output=True, text=True)
    assert (proc.returncode, proc.stdout.strip()) == (0, "layout ok")


PLANTED = {
    "agentrl/config/bad.py": ("from rewards.sources import RewardCombiner\n", "agentrl/config imports only"),
    "agentrl/config/lazy.py": ("def f():\n    import deepspeed\n", "agentrl/config imports no engine"),
    "agentrl/algo/bad.py": ("import numpy as np\n", "agentrl/algo imports only torch"),
    "agentrl/algo/rel.py": ("from ..chat import ChatFormat\n", "agentrl/algo imports only torch"),
    "agentrl/rollout/bad.py": ("def f():\n    from agentrl.learner.rl import Learner\n", "agentrl/rollout knows"),
    "agentrl/rollout/ds.py": ("import deepspeed.comm\n", "agentrl/rollout knows"),
    "rewards/bad.py": ("from agentrl import learner\n", "rewards/ never imports agentrl.learner"),
    "envs/bad.py": ("from agentrl.train import main\n", "components never import agentrl.train"),
    "bench/long.py": ("x = 1\n" * 401, "401 lines"),
    "agentrl/run/buffer.py": ("def f():\n    from agentrl.rollout.pool import Producer\n", "imports point down: agentrl.run.buffer"),
    "agentrl/newroom.py": ("from agentrl.types import Episode\n", "agentrl.newroom is in no tier"),
    "agentrl/rollout/cmd.py": ("def f():\n    from agentrl.cli import main\n", "nothing imports agentrl.cli"),
    "agentrl/learner/bad.py": ("from agentrl.rollout.engine import Engine\n", "agentrl/learner knows nothing of agentrl.rollout"),
    "agentrl/utils/up.py": ("from agentrl.data.tasks import Task\n", "imports point down: agentrl.utils"),
}


@pytest.mark.parametrize("path", sorted(PLANTED))
def test_the_checker_finds_a_planted_violation(tmp_path, path):
    text, why = PLANTED[path]
    for package in ("agentrl", "agentrl/config", "agentrl/algo", "agentrl/rollout", "agentrl/run", "agentrl/learner",
                    "agentrl/utils", "rewards", "envs", "bench"):
        (tmp_path / package).mkdir(parents=True, exist_ok=True)
        (tmp_path / package / "__init__.py").write_text("")
    (tmp_path / "agentrl/config/ok.py").write_text("from agentrl.types import Episode\nfrom agentrl.algo import X\n")
    (tmp_path / "agentrl/algo/ok.py").write_text("import math\nimport torch\nfrom .losses import y\n")
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests/test_long.py").write_text("from agentrl.train import main\n" + "x = 1\n" * 500)
    assert violations(tmp_path) == []  # allowed imports, and tests may be long and import train
    (tmp_path / path).write_text(text)
    found = violations(tmp_path)
    assert len(found) == 1 and found[0].startswith(path) and why in found[0], found


def _package_tree(root: Path) -> None:
    for package in ("agentrl", "agentrl/rollout", "rewards", "envs"):
        (root / package).mkdir(parents=True, exist_ok=True)
        (root / package / "__init__.py").write_text("")


def test_the_checker_finds_an_import_circle_at_any_depth(tmp_path):
    _package_tree(tmp_path)
    (tmp_path / "agentrl/rollout/a.py").write_text("from agentrl.rollout.b import x\n")
    (tmp_path / "agentrl/rollout/b.py").write_text("x = 1\n")
    assert violations(tmp_path) == []
    (tmp_path / "agentrl/rollout/b.py").write_text("x = 1\n\ndef f():\n    from agentrl.rollout import a\n")
    assert violations(tmp_path) == ["import circle: agentrl.rollout.a -> agentrl.rollout.b"]


def test_imports_under_type_checking_are_not_circles(tmp_path):
    _package_tree(tmp_path)
    (tmp_path / "agentrl/rollout/a.py").write_text("from agentrl.rollout.b import x\n")
    (tmp_path / "agentrl/rollout/b.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from agentrl.rollout.a import y\nx = 1\n")
    assert violations(tmp_path) == []
