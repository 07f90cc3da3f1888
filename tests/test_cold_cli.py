"""The cold lane: commands started as a user starts them, in a fresh interpreter, not forked from the
suite's warm one (tests/warm_python.py). A fork has already imported torch, DeepSpeed and vLLM with
stdout routed, so what a real first run prints at import (DeepSpeed's accelerator line, vLLM's logger,
a library's warning) is seen only here. What each command's stdout holds is its product alone: the
train summary, the stage's one JSON line; every log goes to stderr (agentrl.stdio)."""

from __future__ import annotations

import contextlib
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from agentrl.metrics import print_summary

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.e2e


def cold_env() -> dict[str, str]:
    """The suite's environment without what the warm server or the CLIs would set for the command."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VLLM_LOGGING", "WARM_PYTHON"))}
    return {**env, "PYTHONPATH": str(ROOT), "CI": "true"}


def test_a_cold_train_run_prints_exactly_its_summary(tmp_path, model_dir):
    out = tmp_path / "run"
    proc = subprocess.run(
        [sys.executable, "-m", "agentrl.train", "--config", "examples/agents/guess_number.yaml",
         f"model.path={model_dir}", f"train.out_dir={out}", "train.steps=2", "data.eval_tasks=8",
         "buffer.batch_size=16", "rollout.n_samples=4"],
        cwd=ROOT, env=cold_env(), capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-6000:]
    summary = json.loads((out / "summary.json").read_text())
    want = io.StringIO()
    with contextlib.redirect_stdout(want):
        print_summary(summary)
    assert proc.stdout == want.getvalue(), proc.stdout[-3000:]
    assert "held-out eval score, after RL" in proc.stdout
    # It ran cold: DeepSpeed was imported here and its import-time line went to stderr, not stdout.
    assert "Setting accelerator to CPU" in proc.stderr, proc.stderr[-3000:]


def test_the_pipelines_sft_stage_cold_prints_one_json_line(tmp_path, tiny_model):
    data = tmp_path / "data"
    made = subprocess.run([sys.executable, "examples/pipeline/make_data.py", "--out", str(data), "--demos", "64",
                           "--pairs", "8", "--prm", "8", "--prm-eval", "8"],
                          cwd=ROOT, env=cold_env(), capture_output=True, text=True, timeout=300)
    assert made.returncode == 0, made.stderr[-3000:]
    sft = tmp_path / "sft"
    proc = subprocess.run(
        [sys.executable, "-m", "agentrl.sft", "--model", tiny_model, "--dataset", str(data / "demos.jsonl"),
         "--messages_key", "messages", "--out", str(sft), "--max_steps", "2", "--batch_size", "8",
         "--micro_batch_size", "8", "--lr", "1e-3"],
        cwd=ROOT, env=cold_env(), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-6000:]
    lines = proc.stdout.splitlines()
    assert len(lines) == 1, proc.stdout[-3000:]
    result = json.loads(lines[0])
    assert (result["stage"], result["steps"], result["saved"]) == ("sft", 2, str(sft))
    assert (sft / "config.json").is_file()
    assert "Setting accelerator to CPU" in proc.stderr, proc.stderr[-3000:]
