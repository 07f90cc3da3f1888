"""A new user's env bug through the real CLI (`python -m agentrl.train`, vLLM, DeepSpeed): a `reset`
that raises on every task ends the run by itself, with exit 1 and the user's file, line and task; the
same bug on ~30 % of episodes is counted and trained through; dynamic_filter on a reward that never varies
ends the run saying so. Fixture env: tests/fixtures/flaky_env.py."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from agentrl.telemetry.learning_signal import WHAT_TO_DO
import warm_python

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests" / "fixtures"
ENV_FILE = FIXTURES / "flaky_env.py"
BUG_LINE = next(i for i, line in enumerate(ENV_FILE.read_text().splitlines(), 1) if "# the bug" in line)
pytestmark = pytest.mark.e2e


def train(tmp_path: Path, model: str, fail_rate: float, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{FIXTURES}", "CI": "true"}
    cmd = [sys.executable, "-m", "agentrl.train", f"model.path={model}", f"train.out_dir={tmp_path / 'run'}",
           "env.import_path=flaky_env:FlakyEnv", f"env.kwargs={{fail_rate: {fail_rate}}}", "train.save_model=false",
           "rollout.n_samples=4", "buffer.batch_size=16", "data.eval_tasks=8", *args]
    return warm_python.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)


def test_an_env_that_raises_on_every_task_ends_the_run_with_its_file_line_and_task(tmp_path, tiny_model):
    proc = train(tmp_path, tiny_model, 1.0, "train.steps=30", "train.eval_before=false")
    assert proc.returncode == 1, proc.stderr[-4000:]
    err = proc.stderr
    # rollout.fail_after=128 (> max_concurrency 64): the streak that ended it.
    assert "run failed: EpisodesFailing: 128 episodes in a row failed with none finishing (rollout.fail_after); " \
           "failed episodes so far: env_error 128 (0 finished)." in err
    first = re.search(r"The first of them, episode (\d+)\.(\d+) \(task (train-\d+)\), ended with env_error: "
                      r"TypeError: unhashable type: 'list' \(at (.+):(\d+) in reset\)", err)
    assert first and (first[4], int(first[5])) == (str(ENV_FILE), BUG_LINE), err[-4000:]
    assert f'File "{ENV_FILE}", line {BUG_LINE}, in reset' in err
    assert f'Its task: {{"id": "{first[3]}"' in err
    assert len(err.splitlines()) < 300, err[-4000:]
    assert not (tmp_path / "run" / "metrics.jsonl").exists() or not (tmp_path / "run" / "metrics.jsonl").read_text()


def test_a_30_percent_transient_failure_rate_trains_to_the_end_with_failures_counted(tmp_path, tiny_model):
    """Also a reward that never varies (`no_reward`): the run says there is nothing to learn, once."""
    proc = train(tmp_path, tiny_model, 0.3, "train.steps=6", "train.eval_before=false",
                 "env.kwargs.no_reward=true")
    assert proc.returncode == 0, proc.stderr[-4000:]
    records = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [0, 1, 2, 3, 4, 5]
    assert all(r["signal/zero_std_groups_frac"] == 1.0 and r["signal/reward_range"] == 0.0 for r in records)
    warnings = [line for line in proc.stderr.splitlines() if "no learning signal" in line]
    assert len(warnings) == 1 and warnings[0].endswith(
        "no learning signal: every episode of the last 5 steps got reward 0: no estimator learns from a reward "
        f"that never varies. What to do: {WHAT_TO_DO}")
    assert "groups with equal rewards       : 100%  (no learning signal from step 4: see the warning)" in proc.stdout
    assert proc.stdout.startswith("\n=== agentrl summary ===\n"), proc.stdout[:2000]  # no log line on stdout
    failed, ok = records[-1]["episodes/env_error"], records[-1]["episodes/ok"] + records[-1].get("episodes/truncated", 0)
    assert failed > 0 and 0.1 < failed / (failed + ok) < 0.5  # ~30 %, counted
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["eval_after"]["n"] + sum(summary["eval_after"]["failed"].values()) == 8
    # Readable: the first failure with its traceback once, then at most one aggregated line per step.
    failure_lines = [line for line in proc.stderr.splitlines() if "ended with env_error" in line]
    assert 1 <= len(failure_lines) <= 1 + 6 + 2, failure_lines
    assert all(re.search(r"episode (\d+\.\d+|eval \d+) \(task (train|eval)-\d+\)", line) for line in failure_lines)


def test_dynamic_filter_on_a_reward_that_never_varies_ends_the_run_saying_so(tmp_path, tiny_model):
    """Every group is dropped for equal rewards, so no batch ever fills: without a bound the run would sample
    forever. It warns at 64 dropped in a row and ends at 256 (agentrl.telemetry.learning_signal.filter_streak_limit:
    4 groups a batch here), exit 1, before any step."""
    proc = train(tmp_path, tiny_model, 0.0, "train.steps=30", "train.eval_before=false", "env.kwargs.no_reward=true",
                 "algo.dynamic_filter=true")
    assert proc.returncode == 1, proc.stderr[-4000:]
    cause = ("no learning signal: algo.dynamic_filter dropped the last {} groups in a row, each for giving every "
             "sample the same reward (rewards seen: 0), so no batch could be filled")
    assert f"run failed: NoLearningSignal: {cause.format(256)}. What to do: {WHAT_TO_DO}" in proc.stderr
    warnings = [line for line in proc.stderr.splitlines() if "sampling goes on" in line]
    assert len(warnings) == 1 and warnings[0].endswith(
        f"{cause.format(64)}; sampling goes on, and the run ends if 256 in a row are dropped")
    assert not (tmp_path / "run" / "metrics.jsonl").exists() or not (tmp_path / "run" / "metrics.jsonl").read_text()
