"""`agentrl.eval` (pass@k, the report, the CLI on real vLLM), rollout records (`agentrl.rollout.records`)
and `agentrl.replay` (re-scoring saved episodes; the printed numbers against hand-computed ones)."""

from __future__ import annotations

import dataclasses
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from agentrl.data import DataError
from agentrl.eval import ks_for, pass_at_k
from agentrl.rollout.records import RolloutWriter, episode_from_record, episode_to_record, read_records
from agentrl.types import Episode, Group, Turn
import warm_python

REPO = Path(__file__).resolve().parents[1]


def run_module(module: str, *args: str, timeout: int = 120) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO), "CI": "true"}
    return warm_python.run([sys.executable, "-m", module, *args], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=timeout)


# -- pass@k ---------------------------------------------------------------------------------------


def pass_at_k_by_enumeration(n: int, c: int, k: int) -> float:
    """Share of the k-subsets of n samples (c of them successes) holding a success."""
    from itertools import combinations

    subsets = list(combinations([i < c for i in range(n)], k))
    return sum(any(s) for s in subsets) / len(subsets)


def test_pass_at_k_hand_computed():
    assert pass_at_k(4, 1, 2) == pytest.approx(0.5)  # 1 - C(3,2)/C(4,2) = 1 - 3/6
    assert pass_at_k(5, 2, 2) == pytest.approx(0.7)  # 1 - C(3,2)/C(5,2) = 1 - 3/10
    assert pass_at_k(4, 1, 1) == pytest.approx(0.25)  # pass@1 = c / n
    assert pass_at_k(8, 0, 4) == 0.0
    assert pass_at_k(4, 3, 2) == 1.0  # n - c = 1 < k: every pair holds a success
    assert pass_at_k(4, 4, 4) == 1.0
    for n, c, k in [(6, 2, 3), (7, 1, 4), (5, 3, 1), (8, 3, 8)]:
        assert pass_at_k(n, c, k) == pytest.approx(pass_at_k_by_enumeration(n, c, k), abs=1e-12)
    assert pass_at_k(400, 200, 200) == pytest.approx(1.0)  # exact integer binomials do not overflow
    with pytest.raises(ValueError):
        pass_at_k(2, 1, 3)
    assert ks_for(1) == [1] and ks_for(4) == [1, 2, 4] and ks_for(6) == [1, 2, 4, 6]


# -- records --------------------------------------------------------------------------------------


def make_episode(task_id: str = "t0", group_id: int = 3, reward: float = 0.75, status: str = "ok",
                 answer: str = "7", reply: str = "7", env_reward: float | None = None) -> Episode:
    task = {"id": task_id, "answer": answer}
    ep = Episode(task_id=task_id, group_id=group_id, reward=reward, status=status,
                 info={"task": task, "env": {"success": True, "hint": {"low": 1, "high": 15}}})
    if env_reward is not None:
        ep.info["env_reward"] = env_reward
    ep.messages = [{"role": "user", "content": "Guess."}, {"role": "assistant", "content": "8"},
                   {"role": "user", "content": "Lower."}, {"role": "assistant", "content": reply}]
    ep.append([1, 2, 3], generated=False)
    ep.prompt_len = 3
    ep.append([10, 11], generated=True, logprobs=[-0.5, math.nan], versions=[4, 4])
    ep.turns.append(Turn(start=3, n_generated=2, text="8", env_tokens=2))
    ep.append([5, 6], generated=False)
    ep.append([12], generated=True, logprobs=[-0.25], versions=[5])
    ep.turns.append(Turn(start=7, n_generated=1, text=reply))
    ep.success = True
    return ep


def test_record_round_trip_through_json():
    ep = make_episode()
    record = json.loads(json.dumps(episode_to_record(ep, step=9), allow_nan=False))
    assert record["step"] == 9 and record["task"] == {"id": "t0", "answer": "7"}
    assert record["logprobs"] == [0.0, 0.0, 0.0, -0.5, None, 0.0, 0.0, -0.25]  # NaN is written as null
    back = episode_from_record(record)
    for f in dataclasses.fields(Episode):
        if f.name != "logprobs":
            assert getattr(back, f.name) == getattr(ep, f.name), f.name
    # A null logprob comes back as NaN (JSON keeps no NaN; every float there is finite or NaN).
    assert [x for x in back.logprobs if not math.isnan(x)] == [0.0, 0.0, 0.0, -0.5, 0.0, 0.0, -0.25]
    assert math.isnan(back.logprobs[4])
    assert back.turns[0] == Turn(start=3, n_generated=2, text="8", env_tokens=2)


def test_records_encode_what_json_cannot_as_documented():
    ep = make_episode()
    ep.info.update(pair=(1, 2), by_id={7: "x"}, worst=-math.inf, obj=object)
    record = episode_to_record(ep)
    assert record["step"] is None and record["task"] == ep.info["task"]
    assert (record["info"]["pair"], record["info"]["by_id"], record["info"]["worst"]) == ([1, 2], {"7": "x"}, None)
    assert record["info"]["obj"] == repr(object)
    json.dumps(record, allow_nan=False)


