"""A group's common prompt run once (agentrl.learner.shared_prefix): the plan by hand, the passes the
model is asked for, and the same logprobs, entropy, parameter gradients and learner step (the
gradients its optimizer is handed) as rows run one by one (float32 summation order aside)."""

from __future__ import annotations

import functools

import pytest
import torch

from agentrl.algo.logprobs import token_entropy, token_logprobs
from agentrl.config import AlgoConfig, LearnerConfig
from agentrl.learner.shared_prefix import can_share, common_prefix, parameter_count, share_plan
from agentrl.types import Episode, TrainBatch
from optimizer_steps import assert_same_gradients, gradients_of_each_step

PROMPT_A = [1] + [3 + (7 * i) % 250 for i in range(19)]  # 20 tokens
PROMPT_B = [1] + [5 + (11 * i) % 240 for i in range(23)]  # 24 tokens


def test_the_plan_shares_each_groups_prompt_up_to_its_first_needed_logit():
    ids = torch.tensor([[1, 2, 3, 4, 5, 6, 0],
                        [1, 2, 3, 4, 7, 8, 9],
                        [1, 2, 3, 9, 9, 0, 0],
                        [1, 2, 3, 9, 9, 9, 0],
                        [4, 4, 4, 4, 4, 4, 4]])
    attn = (torch.arange(7) < torch.tensor([6, 7, 5, 6, 7])[:, None]).long()
    scored = torch.zeros(5, 7)
    scored[0, 4:6] = scored[1, 5:] = scored[2, 3:5] = scored[3, 4:6] = scored[4, 6] = 1
    groups = torch.tensor([7, 7, 3, 3, 9])
    assert common_prefix(ids[:2], attn[:2]) == 4 and common_prefix(ids[2:4], attn[2:4]) == 5
    assert common_prefix(ids[2:4], torch.tensor([[1, 1, 1, 1, 0, 0, 0], [1] * 7])) == 4  # a pad ends it
    shared, rest = share_plan(ids, attn, scored, groups, params=10, min_saved=20)  # saves (n - 1) x prefix x params
    # group 7: common 4, first scored column 4 -> the logits from 3 on: shares 3; group 3: first scored 3 -> 2
    assert [(r.tolist(), p) for r, p in shared] == [([0, 1], 3), ([2, 3], 2)] and rest.tolist() == [4]
    shared, rest = share_plan(ids, attn, scored, groups, params=10, min_saved=21)
    assert [(r.tolist(), p) for r, p in shared] == [([0, 1], 3)] and rest.tolist() == [2, 3, 4]


def make_batch() -> TrainBatch:
    """Two groups of three sharing a prompt (replies of different lengths) and a row alone."""
    eps = []
    for group, prompt, replies in ((0, PROMPT_A, ([40, 41, 42], [40, 43], [50, 51, 52, 53])),
                                   (1, PROMPT_B, ([60], [61, 62, 63, 64, 65], [60, 66])),
                                   (2, PROMPT_A[:10], ([70, 71],))):
        for k, reply in enumerate(replies):
            ep = Episode(task_id=f"t{group}", group_id=group)
            ep.append(prompt, generated=False)
            ep.append(reply, generated=True, logprobs=[-1.0] * len(reply), versions=[0] * len(reply))
            ep.append([90, 91], generated=False)  # an env turn between the policy's
            ep.append([80 + k], generated=True, logprobs=[-1.0], versions=[0])
            ep.reward = float(k == 1)
            eps.append(ep)
    return TrainBatch.from_episodes(eps, None, 0)


def new_learner(path: str, learner: dict | None = None, **algo):
    from agentrl.learner.rl import Learner
    from agentrl.learner.spec import LearnerSpec

    cfg = LearnerConfig(lr=1e-2, micro_batch_size=8, **(learner or {}))
    torch.manual_seed(0)  # LoRA's A matrices start random
    return Learner(LearnerSpec(path, cfg, AlgoConfig(**algo), 7, temperature=0.8, total_steps=2))


