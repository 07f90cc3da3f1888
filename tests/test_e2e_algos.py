"""End to end on real vLLM and DeepSpeed, through `python -m agentrl.train` as a user runs it:

* PPO with all four models: actor, frozen reference (KL-penalised rewards, adaptive coefficient),
  critic initialised from the reward model, and a reward model this test trains itself on synthetic
  guess_number preferences; plus critic warm-up, reward normalisation, a warmup schedule and an
  EMA that is saved and reloads.
* GRPO with the k3 KL loss and TIS, the actor trained through LoRA (vLLM receives merged weights:
  at max_staleness 0 its logprobs must match the learner's), with dynamic filtering.

Mechanics are asserted here; the learning curves of longer runs are in the closing notes.
"""

from __future__ import annotations

import json
import math

import pytest
import torch
from test_e2e import run_cli

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def reward_model(model_dir, tmp_path_factory) -> str:
    from agentrl.config import load_config
    from agentrl.config.stages import StageConfig
    from agentrl.stage_cli import run
    from envs.guess_number import preference_pairs

    root = tmp_path_factory.mktemp("rm")
    pairs = root / "pairs.jsonl"
    pairs.write_text("".join(json.dumps({"chosen": c, "rejected": r}) + "\n" for c, r in preference_pairs(400, seed=0)))
    cfg = load_config(None, [f"model.path={model_dir}", f"data.paths=[{pairs}]", "data.eval_fraction=0.2",
                             f"train.out_dir={root / 'rm'}", "optim.lr=2e-3", "optim.max_steps=60", "optim.epochs=10",
                             "optim.batch_size=32", "optim.micro_batch_size=32", "optim.warmup_steps=10"], StageConfig)
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        summary = run("rm", cfg, show=False)
    finally:
        torch.set_num_threads(old)
    assert summary["evals"][-1]["eval/accuracy"] > 0.6, summary["evals"]  # it has learned something about the task
    return str(root / "rm")


def test_ppo_with_actor_critic_reference_and_reward_model(tmp_path, model_dir, reward_model):
    # The reward model runs in its own DeepSpeed engine, ZeRO-3 with parameters offloaded to CPU.
    sources = json.dumps([{"name": "rm", "type": "reward_model",
                           "reward_model": {"path": reward_model, "deepspeed": True, "offload": True}}])
    res = run_cli(
        tmp_path, model_dir, "--config", "examples/agents/guess_number.yaml", "train.steps=4",
        "buffer.batch_size=16", "rollout.n_samples=4", "buffer.max_staleness=1", "train.save_model=true",
        f"rewards.sources={sources}", "algo.advantage=gae",
        "algo.kl={type: reward, coef: 0.05, controller: {type: adaptive, target: 0.1}}", "algo.reward_norm=true",
        "critic.init_from=reward_model", "learner.freeze_actor_steps=1", "learner.warmup_steps=2",
        "learner.scheduler=cosine", "learner.ema_decay=0.9", "learner.mini_batches=2")
    records = res["records"]
    assert len(records) == 4
    assert records[0]["policy/actor_frozen"] == 1.0 and records[-1]["policy/actor_frozen"] == 0.0
    coefs = [r["policy/kl_coef"] for r in records]
    assert coefs[0] == pytest.approx(0.05) and coefs[-1] != coefs[0]  # the adaptive controller moved
    for rec in records:
        assert math.isfinite(rec["policy/critic/loss"]) and math.isfinite(rec["policy/critic/value_mean"])
        # two optimizer steps a batch: each one's metrics, policy/* each key's from the last step that has it
        first, last = rec["policy_steps"]
        assert {**first, **last} == {k[len("policy/"):]: v for k, v in rec.items()
                                     if k.startswith("policy/") and k != "policy/critic/loss"}
        assert rec["reward/rm/ok"] > 0 and rec.get("reward/rm/error", 0) == 0
    # the actor's first trained batch: its first step at warmup's lr / 2, its second at the peak
    first, second = records[1]["policy_steps"]
    assert first["lr"] == pytest.approx(second["lr"] / 2) and second["lr"] == pytest.approx(3e-4)
    for when in ("eval_before", "eval_after"):
        assert res["summary"][when]["n"] == 16 and res["summary"][when]["failed"] == {}

    # the saved model is the EMA, a normal Hugging Face folder
    from transformers import AutoModelForCausalLM

    saved = AutoModelForCausalLM.from_pretrained(res["out"] / "model", dtype=torch.float32)
    start = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    deltas = [float((a - b).abs().max()) for a, b in zip(saved.parameters(), start.parameters())]
    assert max(deltas) > 0  # trained, and loadable


def test_grpo_with_k3_kl_tis_and_lora_at_staleness_0(tmp_path, model_dir, monkeypatch):
    # GRPO and the clipped loss as a user's module registers them (tests/fixtures/custom_algo.py), named in the
    # config by module path: the learner imports the module itself, and each step calls both.
    calls = tmp_path / "algo_calls.txt"
    monkeypatch.setenv("AGENTRL_TEST_ALGO_CALLS", str(calls))
    res = run_cli(
        tmp_path, model_dir, "--config", "examples/agents/guess_number.yaml", "train.steps=4",
        "buffer.batch_size=16", "rollout.n_samples=8", "buffer.max_staleness=0", "train.save_model=false",
        "algo.kl={type: loss, coef: 0.05, estimator: k3}", "algo.correction=tis", "algo.dynamic_filter=true",
        "algo.advantage=tests.fixtures.custom_algo:my_grpo", "algo.policy_loss=tests.fixtures.custom_algo:my_ppo",
        "learner.lora.rank=8", "learner.lora.alpha=16", "learner.lr=1e-3")
    records = res["records"]
    assert len(records) == 4
    kinds = [line.split()[0] for line in calls.read_text().splitlines()]
    assert kinds.count("advantage") == 4 and kinds.count("loss") >= 4  # one estimate a step, a loss a micro-batch
    for rec in records:
        assert rec["trained_staleness_max"] == 0
        # vLLM samples from merged LoRA weights that the learner recomputes exactly
        assert rec["policy/mismatch_abs"] < 1e-4, rec["policy/mismatch_abs"]
        assert rec["policy/kl_ref"] >= 0.0
        assert 0.0 <= rec["filter/drop_rate"] <= 1.0
    assert records[-1]["policy/kl_ref"] > 0  # the adapters moved the policy away from the reference