def group(step: int, n: int = 2) -> Group:
    return Group(group_id=step, task={"id": f"t{step}"},
                 episodes=[make_episode(f"t{step}", step, reward=float(i)) for i in range(n)])


def test_writer_resume_keeps_earlier_steps_and_drops_a_torn_line(tmp_path):
    path = tmp_path / "run" / "rollouts.jsonl"
    writer = RolloutWriter(path)
    for step in range(3):
        writer.write(step, [group(step)])
    writer.close()
    with open(path, "a") as f:
        f.write('{"task_id": "t3", "group_id": 3, "st')  # the crash cut this line
    resumed = RolloutWriter(path, start_step=2)  # the checkpoint was taken after step 1
    assert [r["step"] for r in read_records(path)] == [0, 0, 1, 1]
    resumed.write(2, [group(2, n=3)])
    resumed.close()
    records = read_records(path)
    assert [r["step"] for r in records] == [0, 0, 1, 1, 2, 2, 2]
    assert [r["task"]["id"] for r in records] == ["t0", "t0", "t1", "t1", "t2", "t2", "t2"]
    assert sorted(p.name for p in path.parent.iterdir()) == ["rollouts.jsonl"]  # no temp file left
    RolloutWriter(path).close()  # a fresh run starts an empty file
    assert path.read_text() == ""


def test_read_records_names_file_and_line(tmp_path):
    path = tmp_path / "rollouts.jsonl"
    good = json.dumps(episode_to_record(make_episode(), 0))
    path.write_text(f"{good}\n{good}\n{{not json\n")
    with pytest.raises(DataError, match=rf"^{path}:3: not a JSON record"):
        read_records(path)
    path.write_text(f"{good}\n" + json.dumps({"task_id": "x", "tokens": []}) + "\n")
    with pytest.raises(DataError, match=rf"^{path}:2: record has no 'group_id' key"):
        read_records(path)
    with pytest.raises(DataError, match="cannot read"):
        read_records(tmp_path / "missing.jsonl")


# -- replay ---------------------------------------------------------------------------------------


def write_rollouts(path: Path, episodes: list[Episode]) -> None:
    writer = RolloutWriter(path)
    for step, ep in enumerate(episodes):
        writer.write(step, [Group(group_id=step, task=ep.info["task"], episodes=[ep])])
    writer.close()


def write_config(tmp_path: Path, sources: str) -> Path:
    cfg = tmp_path / "replay.yaml"
    cfg.write_text("rewards:\n  sources:\n" + sources)
    return cfg


def test_replay_with_reweighted_env_and_a_rule(tmp_path):
    """Saved: env-only rewards. Replayed: 0.5 * env + exact_match(reply, answer)."""
    episodes = [
        make_episode("a", reward=1.0, env_reward=1.0, answer="7", reply="7"),     # 0.5 + 1 = 1.5
        make_episode("b", reward=0.0, env_reward=0.0, answer="7", reply="3"),     # 0
        make_episode("c", reward=0.25, env_reward=0.25, answer="5", reply="5"),   # 0.125 + 1 = 1.125
        make_episode("d", reward=0.5, env_reward=0.5, status="truncated", answer="x", reply="y"),  # 0.25
        make_episode("e", reward=0.0, env_reward=0.0, status="reward_error", answer="9", reply="9"),  # 1.0
        make_episode("f", reward=0.0, status="env_error"),                        # kept as saved
    ]
    rollouts = tmp_path / "rollouts.jsonl"
    write_rollouts(rollouts, episodes)
    cfg = write_config(tmp_path, "    - {name: env, type: env, weight: 0.5}\n"
                                 "    - {name: exact, type: rule, rule: 'rewards.rules:exact_match'}\n")
    out = tmp_path / "rescored.jsonl"
    proc = run_module("agentrl.replay", str(rollouts), "--config", str(cfg), "--out", str(out))
    assert proc.returncode == 0, proc.stderr
    text = proc.stdout
    assert f"file            : {rollouts} (6 episodes, steps 0..5)" in text
    assert "re-scored       : 5  (kept as saved: 1 failed in rollout)" in text
    assert "rewards changed : 3 of 4 scored before and after" in text
    # old: (1 + 0 + 0.25 + 0.5) / 4 = 0.4375; new: (1.5 + 0 + 1.125 + 0.25 + 1.0) / 5 = 0.775
    assert "mean reward     : 0.4375 -> 0.7750  (over 4 -> 5 scored episodes)" in text
    assert "status changes  : reward_error -> ok: 1" in text
    assert "source env      : mean 0.3500  ok=5" in text  # (1 + 0 + 0.25 + 0.5 + 0) / 5
    assert "source exact    : mean 0.6000  ok=5" in text
    largest = text.split("largest changes : ")[1].splitlines()[1:]
    assert [line.split() for line in largest] == [["c", "2", "0.2500", "1.1250"], ["a", "0", "1.0000", "1.5000"],
                                                  ["d", "3", "0.5000", "0.2500"]]
    rescored = {r["task_id"]: r for r in read_records(out)}
    assert [rescored[t]["reward"] for t in "abcde"] == pytest.approx([1.5, 0.0, 1.125, 0.25, 1.0])
    assert rescored["f"]["status"] == "env_error" and rescored["d"]["status"] == "truncated"
    assert rescored["a"]["info"]["rewards"]["exact"] == {"value": 1.0, "status": "ok"}


