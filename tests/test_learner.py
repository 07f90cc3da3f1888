"""The DeepSpeed learner on CPU against hand-computed numbers: the decoupled correction weight,
bypass mode, the frozen reference and its KL term, versions counting optimizer steps."""

from __future__ import annotations

import math

import pytest
import torch

from agentrl.config import AlgoConfig, LearnerConfig
from agentrl.learner.spec import LearnerSpec
from agentrl.types import Episode, TrainBatch


def make_batch(learner, log_w: float, adv: float = 1.0, rows: int = 2) -> TrainBatch:
    """Two (or `rows`, up to 4) episodes whose behaviour logprobs are pi_prox - log_w, so the weight
    pi_prox/mu = e^log_w."""
    eps = []
    for last in (310, 305, 307, 303)[:rows]:
        toks = [1, 275, 201, 301, 299, last, 2]
        ep = Episode(task_id="t", group_id=0)
        ep.append(toks[:5], generated=False)
        ep.append(toks[5:], generated=True, logprobs=[0.0, 0.0], versions=[0, 0])
        eps.append(ep)
    batch = TrainBatch.from_episodes(eps, torch.full((rows,), adv), 0)
    batch.behav_logprobs = (learner.logprobs(batch) - log_w) * batch.loss_mask
    return batch


def test_decoupled_tis_weight_enters_the_loss_exactly(tiny_model):
    from agentrl.learner.rl import Learner

    learner = Learner(LearnerSpec(tiny_model, LearnerConfig(lr=1e-4, micro_batch_size=1),
                                  AlgoConfig(correction={"type": "tis", "high": 1.5}, trust_region="none"), 2))
    # w = pi_prox / mu = 2 > correction.high -> truncated to 1.5; r = 1 on the first step, A = 1:
    # loss = -mean_t(1.5 * 1 * 1) = -1.5 over the 4 generated tokens (two micro-batches of 2 tokens).
    (m,) = learner.step(make_batch(learner, math.log(2.0)))
    assert m.loss == pytest.approx(-1.5, abs=1e-5)
    assert m.policy["is_weight_mean"] == pytest.approx(2.0, rel=1e-5)
    assert m.policy["is_corrected_frac"] == pytest.approx(1.0)
    assert learner.version == 1 and m.n_tokens == 4 and math.isfinite(m.grad_norm) and m.grad_norm > 0
    # all 4 tokens were sampled at version 0 and trained at version 0: one staleness bucket
    assert m.policy["stale0/tokens"] == 4.0 and m.policy["stale0/is_corrected_frac"] == pytest.approx(1.0)
    assert m.policy["stale0/mismatch_abs"] == pytest.approx(math.log(2.0), rel=1e-5)
    # one optimizer step, no reference: pi_prox came from the training pass itself (no extra forward),
    # and it equals the no-grad pass that made mu above to 1e-5
    assert learner.reuses_prox and m.policy["prox_reused"] == 1.0


def test_bypass_mode_ignores_the_behaviour_gap(tiny_model):
    from agentrl.learner.rl import Learner

    learner = Learner(LearnerSpec(tiny_model, LearnerConfig(lr=1e-4, mini_batches=2, micro_batch_size=1),
                                  AlgoConfig(mode="bypass", trust_region="none"), 2))
    # bypass: old = mu, so w = 1 and r = pi/mu = e^log_w = 1.25 on the first mini-batch, inside the
    # clip range [0.8, 1.2]? no: 1.25 > 1.2 and A > 0 -> the clipped term 1.2 is taken: loss = -1.2.
    results = learner.step(make_batch(learner, math.log(1.25)))
    assert len(results) == 2 and learner.version == 2  # one version per optimizer step
    assert results[0].loss == pytest.approx(-1.2, abs=1e-5)
    assert results[0].policy["clip_frac"] == pytest.approx(1.0)
    assert not learner.reuses_prox and results[0].policy["prox_reused"] == 0.0


def test_train_mode_pass_equals_the_no_grad_pass_with_dropout_configured(tiny_model):
    # LoRA dropout 0.5 would make the training pass (train mode) a different function from pi_prox
    # and the reference (eval mode); the learner turns every dropout off, so they agree.
    from agentrl.config import LoraConfig
    from agentrl.learner.rl import Learner

    cfg = LearnerConfig(lr=1e-4, micro_batch_size=2, mini_batches=2, lora=LoraConfig(rank=4, dropout=0.5))
    learner = Learner(LearnerSpec(tiny_model, cfg, AlgoConfig(), 2))
    batch = make_batch(learner, 0.0)
    learner.engine.train()
    with torch.no_grad():
        train_pass = learner._forward_logprobs(batch, slice(0, 2)) * batch.loss_mask
    torch.testing.assert_close(train_pass, learner.logprobs(batch), rtol=0, atol=1e-6)


