"""What a new user gets wrong at start-up ends as one line naming the file, line or key, with exit code 2,
before vLLM or DeepSpeed start: `python -m agentrl.train` run as a user runs it."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import warm_python

REPO = Path(__file__).resolve().parents[1]
HTTP_TYPO = 'rewards.sources=[{name: judge, type: http, http: {url: "http://127.0.0.1:9/v", read_timeot_s: 3}}]'


def _files(tmp: Path) -> None:
    (tmp / "ok.yaml").write_text("rollout:\n  n_samples: 4\n")
    (tmp / "broken.yaml").write_text("rollout:\n  n_samples: 4\nbuffer: [1\n")
    (tmp / "tasks.jsonl").write_text('{"target": 3}\n{"target": 4,\n{"target": 5}\n')
    (tmp / "scalar.jsonl").write_text('{"target": 3}\n7\n')
    (tmp / "not_a_model").mkdir()


# (arguments, the one line on stderr); {tmp} is the test's folder
CASES = {
    "unknown key": (["--config", "{tmp}/ok.yaml", "rollout.n_sampels=3"],
                    "config error: unknown config key 'rollout.n_sampels'; did you mean 'rollout.n_samples'?"),
    "wrong type": (["rollout.n_samples=abc"],
                   "config error: invalid config: rollout.n_samples: Input should be a valid integer, unable to "
                   "parse string as an integer"),
    "missing config file": (["--config", "{tmp}/nope.yaml"],
                            "config error: cannot read config file {tmp}/nope.yaml: No such file or directory"),
    "batch not a multiple of the group": (
        ["buffer.batch_size=7"],
        "config error: invalid config: buffer.batch_size=7 must be a multiple of rollout.n_samples=8 (whole groups "
        "per batch)"),
    "malformed yaml": (["--config", "{tmp}/broken.yaml"],
                       "config error: {tmp}/broken.yaml: malformed YAML at line 4, column 1: expected ',' or ']', "
                       "but got '<stream end>'"),
    "bad jsonl row": (["data.train_path={tmp}/tasks.jsonl"],
                      "data error: data.train_path: {tmp}/tasks.jsonl line 2: not valid JSON (Expecting property "
                      "name enclosed in double quotes at column 14)"),
    "jsonl row that is not an object": (["data.eval_path={tmp}/scalar.jsonl"],
                                        "data error: data.eval_path: {tmp}/scalar.jsonl line 2: expected a JSON "
                                        "object (one task), got int"),
    "env module that does not exist": (["env.import_path=my_envs.nope:Env"],
                                       "config error: env.import_path: cannot import env module 'my_envs.nope': No "
                                       "module named 'my_envs'"),
    "env class that does not exist": (["env.import_path=envs.guess_number:GuessNumber"],
                                      "config error: env.import_path: module 'envs.guess_number' has no attribute "
                                      "'GuessNumber'; classes there: ['Action', 'Any', 'Env', 'GuessNumberEnv', "
                                      "'StepResult']"),
    "model folder that does not exist": (["model.path={tmp}/models/mine"],
                                         "config error: model.path='{tmp}/models/mine': no such folder"),
    "folder that is not a model": (["model.path={tmp}/not_a_model"],
                                   "config error: model.path='{tmp}/not_a_model': the folder has no config.json "
                                   "(not a Hugging Face model folder)"),
    "reward source setting": ([HTTP_TYPO],
                              "config error: unknown config key 'rewards.sources.0.http.read_timeot_s'; did you mean "
                              "'rewards.sources.0.http.read_timeout_s'?"),
    "api key on the command line": (["server.api_key=sk-live-7f3a9c1e"],
                                    "config error: server.api_key is given on the command line, where every user of "
                                    "this machine reads it (ps); give server.api_key=env:NAME (an environment variable "
                                    "holding it) or server.api_key=file:PATH (a file holding it), or put it in the "
                                    "config file"),
    "api key from an unset variable": (["server.api_key=env:AGENTRL_TEST_UNSET_KEY"],
                                       "config error: invalid config: server.api_key: the environment variable "
                                       "AGENTRL_TEST_UNSET_KEY (named by env:AGENTRL_TEST_UNSET_KEY) is not set or "
                                       "empty"),
    "reward rule that does not exist": (['rewards.sources=[{name: r, type: rule, rule: "rewards.rules:nope"}]'],
                                        "config error: rewards.sources.0.rule='rewards.rules:nope': 'rewards.rules' "
                                        "has no function 'nope'"),
    "reasoning-gym dataset that does not exist": (
        ["env.import_path=envs.rgym:ReasoningGymEnv", "data.task_kwargs={dataset: basic_arithmetc}"],
        "config error: data.task_kwargs: reasoning-gym dataset 'basic_arithmetc' does not exist; did you mean "
        "'basic_arithmetic', 'bitwise_arithmetic', 'decimal_arithmetic'? (in reasoning-gym 0.1.25)"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_start_up_error_is_one_line_with_exit_2(tmp_path, case):
    args, expected = CASES[case]
    _files(tmp_path)
    out = tmp_path / "run"
    env = {**os.environ, "PYTHONPATH": str(REPO), "AGENTRL_CACHE": str(tmp_path / "cache")}
    proc = warm_python.run([sys.executable, "-m", "agentrl.train", *(a.replace("{tmp}", str(tmp_path)) for a in args),
                           f"train.out_dir={out}"], cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().splitlines() == [expected.replace("{tmp}", str(tmp_path))]
    assert not out.exists() and not (tmp_path / "cache").exists()  # nothing was built, started or written
