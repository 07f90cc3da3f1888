"""The four-model learner on real DeepSpeed engines (CPU), against hand-computed numbers or the pure
functions of agentrl.algo recomputed outside the learner: critic + GAE, KL-penalised rewards, the
adaptive KL controller, critic warm-up, schedules, EMA, LoRA pushes, the unsupervised LM loss and
offload. The tiny model is untrained; only the wiring and the arithmetic are under test."""

from __future__ import annotations

import math

import pytest
import torch

from agentrl.algo import ADVANTAGES, AdvantageInputs, kl_penalized_token_rewards
from agentrl.config import AlgoConfig, CriticConfig, LearnerConfig
from agentrl.learner.models import lr_factor
from agentrl.learner.spec import LearnerSpec
from agentrl.types import Episode, TrainBatch
from optimizer_steps import assert_same_gradients, gradients_of_each_step

PROMPTS = ([1, 275, 201, 301, 299], [1, 275, 201, 301, 280])
REPLIES = ([310, 311, 2], [305, 2])  # ragged: 3 and 2 generated tokens


def make_batch(rewards=(1.0, 0.0), group=(0, 0)) -> TrainBatch:
    """Two episodes, behaviour logprobs -1.0 a token: decoupled mode reads them in the IS weight and a reward-mode KL
    penalty (tests that check those set them)."""
    eps = []
    for prompt, reply, r, g in zip(PROMPTS, REPLIES, rewards, group):
        ep = Episode(task_id="t", group_id=g)
        ep.append(list(prompt), generated=False)
        ep.append(list(reply), generated=True, logprobs=[-1.0] * len(reply), versions=[0] * len(reply))
        ep.reward = r
        eps.append(ep)
    return TrainBatch.from_episodes(eps, None, 0)


def learner(path: str, algo: AlgoConfig, critic: CriticConfig | None = None, **cfg):
    from agentrl.learner.rl import Learner

    cfg = {"lr": 1e-2, "micro_batch_size": 2, **cfg}
    return Learner(LearnerSpec(path, LearnerConfig(**cfg), algo, 2, critic=critic,
                               critic_path=path if critic is not None else None, total_steps=4))


def actor_weights(lrn) -> dict[str, torch.Tensor]:
    return lrn.state_dict_cpu()


def test_gae_uses_the_critic_and_the_critic_fits_the_returns(tiny_model):
    lrn = learner(tiny_model, AlgoConfig(advantage={"type": "gae", "gamma": 1.0, "lam": 1.0, "value_clip": 0.0}),
                  CriticConfig(lr=3e-3))
    batch = make_batch()
    (m,) = lrn.step(batch)
    # The value head starts at 0, so with gamma = lam = 1 every generated token's advantage is the
    # episode reward, and so is its return: A = [1, 1, 1] and [0, 0].
    expected = torch.zeros_like(batch.loss_mask)
    expected[0, 5:8] = 1.0
    torch.testing.assert_close(batch.advantages, expected)
    torch.testing.assert_close(batch.returns, expected)
    # critic loss = 0.5 * token-mean (V - R)^2 = 0.5 * (3 * 1 + 2 * 0) / 5
    assert m.critic_loss == pytest.approx(0.3, abs=1e-6)
    losses = [lrn.step(make_batch())[0].critic_loss for _ in range(6)]
    assert max(losses[-3:]) < 0.1, losses  # the critic learns the returns (its loss started at 0.3)
    # Later advantages are R - V(s_t) from the critic, recomputed here outside the learner.
    values = lrn.values(batch)
    out = ADVANTAGES["gae"](AdvantageInputs(rewards_B=batch.rewards, group_ids_B=batch.group_ids,
                                            mask_BT=batch.loss_mask, values_BT=values, gamma=1.0, lam=1.0))
    fresh = make_batch()
    lrn.advantages(fresh, lrn.logprobs(fresh), None, lrn.values(fresh))
    torch.testing.assert_close(fresh.advantages, out.advantages_BT)
    torch.testing.assert_close(out.advantages_BT, (batch.rewards[:, None] - values) * batch.loss_mask)


def test_whitened_gae_reaches_the_loss_and_leaves_the_critic_targets(tiny_model):
    lrn = learner(tiny_model, AlgoConfig(advantage={"type": "gae", "lam": 1.0, "whiten": True}), CriticConfig())
    batch = make_batch()
    lrn.step(batch)
    # V starts at 0: raw A = R = [1, 1, 1] and [0, 0]; over those 5 tokens mean 0.6, unbiased std
    # sqrt((3 * 0.4^2 + 2 * 0.6^2) / 4) = sqrt(0.3), so A = 0.4 / sqrt(0.3) and -0.6 / sqrt(0.3).
    std = math.sqrt(0.3) + 1e-6
    expected, returns = torch.zeros_like(batch.loss_mask), torch.zeros_like(batch.loss_mask)
    expected[0, 5:8], expected[1, 5:7], returns[0, 5:8] = 0.4 / std, -0.6 / std, 1.0
    torch.testing.assert_close(batch.advantages, expected)
    torch.testing.assert_close(batch.returns, returns)


