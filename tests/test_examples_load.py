"""Every shipped RL example passes start-up as written: its config validates, its env imports, its tasks
are built and are JSON (checkpoints hold them), before any engine starts. What each one learns is
measured by its own run (README, bench/); this catches an example that would not even start."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agentrl.config.load import ConfigError, load_config
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
    overrides = [f"train.out_dir={tmp_path / 'run'}", "data.eval_tasks=4"]
    cfg = load_config(example, overrides)
    if cfg.algo.teacher is not None and not Path(cfg.algo.teacher.model).exists():
        # distill.yaml's teacher is what the main job saves (runs/guess_number/model): start-up names it
        # when it is not there yet, and passes once a model folder is there
        with pytest.raises(ConfigError, match=f"algo.teacher.model='{cfg.algo.teacher.model}': no such folder"):
            prepare(cfg)
        teacher = tmp_path / "teacher"
        teacher.mkdir()
        (teacher / "config.json").write_text("{}")
        cfg = load_config(example, [*overrides, f"algo.teacher.model={teacher}"])
    prepared = prepare(cfg)
    assert prepared.train_tasks and len(prepared.eval_tasks) == 4
    for task in prepared.train_tasks[:8] + prepared.eval_tasks:
        assert json.loads(json.dumps(task)) == task
