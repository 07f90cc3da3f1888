"""The chunked logit head (agentrl.algo.fused_logprobs) against the plain-op reference (algo.logprobs)
and against finite differences: values, gradients, entropy, chunk boundaries, dtypes."""

from __future__ import annotations

import pytest
import torch

from agentrl.algo import fused_logprobs
from agentrl.algo.fused_logprobs import temperature_logprobs
from agentrl.algo.logprobs import token_entropy, token_logprobs


@pytest.fixture(params=[1 << 18, 7 * 11], ids=["one-chunk", "chunks-of-7-rows"])
def chunking(request, monkeypatch):
    """The default chunk (whole rows fit) and a tiny one that splits every row into several chunks."""
    monkeypatch.setitem(fused_logprobs.CHUNK_ELEMENTS, "cpu", request.param)


def weighted_sum(logp_BT: torch.Tensor) -> torch.Tensor:
    """A loss with a different weight per position, so a gradient at the wrong position shows."""
    B, T = logp_BT.shape
    return (logp_BT * torch.arange(1, B * T + 1, dtype=logp_BT.dtype).view(B, T).sin()).sum()


@pytest.mark.parametrize("temperature", [1.0, 0.7, 1.3])
def test_values_and_gradients_equal_the_plain_ops(chunking, temperature):
    torch.manual_seed(0)
    logits = (3 * torch.randn(3, 9, 11)).requires_grad_()
    ids = torch.randint(0, 11, (3, 9))
    got, ent = temperature_logprobs(logits, ids, temperature, with_entropy=True)
    (g_got,) = torch.autograd.grad(weighted_sum(got), logits)
    want = token_logprobs(logits, ids, temperature)
    (g_want,) = torch.autograd.grad(weighted_sum(want), logits)
    assert got.dtype == torch.float32 and got.shape == (3, 9)
    assert torch.allclose(got, want, atol=1e-6, rtol=0)
    assert torch.allclose(g_got, g_want, atol=1e-6, rtol=0)
    assert torch.allclose(ent, token_entropy(logits.detach(), temperature), atol=1e-5, rtol=0)
    assert torch.all(got[:, 0] == 0) and torch.all(ent[:, 0] == 0)
    assert torch.all(g_got[:, -1] == 0)  # the last position predicts nothing


def test_hand_computed_two_token_vocabulary():
    # logits (0, ln 3) at temperature 1: p = (1/4, 3/4); token 1 was picked.
    logits = torch.tensor([[[0.0, 3.0 ** 0.5], [0.0, 0.0]]]).log1p()  # arbitrary second row, no prediction
    logits[0, 0] = torch.tensor([0.0, torch.log(torch.tensor(3.0))])
    logits.requires_grad_()
    logp, ent = temperature_logprobs(logits, torch.tensor([[0, 1]]), 1.0, with_entropy=True)
    assert logp[0, 1].item() == pytest.approx(torch.log(torch.tensor(0.75)).item(), abs=1e-7)
    h = -(0.25 * torch.log(torch.tensor(0.25)) + 0.75 * torch.log(torch.tensor(0.75)))
    assert ent[0, 1].item() == pytest.approx(h.item(), abs=1e-6)
    logp[0, 1].backward()
    # d log p_1 / d s = onehot(1) - p
    assert logits.grad[0, 0].tolist() == pytest.approx([-0.25, 0.25], abs=1e-7)
    assert logits.grad[0, 1].tolist() == [0.0, 0.0]


def test_gradcheck_in_float64(chunking):
    torch.manual_seed(1)
    logits = torch.randn(2, 5, 13, dtype=torch.float64, requires_grad=True)
    ids = torch.randint(0, 13, (2, 5))
    # The function upcasts to float32 like vLLM, so finite differences get float32 tolerances.
    assert torch.autograd.gradcheck(lambda x: temperature_logprobs(x, ids, 0.8)[0], (logits,), eps=1e-3, atol=1e-3,
                                    rtol=1e-3)


def test_bfloat16_logits_get_float32_logprobs_and_a_bfloat16_gradient():
    torch.manual_seed(2)
    logits = torch.randn(2, 6, 17).to(torch.bfloat16).requires_grad_()
    ids = torch.randint(0, 17, (2, 6))
    got, _ = temperature_logprobs(logits, ids, 1.0)
    assert got.dtype == torch.float32
    assert torch.allclose(got, token_logprobs(logits, ids, 1.0), atol=1e-6, rtol=0)
    weighted_sum(got).backward()
    assert logits.grad.dtype == torch.bfloat16
    (g_want,) = torch.autograd.grad(weighted_sum(token_logprobs(logits, ids, 1.0)), logits)
    assert torch.allclose(logits.grad.float(), g_want.float(), atol=1e-2, rtol=0)


def test_no_grad_forward_and_no_entropy():
    logits = torch.randn(1, 4, 5)
    with torch.no_grad():
        logp, ent = temperature_logprobs(logits, torch.tensor([[1, 2, 3, 4]]), 1.0)
    assert ent is None and not logp.requires_grad
    assert torch.allclose(logp, token_logprobs(logits, torch.tensor([[1, 2, 3, 4]]), 1.0), atol=1e-6, rtol=0)


def test_learner_forward_gives_the_plain_op_values_and_parameter_gradients(tiny_model):
    """Learner._forward_logprobs takes the chunked path at top_p = 1: same logprobs, entropy and
    parameter gradients as token_logprobs / token_entropy on the same model output."""
    from agentrl.config import AlgoConfig, LearnerConfig
    from agentrl.learner.rl import Learner
    from agentrl.learner.spec import LearnerSpec
    from agentrl.types import Episode, TrainBatch

    lrn = Learner(LearnerSpec(tiny_model, LearnerConfig(micro_batch_size=2), AlgoConfig(), 2, temperature=0.8))
    eps = []
    for toks in ([1, 275, 201, 301, 299, 310, 2], [1, 275, 201, 301, 305, 2]):
        ep = Episode(task_id="t", group_id=0)
        ep.append(toks[:4], generated=False)
        ep.append(toks[4:], generated=True, logprobs=[-1.0] * (len(toks) - 4), versions=[0] * (len(toks) - 4))
        eps.append(ep)
    batch = TrainBatch.from_episodes(eps, torch.ones(2), 0)
    model = lrn.engine.module  # the bare module: DeepSpeed's engine refuses autograd.grad at ZeRO 0
    params = [p for p in model.parameters() if p.requires_grad]

    logp, ent = lrn._forward_logprobs(batch, slice(0, 2), engine=model, with_entropy=True)
    got = torch.autograd.grad(weighted_sum(logp * batch.loss_mask), params)
    logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits
    want_logp = token_logprobs(logits, batch.input_ids, 0.8)
    want = torch.autograd.grad(weighted_sum(want_logp * batch.loss_mask), params)

    # The head runs on the scored tail (agentrl.learner.logit_tail): the prompt's 4 positions read 0.
    assert torch.allclose(logp[:, 4:], want_logp[:, 4:], atol=1e-6, rtol=0) and not logp[:, :4].any()
    assert torch.allclose(ent[:, 4:], token_entropy(logits.detach(), 0.8)[:, 4:], atol=1e-5, rtol=0)
    assert not ent.requires_grad  # a metric unless entropy_coef > 0
    for g_got, g_want in zip(got, want):
        assert torch.allclose(g_got, g_want, atol=1e-6, rtol=1e-5)
