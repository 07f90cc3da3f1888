"""The cold lane: commands started as a user starts them, in a fresh interpreter, not forked from the
suite's warm one (tests/warm_python.py). A fork has already imported torch, DeepSpeed and vLLM with
stdout routed, so what a real first run prints at import (vLLM's logger, a library's warning, and
DeepSpeed's accelerator notice, which must no longer come) is seen only here. What each command's stdout
holds is its product alone: the train summary, the stage's one JSON line; every log goes to stderr
(agentrl.utils.stdio), and a log file gets plain progress lines, not redraws (agentrl.telemetry.metrics.LineProgress)."""

from __future__ import annotations

import contextlib
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from agentrl.telemetry.metrics import print_summary

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.e2e


def cold_env() -> dict[str, str]:
    """The suite's environment without what the warm server or the CLIs would set for the command."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VLLM_LOGGING", "WARM_PYTHON"))}
    return {**env, "PYTHONPATH": str(ROOT), "CI": "true"}


NOTICE = "Setting accelerator to CPU"  # DeepSpeed's, on a CPU install: agentrl.utils.stdio.pin_cpu_accelerator


def test_a_cold_train_run_prints_exactly_its_summary(tmp_path, model_dir):
    out = tmp_path / "run"
    env = {k: v for k, v in cold_env().items() if k != "CI"}  # what `2> run.log` gets, progress included
    proc = subprocess.run(
        [sys.executable, "-m", "agentrl.train", "--config", "examples/agents/guess_number.yaml",
         f"model.path={model_dir}", f"train.out_dir={out}", "train.steps=2", "data.eval_tasks=8",
         "buffer.batch_size=16", "rollout.n_samples=4"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-6000:]
    summary = json.loads((out / "summary.json").read_text())
    want = io.StringIO()
    with contextlib.redirect_stdout(want):
        print_summary(summary)
    assert proc.stdout == want.getvalue(), proc.stdout[-3000:]
    assert "held-out eval score, after RL" in proc.stdout
    # It ran cold, DeepSpeed imported here: no accelerator notice, on stderr or stdout.
    assert NOTICE not in proc.stderr, proc.stderr[-3000:]
    # stderr is a pipe: the progress is two plain lines (the first step, 100%), and no bar of agentrl's
    # or Hugging Face's is redrawn with carriage returns (vLLM's one-off "Loading safetensors checkpoint
    # shards" bar, in the engine's process, is the one left).
    lines = proc.stderr.split("\n")
    progress = [line.split(": ", 1)[1].split(" | ")[0] for line in lines if " agentrl.telemetry.metrics: RL steps " in line]
    assert [p.split(" reward=")[0] for p in progress] == ["RL steps 1/2 (50%)", "RL steps 2/2 (100%)"], progress
    assert [line for line in lines if "\r" in line and "Loading safetensors" not in line] == [], proc.stderr[-3000:]
    assert len(lines) < 60, proc.stderr[-6000:]


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
    assert NOTICE not in proc.stderr, proc.stderr[-3000:]