def test_replay_counts_a_failing_rule_as_reward_error_never_zero(tmp_path):
    episodes = [make_episode("good", reward=1.0, env_reward=1.0, answer="7", reply="7")]
    episodes += [make_episode(f"bad{i}", reward=0.5, env_reward=0.5, answer="no number", reply="7") for i in range(3)]
    rollouts = tmp_path / "rollouts.jsonl"
    write_rollouts(rollouts, episodes)
    cfg = write_config(tmp_path, "    - {name: env, type: env}\n"
                                 "    - {name: num, type: rule, rule: 'rewards.rules:numeric_match'}\n")
    out = tmp_path / "rescored.jsonl"
    proc = run_module("agentrl.replay", str(rollouts), "--config", str(cfg), "--out", str(out),
                      "rewards.max_retries=0")
    assert proc.returncode == 0, proc.stderr
    assert "status changes  : ok -> reward_error: 3" in proc.stdout
    assert "rewards changed : 1 of 1 scored before and after" in proc.stdout  # good: 1 -> 1 + 1
    # old (1 + 3 * 0.5) / 4 = 0.625; new: only "good" is scored, 2.0
    assert "mean reward     : 0.6250 -> 2.0000  (over 4 -> 1 scored episodes)" in proc.stdout
    assert "source num      : mean 1.0000  ok=1 error=3" in proc.stdout
    bad = [r for r in read_records(out) if r["status"] == "reward_error"]
    assert len(bad) == 3 and all("numeric_match raised ValueError" in r["error"] for r in bad)


def test_replay_and_eval_config_errors_are_one_line_with_exit_2(tmp_path):
    rollouts = tmp_path / "rollouts.jsonl"
    rollouts.write_text(json.dumps(episode_to_record(make_episode(), 0)) + "\n{oops\n")
    proc = run_module("agentrl.replay", str(rollouts))
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        f"data error: {rollouts}:2: not a JSON record (Expecting property name enclosed in double quotes at column 2)"]
    cfg = write_config(tmp_path, "    - {name: r, type: rule, rule: 'rewards.rules:no_such_rule'}\n")
    proc = run_module("agentrl.replay", str(rollouts), "--config", str(cfg))
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "config error: rewards.sources.0.rule='rewards.rules:no_such_rule': 'rewards.rules' has no function "
        "'no_such_rule'"]
    proc = run_module("agentrl.eval", "--config", "examples/agents/guess_number.yaml", "--model",
                      str(tmp_path / "no-model"), "data.eval_tasks=16")
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [f"config error: model.path='{tmp_path / 'no-model'}': no such folder"]


# -- eval on real vLLM ----------------------------------------------------------------------------


@pytest.mark.e2e
def test_eval_cli_samples_4(tmp_path, model_dir):
    out = tmp_path / "out.json"
    proc = run_module("agentrl.eval", "--config", "examples/agents/guess_number.yaml", "--model", model_dir,
                      "--samples", "4", "data.eval_tasks=16", "--json", str(out), timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    report = json.loads(out.read_text())
    assert (report["tasks"], report["samples"], report["episodes"]) == (16, 4, 64)
    assert sum(report["status"].values()) == 64
    p = report["pass_at_k"]
    assert list(p) == ["1", "2", "4"]
    assert 0.0 <= p["1"] <= p["2"] <= p["4"] <= 1.0
    finished = report["status"]["ok"] + report["status"]["truncated"]
    assert report["finished"] == finished
    if finished == 64:  # pass@1 is the success rate when every task has all its samples
        assert abs(p["1"] - report["success_rate"]) < 1e-9
    assert f"held-out score   : {report['score']:.3f}" in proc.stdout
    assert f"pass@4           : {p['4']:.3f}" in proc.stdout
    print(proc.stdout)
    bad = run_module("agentrl.eval", "--config", "examples/agents/guess_number.yaml", "--model", model_dir,
                     "--samples", "4", "data.eval_taks=16")
    assert bad.returncode == 2
    assert bad.stderr.strip().splitlines() == [
        "config error: unknown config key 'data.eval_taks'; did you mean 'data.eval_tasks'?"]
