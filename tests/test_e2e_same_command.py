"""The same training command typed three times, then with `train.resume=auto`, on the real CLI (vLLM,
DeepSpeed, real files): each fresh run takes a folder of its own (`<out_dir>`, `-2`, `-3`) and says so,
resume=auto continues the newest, and every run's metrics rows and checkpoints are all still there
(docs/durability.md, "Running a command again")."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

import warm_python

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.e2e


def train(out: Path, model_dir: str, *extra: str):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "CI": "true"}
    env.pop("AGENTRL_CRASH_AT", None)
    cmd = [sys.executable, "-m", "agentrl.train", "--config", "examples/agents/arithmetic.yaml",
           f"model.path={model_dir}", f"train.out_dir={out}", "train.steps=2", "train.checkpoint_every=1",
           "train.checkpoint_keep=1", "train.eval_before=false", "train.eval_after=false", "train.save_model=false",
           "buffer.batch_size=8", "rollout.n_samples=4", "data.eval_tasks=4", *extra]
    proc = warm_python.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    return proc.stdout + proc.stderr


def steps(folder: Path) -> list[int]:
    return [json.loads(line)["step"] for line in (folder / "metrics.jsonl").read_text().splitlines()]


def checkpoints(folder: Path) -> list[str]:
    return sorted(p.name for p in (folder / "checkpoints").glob("step_*"))


def test_the_same_command_three_times_then_resume_auto(tmp_path, model_dir):
    out = tmp_path / "run"
    train(out, model_dir)
    first = (out / "metrics.jsonl").read_bytes()
    for n in (2, 3):
        text = train(out, model_dir)
        folder = tmp_path / f"run-{n}"
        assert f"this run writes to {folder}" in text and f"run folder                      : {folder}" in text
        assert steps(folder) == [0, 1] and checkpoints(folder) == ["step_2"]
    text = train(out, model_dir, "train.resume=auto", "train.steps=3")
    assert f"resumed from {tmp_path / 'run-3' / 'checkpoints' / 'step_2'}" in text
    assert (out / "metrics.jsonl").read_bytes() == first  # not a byte of the first run changed
    assert [steps(out), steps(tmp_path / "run-2"), steps(tmp_path / "run-3")] == [[0, 1], [0, 1], [0, 1, 2]]
    assert [checkpoints(out), checkpoints(tmp_path / "run-2"), checkpoints(tmp_path / "run-3")] == \
        [["step_2"], ["step_2"], ["step_3"]]
    assert not (tmp_path / "run-4").exists()