def test_disable_dropout_makes_train_mode_deterministic(tiny_model):
    from transformers import AutoConfig, AutoModelForCausalLM

    from agentrl.learner.models import disable_dropout

    config = AutoConfig.from_pretrained(tiny_model)
    config.attention_dropout = 0.5
    model = AutoModelForCausalLM.from_config(config, attn_implementation="eager")
    ids = torch.tensor([[1, 275, 201, 301, 299, 310, 2]])
    torch.manual_seed(0)
    assert not torch.equal(model.train()(ids).logits, model.train()(ids).logits)  # dropout draws differ
    disable_dropout(model)
    torch.testing.assert_close(model.train()(ids).logits, model.eval()(ids).logits, rtol=0, atol=0)


def test_reference_kl_is_zero_at_start_and_grows_after_updates(tiny_model):
    from agentrl.learner.rl import Learner

    learner = Learner(LearnerSpec(tiny_model, LearnerConfig(lr=1e-2, micro_batch_size=2),
                                  AlgoConfig(kl={"type": "loss", "coef": 0.5, "estimator": "k3"}), 2))
    (first,) = learner.step(make_batch(learner, 0.0, adv=1.0))
    assert first.policy["kl_ref"] == pytest.approx(0.0, abs=1e-6)  # actor == reference before any update
    (second,) = learner.step(make_batch(learner, 0.0, adv=0.0))
    # with zero advantages the loss is exactly kl.coef * mean_t k3(logp - ref_logp)
    assert second.policy["kl_ref"] > 1e-4
    assert second.loss == pytest.approx(0.5 * second.policy["kl_ref"], rel=1e-4)


def _two_step_learner(tiny_model, target_kl: float, steps: int = 2):
    from agentrl.learner.rl import Learner

    cfg = LearnerConfig(lr=1e-2, mini_batches=steps, micro_batch_size=1, target_kl=target_kl)
    return Learner(LearnerSpec(tiny_model, cfg, AlgoConfig(trust_region="none"), steps))


def test_target_kl_stops_a_batchs_later_steps_once_the_first_moved_the_policy_past_it(tiny_model):
    """Two rows, two optimizer steps (row 0, then row 1). Before the second, the learner measures
    KL(pi_prox || pi_theta) on row 1 (k3: r - 1 - log r per token, r = pi_theta/pi_prox, a mean): checked
    here by a loop over the tokens, from the weights left after the batch (the stopped step leaves them)."""
    stopped, taken = _two_step_learner(tiny_model, 1e-9), _two_step_learner(tiny_model, 10.0)
    batch = make_batch(stopped, 0.0)  # mu = pi_prox: the first step's ratio is 1
    prox = batch.behav_logprobs.clone()
    first, second = stopped.step(batch)
    assert stopped.version == 2  # a stopped step still counts as a version (the buffer's staleness is in steps)
    assert second.policy["kl_stopped"] == 1.0 and second.loss == 0.0 and "kl_stopped" not in first.policy
    # the skipped step ran no training pass, so it has no pass metrics (metrics.jsonl takes them from the first)
    assert "entropy" not in second.policy and "is_ess" not in second.policy and "entropy" in first.policy
    now = stopped.logprobs(batch)
    log_r = [float(now[1, t] - prox[1, t]) for t in range(batch.loss_mask.shape[1]) if batch.loss_mask[1, t] > 0]
    terms = [math.exp(x) - 1 - x for x in log_r]
    # the same weights through the same code, in a different grouping of rows: float32 rounding of
    # log pi (1e-6) moves each term by about |log r| * 1e-6
    assert second.policy["step_kl"] == pytest.approx(sum(terms) / len(terms), rel=1e-4, abs=1e-7)
    assert second.policy["step_kl"] > 1e-6  # lr 1e-2: the first step moved row 1's tokens too
    # the viewer's log pi for row 1, which nothing trained: the weights' now, from the measuring pass
    torch.testing.assert_close(first.token_values["learner_logprobs"][1], now[1], rtol=0, atol=1e-5)

    first_t, second_t = taken.step(make_batch(taken, 0.0))
    assert second_t.policy["kl_stopped"] == 0.0 and second_t.loss != 0.0 and taken.version == 2
    # the same first step from the same weights: the same KL measured before the second
    assert second_t.policy["step_kl"] == pytest.approx(second.policy["step_kl"], rel=1e-4, abs=1e-7)
    # the second step was taken: row 1's log pi moved past where the stopped learner left it
    assert (taken.logprobs(batch) - now)[1].abs().max() > 1e-4


def test_target_kl_needs_more_than_one_step_a_batch():
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match=r"learner.target_kl=0.01 needs learner.mini_batches > 1"):
        LearnerConfig(target_kl=0.01)
    assert LearnerConfig(target_kl=0.01, mini_batches=4).target_kl == 0.01


