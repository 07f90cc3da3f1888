"""End-to-end tests on the real engines: vLLM (CPU build), DeepSpeed, the real CLI, real files.

A small warm-started default model is built once per session (a shorter SFT than the main job's;
these tests check mechanics, not learning curves).
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import warm_python

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.e2e


def run_cli(tmp_path: Path, model_dir: str, *args: str) -> dict:
    """Run `python -m agentrl.train` as a user would; return summary + metrics records."""
    out = tmp_path / "run"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "CI": "true"}
    cmd = [sys.executable, "-m", "agentrl.train", f"model.path={model_dir}", f"train.out_dir={out}",
           "data.eval_tasks=16", *args]
    proc = warm_python.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    summary = json.loads((out / "summary.json").read_text())
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return {"summary": summary, "records": records, "stdout": proc.stdout, "out": out}


def test_async_training_with_staleness_2(tmp_path, model_dir):
    """Multi-turn env, max_staleness 2: the bound holds for every trained sample, and the learner's
    steps overlap generation (tokens were generated while it stepped)."""
    res = run_cli(tmp_path, model_dir, "--config", "examples/agents/guess_number.yaml", "train.steps=8",
                  "buffer.max_staleness=2", "buffer.batch_size=32", "rollout.n_samples=8")
    records = res["records"]
    assert len(records) == 8
    for rec in records:
        assert max(int(k) for k in rec["staleness_hist"]) <= 2
        assert rec["trained_staleness_max"] <= 2
        assert sum(rec["staleness_hist"].values()) == rec["episodes"]
    assert max(r["trained_staleness_max"] for r in records) >= 1  # it really ran off-policy
    assert sum(r["overlap_tokens"] for r in records) > 0
    assert all(r["push_failures"] == 0 for r in records)
    summary = res["summary"]
    # Pushes run in the background, one after another: a record carries those that landed since the
    # last one, so a push that outlasts a step (a loaded machine) shows in a later record, not in each.
    latencies = [r["push_latency_s"] for r in records if r["push_latency_s"] is not None]
    assert latencies and all(x > 0 for x in latencies)
    assert summary["train"]["final_push_ok"] and summary["fleet"]["engine_versions"] == [8]  # every push landed
    assert summary["eval_before"]["n"] == 16 and summary["eval_after"]["n"] == 16
    assert summary["eval_before"]["seconds"] > 0 and summary["eval_after"]["seconds"] > 0  # timed, as printed
    assert "held-out eval score, after RL" in res["stdout"] and ", held-out evals " in res["stdout"]
    from transformers import AutoModelForCausalLM

    saved = AutoModelForCausalLM.from_pretrained(summary["saved_model"])
    assert saved.config.model_type == "qwen2"


def test_on_policy_training_with_staleness_0(tmp_path, model_dir):
    """Single-turn rule-reward env, max_staleness 0, ZeRO-3 learner: synchronous on-policy training;
    no token is generated while the learner steps, and after every push (weights gathered from
    ZeRO-3 partitions) vLLM's logprobs equal the learner's."""
    res = run_cli(tmp_path, model_dir, "--config", "examples/agents/arithmetic.yaml", "train.steps=4",
                  "buffer.max_staleness=0", "buffer.batch_size=32", "learner.zero_stage=3")
    records = res["records"]
    assert len(records) == 4
    for rec in records:
        assert rec["staleness_hist"] == {"0": rec["episodes"]}
        assert rec["trained_staleness_max"] == 0
        assert rec["overlap_tokens"] == 0
        assert rec["batch_wait_s"] > 0  # synchronous: every batch is generated after the last step's push
        assert rec["learner_call_s"] >= rec["learner_step_s"] > 0  # the call holds the optimizer step's passes
        # Fresh samples: pi_prox (learner) and mu (vLLM) come from identical float32 weights.
        assert rec["policy/mismatch_abs"] < 1e-4
    assert res["summary"]["train"]["max_staleness_seen"] == 0
    assert (Path(res["summary"]["saved_model"]) / "model.safetensors").exists()


def test_custom_env_example_runs(tmp_path, model_dir):
    res = run_cli(tmp_path, model_dir, "--config", "examples/agents/custom_env.yaml", "train.steps=2",
                  "train.save_model=false")
    assert len(res["records"]) == 2
    assert res["summary"]["eval_after"]["failed"] == {}


@pytest.mark.parametrize("model, lr", [("model_dir", 1e-3), ("smollm2_dir", 1e-4)])
def test_vllm_logprobs_match_learner_after_push(request, model, lr):
    """After a learner step and a push, vLLM's logprobs of a fixed sequence equal the learner's within
    1e-4 (float32), and differ from the pre-step ones (the push really changed the weights): on the
    embedded default and on SmolLM2-135M (tied embeddings), through each transport in turn on one
    engine: a file in /dev/shm (its path through the RPC), then a gloo group into vLLM's worker."""
    model_dir = request.getfixturevalue(model)
    from agentrl.data.chat import load_tokenizer
    from agentrl.config import AlgoConfig, ClusterConfig, EngineConfig, LearnerConfig
    from agentrl.weights.push import LocalHub
    from agentrl.learner.rl import Learner
    from agentrl.learner.spec import LearnerSpec
    from agentrl.weights.sync import EngineWeightSync
    from agentrl.rollout.fleet import EngineFleet
    from agentrl.run.startup import pick_transport
    from agentrl.types import Episode, TrainBatch

    tok = load_tokenizer(model_dir)
    seq = tok.apply_chat_template([{"role": "user", "content": "Guess my number from 1 to 15."},
                                   {"role": "assistant", "content": "8"}, {"role": "user", "content": "Lower."},
                                   {"role": "assistant", "content": "4"}], tokenize=False)
    ids = tok.encode(seq, add_special_tokens=False)

    async def main() -> None:
        fleet = EngineFleet.local(model_dir, EngineConfig(max_num_seqs=8), tok.eos_token_id, ClusterConfig())
        await fleet.start()
        engine = fleet.members[0].engine
        try:
            learner = await asyncio.to_thread(Learner, LearnerSpec(model_dir, LearnerConfig(lr=lr), AlgoConfig(), 2))
            before = await engine.prompt_logprobs(ids)
            ep = Episode(task_id="t", group_id=0)
            ep.append(ids[:-3], generated=False)
            ep.append(ids[-3:], generated=True, logprobs=before[-3:], versions=[0, 0, 0])
            other = Episode(task_id="t", group_id=0, reward=0.0)
            other.append(ids[:-3], generated=False)
            other.append(ids[-3:], generated=True, logprobs=before[-3:], versions=[0, 0, 0])
            ep.reward = 1.0
            batch = TrainBatch.from_episodes([ep, other], torch.tensor([1.0, -0.5]), tok.pad_token_id)
            probe = TrainBatch.from_episodes([ep], torch.zeros(1), tok.pad_token_id)
            probe.loss_mask[:] = 1.0
            snapshot = lambda: learner.state_dict_cpu(clone=False)  # noqa: E731
            hub = LocalHub(snapshot, None, 60, 1 << 20)
            for transport in ("file", "collective"):
                await asyncio.to_thread(learner.step, batch)
                publish = await pick_transport(transport, fleet, hub)
                sync = EngineWeightSync(snapshot, fleet, deadline_s=60, publish=publish)
                await sync.push(learner.version)
                (result,) = await sync.drain()
                assert result.ok and engine.version == learner.version and result.pause_s > 0, (transport, result)
                after = await engine.prompt_logprobs(ids)
                learner_lp = learner.logprobs(probe)[0, 1:len(ids)].tolist()
                diff = max(abs(a - b) for a, b in zip(after, learner_lp))
                change = max(abs(a - b) for a, b in zip(after, before))
                assert diff < 1e-4, (transport, diff)
                assert change > 1e-2, (transport, change)
                before = after
            assert fleet.transport == "collective"
        finally:
            await fleet.shutdown()

    asyncio.run(main())


