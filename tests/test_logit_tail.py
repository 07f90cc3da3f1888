"""The learner's logit head on the scored tail only (agentrl.learner.logit_tail): where the tail
starts (by hand), that the model is asked for that many positions, and that logprobs, entropy and
parameter gradients at the scored tokens equal those of the full head, at top_p 1 and below."""

from __future__ import annotations

import functools

import pytest
import torch

from agentrl.algo.logprobs import token_entropy, token_logprobs
from agentrl.learner.logit_tail import accepts_logits_to_keep, pad_left, tail_forward, tail_start


def test_the_tail_starts_one_before_the_earliest_scored_column():
    mask = torch.tensor([[0, 0, 0, 0, 0, 1, 1, 0],
                         [0, 0, 0, 0, 1, 1, 0, 1],
                         [0, 0, 0, 0, 0, 0, 0, 0]], dtype=torch.float32)
    assert tail_start(mask) == 3  # token 4 (row 1) is predicted by the logits at position 3
    assert tail_start(mask[:1]) == 4
    assert tail_start(torch.zeros(2, 5)) == 0  # nothing scored: every position
    assert tail_start(torch.tensor([[0.0, 1.0, 1.0]])) == 0
    assert pad_left(torch.tensor([[7.0, 8.0]]), 3).tolist() == [[0.0, 0.0, 0.0, 7.0, 8.0]]


class NoKeepLM(torch.nn.Module):
    """A causal LM whose forward takes no `logits_to_keep` (older or custom models)."""

    def __init__(self, inner: torch.nn.Module) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, input_ids, attention_mask):
        return self.inner(input_ids=input_ids, attention_mask=attention_mask)


def learner_and_batch(tiny_model: str, top_p: float):
    from agentrl.config import AlgoConfig, LearnerConfig
    from agentrl.learner.rl import Learner
    from agentrl.learner.spec import LearnerSpec
    from agentrl.types import Episode, TrainBatch

    lrn = Learner(LearnerSpec(tiny_model, LearnerConfig(micro_batch_size=3), AlgoConfig(), 3, temperature=0.8, top_p=top_p))
    eps = []  # prompts of 4, 5 and 6 tokens: the earliest scored token is column 4
    for toks, n_prompt in (([1, 275, 201, 301, 299, 310, 2, 3], 4), ([1, 275, 201, 301, 305, 306, 2], 5),
                           ([1, 280, 201, 302, 303, 304, 311, 312, 2], 6)):
        ep = Episode(task_id="t", group_id=0)
        ep.append(toks[:n_prompt], generated=False)
        n = len(toks) - n_prompt
        ep.append(toks[n_prompt:], generated=True, logprobs=[-1.0] * n, versions=[0] * n)
        eps.append(ep)
    return lrn, TrainBatch.from_episodes(eps, torch.ones(3), 0)


@pytest.mark.parametrize("top_p", [1.0, 0.9], ids=["chunked-head", "nucleus"])
def test_scored_logprobs_entropy_and_gradients_equal_the_full_head(tiny_model, top_p, monkeypatch):
    lrn, batch = learner_and_batch(tiny_model, top_p)
    model = lrn.engine.module  # the bare module: DeepSpeed's engine refuses autograd.grad at ZeRO 0
    assert accepts_logits_to_keep(lrn.engine) and accepts_logits_to_keep(model)
    params = [p for p in model.parameters() if p.requires_grad]
    asked = []
    forward = type(model).forward

    @functools.wraps(forward)  # the signature stays the model's: what accepts_logits_to_keep reads
    def recording(self, **kw):
        asked.append(kw.get("logits_to_keep"))
        return forward(self, **kw)

    monkeypatch.setattr(type(model), "forward", recording)

    logp, ent = lrn._forward_logprobs(batch, slice(0, 3), engine=model, with_entropy=True)
    T = batch.input_ids.shape[1]
    assert asked == [T - 3]  # positions 3..T-1, not the whole row
    got = torch.autograd.grad((logp * batch.loss_mask * torch.arange(1.0, T + 1)).sum(), params)
    monkeypatch.setattr(type(model), "forward", forward)
    logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits
    want_logp = token_logprobs(logits, batch.input_ids, 0.8, top_p)
    want = torch.autograd.grad((want_logp * batch.loss_mask * torch.arange(1.0, T + 1)).sum(), params)

    assert not logp[:, :4].any() and not ent[:, :4].any()  # before the tail (and its first position): 0
    want_ent = token_entropy(logits.detach(), 0.8, top_p)
    # Scored tokens agree; at top_p 1 every tail position does (below 1 the learner truncates scored rows only).
    tail = batch.loss_mask if top_p < 1 else torch.ones_like(batch.loss_mask)
    assert torch.allclose(logp[:, 4:] * tail[:, 4:], want_logp[:, 4:] * tail[:, 4:], atol=1e-6, rtol=0)
    assert torch.allclose(ent[:, 4:] * tail[:, 4:], want_ent[:, 4:] * tail[:, 4:], atol=1e-5, rtol=0)
    for g_got, g_want in zip(got, want):  # float32 sums in another order: within 1e-6 of the largest entry
        assert torch.allclose(g_got, g_want, atol=1e-6 * float(g_want.abs().max()), rtol=1e-5)
    with torch.no_grad():  # the no-grad passes (pi_prox, reference) go the same way, masked
        assert torch.allclose(lrn.logprobs(batch), want_logp.detach() * batch.loss_mask, atol=1e-6, rtol=0)


def test_a_model_without_logits_to_keep_gets_every_position(tiny_model):
    lrn, batch = learner_and_batch(tiny_model, 1.0)
    plain = NoKeepLM(lrn.engine.module)
    assert not accepts_logits_to_keep(plain)
    with torch.no_grad():
        rows = torch.arange(len(batch.input_ids))
        piece = tail_forward(plain, batch.input_ids, batch.attention_mask, batch.loss_mask, rows)
        assert piece.start == 0 and piece.logits.shape[:2] == batch.input_ids.shape
        assert torch.equal(piece.ids, batch.input_ids) and torch.equal(piece.rows, rows)
        logp = lrn._forward_logprobs(batch, slice(0, 3), engine=plain)
        full = token_logprobs(lrn.engine.module(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits,
                              batch.input_ids, 0.8)
    assert torch.allclose(logp, full, atol=1e-6, rtol=0)  # every position, the prompt's included
