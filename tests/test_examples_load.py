"""Every shipped RL example passes start-up as written: its config validates, its env imports, its tasks
are built and are JSON (checkpoints hold them), before any engine starts. What each one learns is
measured by its own run (README, bench/); this catches an example that would not even start."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agentrl.config.load import load_config
from agentrl.run.startup import prepare

REPO = Path(__file__).resolve().parents[1]
EXAMPLES = sorted(p.relative_to(REPO).as_posix() for folder in ("agents", "tutorials")
                  for p in (REPO / "examples" / folder).glob("*.yaml"))


def test_the_ecosystem_examples_are_among_them():
    assert {"examples/agents/reasoning_gym.yaml", "examples/agents/openenv.yaml",
            "examples/agents/verifiers.yaml"} <= set(EXAMPLES)


@pytest.mark.parametrize("example", EXAMPLES)
def test_example_passes_start_up(example, monkeypatch, tmp_path):
    monkeypatch.chdir(REPO)
    cfg = load_config(example, [f"train.out_dir={tmp_path / 'run'}", "data.eval_tasks=4"])
    prepared = prepare(cfg)
    assert prepared.train_tasks and len(prepared.eval_tasks) == 4
    for task in prepared.train_tasks[:8] + prepared.eval_tasks:
        assert json.loads(json.dumps(task)) == task