def test_training_continues_against_a_misbehaving_verifier(tmp_path, model_dir):
    """A real verifier on loopback that answers 500s, hangs past the deadline and sends non-JSON:
    the run finishes, failures are retried then dropped as reward_error (counted, never scored 0),
    and every eval episode is accounted for."""
    server = subprocess.Popen(
        [sys.executable, "-m", "rewards.servers.verifier", "--port", "0", "--fail-rate", "0.45",
         "--hang-rate", "0.05", "--garbage-rate", "0.1", "--hang-s", "3", "--seed", "1"],
        cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, stdout=subprocess.PIPE, text=True)
    try:
        url = server.stdout.readline().strip().rsplit(" ", 1)[-1] + "/verify"
        config = tmp_path / "flaky.yaml"
        config.write_text(f"""
env: {{import_path: "envs.arithmetic:ArithmeticEnv"}}
rollout: {{n_samples: 4, max_tokens_per_turn: 6, max_turns: 1}}
buffer: {{batch_size: 16, max_staleness: 1}}
rewards:
  on_failure: retry
  max_retries: 1
  sources:
    - {{name: verifier, type: http, http: {{url: "{url}", read_timeout_s: 0.5, max_retries: 1,
        backoff_base_s: 0.01, max_concurrency: 16}}}}
train: {{steps: 4, save_model: false}}
""")
        res = run_cli(tmp_path, model_dir, "--config", str(config))
    finally:
        server.terminate()
        server.wait(timeout=10)
    last = res["records"][-1]
    assert len(res["records"]) == 4
    statuses = {k.rsplit("/", 1)[-1]: v for k, v in last.items() if k.startswith("reward/verifier/")}
    assert statuses.get("error", 0) + statuses.get("timeout", 0) > 0
    assert statuses["retries"] > 0 and statuses["ok"] > 0
    # About 60% of attempts fail, so after both retry layers ~13% of episodes end as reward_error.
    # The buffer counts an episode when its whole group is handed in, so it may lag the rollout's count.
    assert last["episodes/reward_error"] > 0
    assert 0 < last["buffer/episodes_failed/reward_error"] <= last["episodes/reward_error"]
    # Every attempt is counted: ok + error + timeout == scored episodes + retries (>= while the
    # last episodes are still being scored when the record is written).
    attempts = statuses["ok"] + statuses.get("error", 0) + statuses.get("timeout", 0)
    scored = last.get("episodes/ok", 0) + last.get("episodes/truncated", 0) + last["episodes/reward_error"]
    assert attempts >= scored + statuses["retries"] - 16
    for when in ("eval_before", "eval_after"):
        ev = res["summary"][when]
        assert ev["n"] + sum(ev["failed"].values()) == 16  # each eval episode scored or counted as failed
        assert set(ev["failed"]) <= {"reward_error"}