def test_kl_penalised_rewards_reach_gae_and_the_adaptive_controller_moves(tiny_model):
    """The in-reward penalty is log mu - log ref on the sampled tokens (mu: the behaviour logprobs, not
    pi_prox), through GAE; the adaptive weight moves by that KL; pi_prox comes from the training pass."""
    algo = AlgoConfig(advantage={"type": "gae", "gamma": 1.0, "lam": 1.0},
                      kl={"type": "reward", "coef": 0.2,
                          "controller": {"type": "adaptive", "target": 0.01, "horizon": 10}})
    lrn = learner(tiny_model, algo, CriticConfig(lr=1e-3))
    batch = make_batch()
    batch.behav_logprobs = lrn.logprobs(batch)  # sampled by the weights the learner holds: mu == pi_prox
    (first,) = lrn.step(batch)
    assert first.policy["kl_seq_k1"] == pytest.approx(0.0, abs=1e-6)  # actor == reference at the start
    # Ziegler et al.: error = clip(0 / 0.01 - 1, -0.2, 0.2) = -0.2; coef *= 1 + (-0.2) * 2 / 10
    assert lrn.kl_ctl.value == pytest.approx(0.2 * 0.96)
    batch = make_batch()
    prox, ref, values = lrn.logprobs(batch), lrn.reference_logprobs(batch), lrn.values(batch)
    batch.behav_logprobs = (prox - 0.05) * batch.loss_mask  # sampled by an older policy: mu != pi_prox
    coef = lrn.kl_ctl.value
    (second,) = lrn.step(batch)
    assert second.policy["prox_reused"] == 1.0
    token_rewards, kl = kl_penalized_token_rewards(batch.rewards, batch.behav_logprobs, ref, batch.loss_mask, coef)
    expected = ADVANTAGES["gae"](AdvantageInputs(rewards_B=batch.rewards, group_ids_B=batch.group_ids,
                                                 mask_BT=batch.loss_mask, values_BT=values,
                                                 token_rewards_BT=token_rewards, gamma=1.0, lam=1.0))
    torch.testing.assert_close(batch.advantages, expected.advantages_BT)
    seq_kl = float(kl.sum(-1).mean())
    assert abs(seq_kl) > 1e-5 and second.policy["kl_seq_k1"] == pytest.approx(seq_kl, rel=1e-5)
    prox_kl = float(((prox - ref) * batch.loss_mask).sum(-1).mean())
    assert abs(prox_kl - seq_kl) > 0.04  # 0.05 a token, 2.5 tokens a row: pi_prox would read differently
    err = min(max(seq_kl / 0.01 - 1, -0.2), 0.2)
    assert lrn.kl_ctl.value == pytest.approx(coef * (1 + err * 2 / 10))


@pytest.mark.parametrize("kl", [{"type": "loss", "coef": 0.5, "estimator": "k3"}, {"type": "reward", "coef": 0.5}],
                         ids=["loss", "reward"])
def test_a_kl_term_takes_pi_prox_from_the_training_pass_and_steps_the_same(tiny_model, kl):
    """A KL loss term under a fixed weight or an in-reward penalty: pi_prox comes from the training pass
    (one forward pass fewer a step) and the step is the one a no-grad pass of its own gives: loss, KL
    metrics, the gradients each optimizer step is handed. The loss term's metric is KL(pi_prox || ref), the penalty's KL(mu || ref)."""
    from types import SimpleNamespace

    from agentrl.learner.rl import Learner

    class OwnPass(Learner):  # pi_prox from a no-grad pass before training, as without a reference
        reuses_prox = False

    algo = AlgoConfig(kl=kl)
    reused, own = (cls(LearnerSpec(tiny_model, LearnerConfig(lr=1e-2, micro_batch_size=1), algo, 2))
                   for cls in (Learner, OwnPass))  # micro-batches of one row: each writes its rows of pi_prox
    for rewards in ((1.0, 0.0), (0.0, 1.0)):
        batch = make_batch(rewards)
        logp = own.logprobs(batch) if kl["type"] == "loss" else batch.behav_logprobs
        seq_kl = float(((logp - own.reference_logprobs(batch)) * batch.loss_mask).sum(-1).mean())
        with gradients_of_each_step() as g_reused:
            (a,) = reused.step(make_batch(rewards))
        with gradients_of_each_step() as g_own:
            (b,) = own.step(batch)
        assert_same_gradients(g_reused, g_own)  # the same step (tests/optimizer_steps.py: not post-Adam weights)
        assert a.policy["prox_reused"] == 1.0 and b.policy["prox_reused"] == 0.0
        assert a.policy["kl_seq_k1"] == pytest.approx(seq_kl, rel=1e-5, abs=1e-7)  # by hand, before the step
        for key in ("kl_seq_k1", "kl_coef", "reward_shaped_mean", "clip_frac") + (("kl_ref",) if kl["type"] == "loss" else ()):
            assert a.policy[key] == pytest.approx(b.policy[key], rel=1e-5, abs=1e-7)
        assert a.loss == pytest.approx(b.loss, rel=1e-5, abs=1e-7)
    assert abs(seq_kl) > 1e-5  # the second step measured a KL: the actor had moved from the reference
    # An adaptive weight on a KL loss term is moved by KL(pi_prox || ref) before training: no reuse.
    for kl_cfg, reuses in (({"type": "reward", "coef": 0.1, "controller": {"type": "adaptive"}}, True),
                           ({"type": "loss", "coef": 0.1, "controller": {"type": "adaptive"}}, False)):
        shell = SimpleNamespace(algo=AlgoConfig(kl=kl_cfg), cfg=LearnerConfig(), reference=object())
        assert Learner.reuses_prox.fget(shell) is reuses