def test_target_kl_skips_every_later_step_of_the_batch_once_it_stops(tiny_model):
    """Three rows, three steps: stopped before the second, the third is skipped too (no second measure), and
    the viewer's log pi of both skipped rows is the weights' after the first step."""
    learner = _two_step_learner(tiny_model, 1e-9, steps=3)
    batch = make_batch(learner, 0.0, rows=3)
    first, second, third = learner.step(batch)
    assert (second.policy["kl_stopped"], third.policy["kl_stopped"]) == (1.0, 1.0) and learner.version == 3
    assert third.policy["step_kl"] == second.policy["step_kl"] and second.loss == third.loss == 0.0
    torch.testing.assert_close(first.token_values["learner_logprobs"][1:], learner.logprobs(batch)[1:],
                               rtol=0, atol=1e-5)


def _bounded_learner(tiny_model, bound: float | None, steps: int = 1):
    from agentrl.learner.rl import Learner

    cfg = LearnerConfig(lr=1e-2, mini_batches=steps, micro_batch_size=1, max_step_kl=bound)
    return Learner(LearnerSpec(tiny_model, cfg, AlgoConfig(trust_region="none"), steps))


def _weights(learner) -> list[torch.Tensor]:
    return [p.detach().clone() for p in learner.engine.module.parameters() if p.requires_grad]


def _k3(after: torch.Tensor, before: torch.Tensor, mask: torch.Tensor) -> float:
    """Mean k3 of KL(pi_before || pi_after) over the scored tokens, by a loop over them."""
    log_r = [float(after[b, t] - before[b, t]) for b in range(mask.shape[0]) for t in range(mask.shape[1])
             if mask[b, t] > 0]
    return sum(math.exp(x) - 1 - x for x in log_r) / len(log_r)


def test_max_step_kl_shortens_a_step_along_its_line_until_its_kl_is_within_the_bound(tiny_model):
    """One optimizer step over two rows, the same from the same weights in three learners: no bound, a bound it
    stays within, and a bound at a 60th of the KL the step moved (k3 on the step's own tokens, checked by a loop
    over them): that one must leave theta_0 + s (theta_1 - theta_0), its tokens' KL within the bound."""
    free, within = _bounded_learner(tiny_model, None), _bounded_learner(tiny_model, 10.0)
    theta0, batch = _weights(free), make_batch(free, 0.0)
    before = free.logprobs(batch)
    free.step(batch)
    theta1 = _weights(free)
    moved = _k3(free.logprobs(batch), before, batch.loss_mask)
    assert moved > 0.1  # lr 1e-2 on a tiny model: Adam's first step moves it far
    (m,) = within.step(make_batch(within, 0.0))
    # the training pass's log pi and the no-grad pass's in another grouping: float32 rounding, ~|log r| * 1e-6 a term
    assert m.policy["moved_kl"] == pytest.approx(moved, rel=1e-4) and m.policy["step_scale"] == 1.0
    assert m.policy["step_kl_bounded"] == m.policy["moved_kl"]
    for p, q in zip(_weights(within), theta1):
        torch.testing.assert_close(p, q, rtol=0, atol=1e-7)  # within the bound: the step as taken

    bound = moved / 60
    bounded = _bounded_learner(tiny_model, bound)
    (b,) = bounded.step(make_batch(bounded, 0.0))
    scale = b.policy["step_scale"]
    assert b.policy["moved_kl"] == pytest.approx(moved, rel=1e-4) and 0.0 < scale < 1.0
    for p, p0, p1 in zip(_weights(bounded), theta0, theta1):
        torch.testing.assert_close(p, p0 + scale * (p1 - p0), rtol=1e-4, atol=1e-6)
    left = _k3(bounded.logprobs(batch), before, batch.loss_mask)
    assert left == pytest.approx(b.policy["step_kl_bounded"], rel=1e-3) and left <= bound
    assert bounded.version == 1  # a shortened step still counts as a version
    # tries go on from the last one's KL as if quadratic, aimed at half the bound: s_1 = sqrt(bound / (2 moved))
    first = math.sqrt(bound / (2 * moved))
    assert scale == pytest.approx(first, rel=1e-4) or scale < first


def test_step_scale_is_the_quadratic_estimate_from_the_last_try():
    from agentrl.learner.step_bound import step_scale

    assert step_scale(0.01, 0.05) == 1.0 and step_scale(0.05, 0.05, 0.5) == 0.5
    # aimed at half the bound: sqrt(0.025 / 0.4) = 0.25, and from a try at 0.5: 0.5 * sqrt(0.025 / 1.6) = 0.0625
    assert step_scale(0.4, 0.05) == pytest.approx(0.25) and step_scale(1.6, 0.05, 0.5) == pytest.approx(0.0625)


def test_max_step_kl_needs_the_modules_own_weights():
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match=r"learner.max_step_kl=0.05 needs learner.zero_stage 0 and "
                                              r"learner.dtype float32.*got zero_stage 2, dtype float32"):
        LearnerConfig(max_step_kl=0.05, zero_stage=2)
    with pytest.raises(ValidationError, match=r"got zero_stage 0, dtype bfloat16"):
        LearnerConfig(max_step_kl=0.05, dtype="bfloat16")
    assert LearnerConfig(max_step_kl=0.05).max_step_kl == 0.05