def test_smollm2_quiz_example_short(tmp_path, smollm2_dir):
    """The real-model example, 2 steps: SmolLM2-135M by name, multi-turn episodes, on-policy with top_p
    0.9. The learner scores under the same nucleus vLLM sampled from, so its logprobs equal vLLM's to 1e-4
    through the whole path (template, multi-turn ledger, sampling, pushes)."""
    res = run_cli(tmp_path, "smollm2-135m-instruct", "--config", "examples/agents/smollm2_quiz.yaml",
                  "train.steps=2", "data.eval_tasks=4", "buffer.max_staleness=0", "rollout.top_p=0.9",
                  # one task's group of 4 a step, 2 questions (not 3) an episode, and no eval after: the
                  # path under test is the same, with a third of the tokens for the 135M learner on CPU
                  "data.task_kwargs={questions: 2, max_operand: 10}", "rollout.n_samples=4",
                  "buffer.batch_size=4", "train.save_model=false", "train.eval_after=false")
    records = res["records"]
    assert len(records) == 2
    for rec in records:
        assert rec["policy/mismatch_abs"] < 1e-4 and rec["push_failures"] == 0
        assert [k for k in rec if k.startswith("episodes/") and k != "episodes/ok"] == []  # no failed episode
    assert records[1]["push_pause_s"] > 0
    summary = res["summary"]
    assert summary["model"].endswith("smollm2-135m-instruct-float32")
    assert summary["eval_before"]["n"] == 4 and summary["eval_before"]["failed"] == {}