def test_critic_warmup_freezes_the_actor(tiny_model):
    lrn = learner(tiny_model, AlgoConfig(advantage="gae"), CriticConfig(lr=1e-2), freeze_actor_steps=1)
    start = actor_weights(lrn)
    critic_start = {k: v.clone() for k, v in lrn.critic.module.state_dict().items()}
    (m,) = lrn.step(make_batch())
    assert m.policy["actor_frozen"] == 1.0 and lrn.version == 1
    assert all(torch.equal(start[k], v) for k, v in actor_weights(lrn).items())
    assert not torch.equal(critic_start["value_head.weight"], lrn.critic.module.state_dict()["value_head.weight"])
    (m,) = lrn.step(make_batch())
    assert m.policy["actor_frozen"] == 0.0
    assert any(not torch.equal(start[k], v) for k, v in actor_weights(lrn).items())


def test_lr_schedule_by_hand_and_in_the_engine(tiny_model):
    assert [lr_factor(s, "linear", 2, 4, 0.0) for s in range(5)] == [0.5, 1.0, 1.0, 0.5, 0.0]
    assert lr_factor(3, "cosine", 2, 4, 0.1) == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi / 2)))
    assert lr_factor(7, "constant", 2, 4, 0.0) == 1.0
    lrn = learner(tiny_model, AlgoConfig(), lr=1e-3, scheduler="linear", warmup_steps=2)
    seen = []
    for _ in range(4):
        seen.append(lrn.engine.optimizer.param_groups[0]["lr"])
        lrn.step(make_batch())
    assert seen == pytest.approx([5e-4, 1e-3, 1e-3, 5e-4])


def test_ema_is_saved_and_reloads(tiny_model, tiny_tokenizer, tmp_path):
    from transformers import AutoModelForCausalLM

    lrn = learner(tiny_model, AlgoConfig(), ema_decay=0.5)
    w0 = actor_weights(lrn)
    lrn.step(make_batch())
    w1 = actor_weights(lrn)
    lrn.step(make_batch())
    w2 = actor_weights(lrn)
    lrn.save(str(tmp_path / "ema"), tiny_tokenizer)
    saved = AutoModelForCausalLM.from_pretrained(tmp_path / "ema", dtype=torch.float32).state_dict()
    for key, value in saved.items():  # 0.5 * (0.5 * w0 + 0.5 * w1) + 0.5 * w2
        torch.testing.assert_close(value, 0.25 * w0[key] + 0.25 * w1[key] + 0.5 * w2[key])
    assert not torch.equal(saved["model.layers.0.mlp.up_proj.weight"], w2["model.layers.0.mlp.up_proj.weight"])


def test_lora_pushes_merged_weights_keyed_like_the_base_model(tiny_model):
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32)
    lrn = learner(tiny_model, AlgoConfig(), lora={"rank": 4, "alpha": 8})
    lrn.step(make_batch())
    lrn.step(make_batch())
    merged = lrn.state_dict_cpu()
    base_sd = base.state_dict()
    assert set(base_sd) | {"lm_head.weight"} == set(merged)
    changed = {k for k in base_sd if not torch.equal(base_sd[k], merged[k])}
    assert changed and all(k.split(".")[-2] in ("q_proj", "k_proj", "v_proj", "o_proj") for k in changed)
    base.load_state_dict(merged, strict=False)  # a fresh model with the merged weights = the trained policy
    batch = make_batch()
    ids, attn = batch.input_ids, batch.attention_mask
    from agentrl.algo.logprobs import token_logprobs

    with torch.no_grad():
        fresh = token_logprobs(base(input_ids=ids, attention_mask=attn).logits, ids, 1.0) * batch.loss_mask
    torch.testing.assert_close(fresh, lrn.logprobs(batch), atol=1e-5, rtol=1e-5)