@pytest.mark.parametrize("top_p", [1.0, 0.9], ids=["chunked-head", "nucleus"])
def test_logprobs_entropy_and_gradients_equal_separate_rows(tiny_model, top_p, monkeypatch):
    lrn = new_learner(tiny_model)
    lrn.share_min_saved = 0  # the test's model is tiny: share whatever the saving
    lrn.top_p = top_p
    batch = make_batch()
    model = lrn.engine.module  # the bare module: DeepSpeed's engine refuses autograd.grad at ZeRO 0
    params = [p for p in model.parameters() if p.requires_grad]
    calls = []
    forward = type(model).forward

    @functools.wraps(forward)  # the signature stays the model's: what can_share reads
    def recording(self, **kw):
        calls.append((tuple(kw["input_ids"].shape), kw.get("logits_to_keep"), kw.get("past_key_values") is not None))
        return forward(self, **kw)

    monkeypatch.setattr(type(model), "forward", recording)
    assert can_share(model)

    logp, ent = lrn._forward_logprobs(batch, slice(0, 7), engine=model, with_entropy=True)
    T = batch.input_ids.shape[1]
    weights = torch.arange(1.0, T + 1).sin()
    got = torch.autograd.grad((logp * batch.loss_mask * weights).sum(), params)
    # Group 0: its 20-token prompt once (batch 1, one logit), then 3 suffixes from position 19 on
    # cached keys; group 1 the same at 24; the lone row (10-token prompt) alone, head from position 9.
    assert calls == [((1, 19), 1, False), ((3, T - 19), None, True), ((1, 23), 1, False), ((3, T - 23), None, True),
                     ((1, T), T - 9, False)]
    monkeypatch.setattr(type(model), "forward", forward)
    logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits
    want_logp = token_logprobs(logits, batch.input_ids, 0.8, top_p)
    want = torch.autograd.grad((want_logp * batch.loss_mask * weights).sum(), params)

    mask = batch.loss_mask
    assert torch.allclose(logp * mask, want_logp * mask, atol=2e-6, rtol=0)
    assert torch.allclose(ent * mask, token_entropy(logits.detach(), 0.8, top_p) * mask, atol=1e-5, rtol=0)
    for g_got, g_want in zip(got, want):  # float32 sums in another order: within 1e-6 of the largest entry
        assert torch.allclose(g_got, g_want, atol=1e-6 * float(g_want.abs().max()), rtol=1e-5)


@pytest.mark.parametrize("learner", [{}, {"zero_stage": 3}, {"lora": {"rank": 4}}], ids=["zero0", "zero3", "lora"])
def test_a_learner_step_equals_the_step_over_separate_rows(tiny_model, learner):
    """Reference and pi_prox passes (no grad) and the training pass all share; the step's metrics and
    the gradients its optimizer is handed match a learner whose rows run one by one."""
    algo = {"kl": {"type": "loss", "coef": 0.1}}
    shared = new_learner(tiny_model, learner, **algo)
    shared.share_min_saved = 0
    with gradients_of_each_step() as g_shared:
        (m_shared,) = shared.step(make_batch())
    separate = new_learner(tiny_model, learner, **algo)
    separate.share_min_saved = float("inf")  # no group shares
    with gradients_of_each_step() as g_separate:
        (m_separate,) = separate.step(make_batch())
    for key in ("kl_ref", "kl_seq_k1", "clip_frac", "entropy"):
        assert m_shared.policy[key] == pytest.approx(m_separate.policy[key], abs=1e-5), key
    assert m_shared.loss == pytest.approx(m_separate.loss, abs=1e-5)
    assert m_shared.grad_norm == pytest.approx(m_separate.grad_norm, rel=1e-5)
    # The optimizer was handed the same gradients (not: the same weights after Adam, tests/optimizer_steps.py)
    assert_same_gradients(g_shared, g_separate)


def test_gradient_checkpointing_while_training_takes_the_ordinary_pass(tiny_model):
    lrn = new_learner(tiny_model)
    model = lrn.engine.module
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    assert not can_share(model)  # Hugging Face turns the cache off there
    with torch.no_grad():
        assert can_share(model)


def test_the_parameter_count_is_taken_once_per_model(tiny_model, monkeypatch):
    lrn = new_learner(tiny_model)
    model = lrn.engine.module
    want = sum(p.numel() for p in model.parameters())
    assert parameter_count(lrn.engine) == want  # through DeepSpeed's wrapper, as the learner asks
    monkeypatch.setattr(model, "parameters", lambda *a, **k: pytest.fail("parameters walked again"))
    assert parameter_count(lrn.engine) == parameter_count(model) == want