def test_unsupervised_lm_loss_is_added_with_its_coefficient(tiny_model, tiny_tokenizer, tmp_path):
    from transformers import AutoModelForCausalLM

    from agentrl.data import lm_batches
    from agentrl.learner.rl import Learner

    texts = tmp_path / "texts.txt"
    texts.write_text("Higher. Guess again.\nLower.\nWhat is 3 + 4? 7\n")
    batches = lm_batches(texts, tiny_tokenizer, 2, 64, seed=0)
    ids, attn = next(lm_batches(texts, tiny_tokenizer, 2, 64, seed=0))  # the same first batch
    model = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32)
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=attn).logits[:, :-1]
    target = ids[:, 1:].masked_fill(attn[:, 1:] == 0, -100)
    expected = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), target.reshape(-1))
    lrn = Learner(LearnerSpec(tiny_model, LearnerConfig(lr=1e-3, micro_batch_size=2, unsup_coef=0.5,
                                              unsup_data=str(texts)), AlgoConfig(), 2), unsup_batches=batches)
    (m,) = lrn.step(make_batch(rewards=(1.0, 1.0)))  # equal rewards: GRPO advantages 0, policy loss 0
    assert m.policy["unsup_loss"] == pytest.approx(float(expected), rel=1e-5)
    assert m.loss == pytest.approx(0.5 * float(expected), rel=1e-5)


@pytest.mark.parametrize("cfg", [
    {"zero_stage": 1, "offload_optimizer": True, "reference_offload": True},
    {"zero_stage": 3, "offload_optimizer": True, "offload_params": True, "gradient_checkpointing": True},
])
def test_offload_and_checkpointing_train_like_the_plain_engine(tiny_model, cfg):
    """Same first-step loss and KL as a plain ZeRO-0 engine, and the weights move."""
    algo = AlgoConfig(kl={"type": "loss", "coef": 0.1})
    plain = learner(tiny_model, algo)
    (expected,) = plain.step(make_batch())
    lrn = learner(tiny_model, algo, **cfg)
    start = actor_weights(lrn)
    (m,) = lrn.step(make_batch())
    assert m.loss == pytest.approx(expected.loss, abs=1e-5)
    assert m.policy["kl_ref"] == pytest.approx(0.0, abs=1e-6)
    assert any(not torch.equal(start[k], v) for k, v in actor_weights(lrn).items())


def test_dynamic_filter_keeps_only_groups_with_a_signal():
    from agentrl.rollout.pool import _informative

    def group(*rewards, status="ok"):
        eps = []
        for r in rewards:
            ep = Episode(task_id="t", group_id=0)
            ep.append([1, 2], generated=True, logprobs=[0.0, 0.0], versions=[0, 0])
            ep.reward, ep.status = r, status
            eps.append(ep)
        return eps

    assert _informative(group(1.0, 0.0, 0.0))
    assert not _informative(group(1.0, 1.0, 1.0)) and not _informative(group(0.0, 0.0))
    assert not _informative(group(1.0))  # a group of one has no baseline
    assert not _informative(group(1.0, 0.0, status="reward_error"))  # only trainable episodes count


def test_entropy_bonus_enters_the_loss_with_its_coefficient(tiny_model):
    """Equal rewards give zero advantages, so the loss is exactly -entropy_coef * token-mean entropy,
    recomputed here from a fresh model's logits."""
    from transformers import AutoModelForCausalLM

    from agentrl.algo.logprobs import token_entropy

    batch = make_batch(rewards=(1.0, 1.0))
    model = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32)
    with torch.no_grad():
        ent = token_entropy(model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits, 1.0)
    expected = float((ent * batch.loss_mask).sum() / batch.loss_mask.sum())
    probs = torch.softmax(torch.tensor([1.0, 2.0, 3.0]), -1)  # the formula on one hand-made row
    hand = token_entropy(torch.log(probs)[None, None].expand(1, 2, 3), 1.0)[0, 1]
    assert float(hand) == pytest.approx(float(-(probs * probs.log()).sum()), rel=1e-6)
    lrn = learner(tiny_model, AlgoConfig(entropy_coef=0.01))
    (m,) = lrn.step(batch)
    assert m.policy["entropy"] == pytest.approx(expected, rel=1e-5)
    assert m.loss == pytest.approx(-0.01 * expected, rel=1e-4)
