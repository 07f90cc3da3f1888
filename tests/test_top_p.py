"""Top-p / top-k: the learner scores tokens under the distribution vLLM sampled them from (temperature,
then top-k, then top-p, renormalised over the kept tokens), checked against hand-computed values, a
slow per-row reference, vLLM's own masking code and a real vLLM engine; tokens outside the learner's
nucleus leave losses and gradients finite."""

from __future__ import annotations

import asyncio
import itertools
import math

import pytest
import torch

from agentrl.algo import POLICY_LOSSES, PolicyLossInputs, kl_estimate
from agentrl.algo.logprobs import LOGPROB_FLOOR, picked_logprobs, sampling_logits, token_entropy, token_logprobs
from agentrl.config import AlgoConfig

FLOOR = LOGPROB_FLOOR


def slow_logprobs(logits: list[float], temperature: float, top_p: float = 1.0, top_k: int = 0) -> list[float]:
    """One row, in Python floats: scale; keep every logit >= the k-th largest (ties included); renormalise;
    walk the tokens by descending probability keeping each while the mass before it is < top_p (the
    smallest prefix whose mass reaches top_p, the crossing token included); renormalise again.
    Ties in the walk keep the lower token id first. Tokens not kept get FLOOR."""
    scaled = [x / temperature for x in logits]
    kept = set(range(len(scaled)))
    if 0 < top_k < len(scaled):
        kth = sorted(scaled, reverse=True)[top_k - 1]
        kept = {i for i in kept if scaled[i] >= kth}
    z = sum(math.exp(scaled[i]) for i in kept)
    probs = {i: math.exp(scaled[i]) / z for i in kept}
    if top_p < 1.0:
        nucleus, mass = set(), 0.0
        for i in sorted(kept, key=lambda i: (-probs[i], i)):
            if mass >= top_p:
                break
            nucleus.add(i)
            mass += probs[i]
        kept = nucleus
    z = sum(math.exp(scaled[i]) for i in kept)
    return [scaled[i] - math.log(z) if i in kept else FLOOR for i in range(len(scaled))]


def all_token_logprobs(logits_V: torch.Tensor, temperature: float, top_p: float = 1.0, top_k: int = 0) -> list[float]:
    """token_logprobs of every vocabulary entry after the same one-row context."""
    vocab = logits_V.shape[0]
    logits = logits_V.expand(vocab, 2, vocab)  # row v predicts token v at position 1
    ids = torch.stack([torch.zeros(vocab, dtype=torch.long), torch.arange(vocab)], dim=1)
    return token_logprobs(logits, ids, temperature, top_p, top_k)[:, 1].tolist()


L = math.log
HAND = [
    # (probabilities, temperature, top_p, top_k, expected logprobs); logits = log(probabilities)
    # mass 0.5, 0.8, 0.95: the token that crosses 0.9 is kept, Z = 0.95
    ([0.5, 0.3, 0.15, 0.05], 1.0, 0.9, 0, [L(0.5 / 0.95), L(0.3 / 0.95), L(0.15 / 0.95), FLOOR]),
    # temperature first: p ~ [0.25, 0.09, 0.0225, 0.0025] / 0.365 -> mass 0.685, 0.932: two tokens kept
    ([0.5, 0.3, 0.15, 0.05], 0.5, 0.9, 0, [L(0.25 / 0.34), L(0.09 / 0.34), FLOOR, FLOOR]),
    # top-k first: k = 2 leaves [0.4, 0.35] / 0.75 = 0.533 >= 0.5, so top-p keeps one token
    # (top-p first over the full distribution would keep two)
    ([0.4, 0.35, 0.25], 1.0, 0.5, 2, [0.0, FLOOR, FLOOR]),
    # top-k ties: logits [2, 1, 1, 0] with k = 2 keep all three logits >= the 2nd largest
    ([math.exp(2), math.e, math.e, 1.0], 1.0, 1.0, 2,
     [2 - L(math.exp(2) + 2 * math.e), 1 - L(math.exp(2) + 2 * math.e), 1 - L(math.exp(2) + 2 * math.e), FLOOR]),
    # no truncation: the plain temperature softmax
    ([0.5, 0.3, 0.2], 2.0, 1.0, 0, [L(0.5**0.5 / (0.5**0.5 + 0.3**0.5 + 0.2**0.5)),
                                    L(0.3**0.5 / (0.5**0.5 + 0.3**0.5 + 0.2**0.5)),
                                    L(0.2**0.5 / (0.5**0.5 + 0.3**0.5 + 0.2**0.5))]),
]


@pytest.mark.parametrize("probs, temperature, top_p, top_k, expected", HAND)
def test_hand_computed_logprobs(probs, temperature, top_p, top_k, expected):
    logits = [math.log(p) for p in probs]
    assert slow_logprobs(logits, temperature, top_p, top_k) == pytest.approx(expected, abs=1e-12)
    got = all_token_logprobs(torch.tensor(logits), temperature, top_p, top_k)
    assert got == pytest.approx(expected, abs=1e-5)


def test_top_p_tie_at_the_boundary_keeps_one_and_the_same_normaliser():
    """[0.5, 0.25, 0.125, 0.125] with top_p 0.8: mass 0.5, 0.75 < 0.8, so one of the two tied 0.125
    tokens is kept (vLLM's positional mask picks which); either way Z = 0.875."""
    got = all_token_logprobs(torch.tensor([0.5, 0.25, 0.125, 0.125]).log(), 1.0, 0.8)
    assert got[:2] == pytest.approx([L(0.5 / 0.875), L(0.25 / 0.875)], abs=1e-6)
    assert sorted(got[2:]) == pytest.approx([FLOOR, L(0.125 / 0.875)], abs=1e-6)
    slow = slow_logprobs([L(0.5), L(0.25), L(0.125), L(0.125)], 1.0, 0.8)
    assert sorted(slow[2:]) == pytest.approx(sorted(got[2:]), abs=1e-6)


def test_slow_loop_reference_on_random_logits():
    """Batched torch vs the per-row loop on random rows whose top-p boundary is not within float error."""
    gen = torch.Generator().manual_seed(0)
    checked = 0
    for temperature, top_p, top_k in itertools.product([1.0, 0.7], [1.0, 0.9, 0.6], [0, 5]):
        logits_BTV = torch.randn(3, 6, 20, generator=gen, dtype=torch.float64).float() * 3
        ids_BT = torch.randint(0, 20, (3, 6), generator=gen)
        got = token_logprobs(logits_BTV, ids_BT, temperature, top_p, top_k)
        for b, t in itertools.product(range(3), range(1, 6)):
            row = logits_BTV[b, t - 1].tolist()
            if _near_boundary(row, temperature, top_p, top_k):
                continue
            checked += 1
            assert got[b, t].item() == pytest.approx(slow_logprobs(row, temperature, top_p, top_k)[ids_BT[b, t]],
                                                      abs=1e-5)
    assert checked > 150


def _near_boundary(row: list[float], temperature: float, top_p: float, top_k: int) -> bool:
    """Whether some prefix mass of the (top-k renormalised) distribution is within 1e-5 of top_p."""
    lp = slow_logprobs(row, temperature, 1.0, top_k)
    masses = itertools.accumulate(sorted((math.exp(x) for x in lp if x > FLOOR), reverse=True))
    return top_p < 1.0 and any(abs(m - top_p) < 1e-5 for m in masses)


def test_same_tokens_and_values_as_vllm_masking_code():
    """The learner's masked distribution equals vLLM's CPU path (temperature, apply_top_k_top_p,
    log_softmax) bit for bit, including rows with exact ties."""
    from vllm.v1.sample.ops.topk_topp_sampler import apply_top_k_top_p
    from vllm.v1.sample.sampler import Sampler

    gen = torch.Generator().manual_seed(1)
    for scale, vocab, temperature, top_p, top_k in itertools.product(
            [0.5, 4.0], [50, 1000], [1.0, 0.7], [1.0, 0.9, 0.5], [0, 1, 7]):
        if top_p == 1.0 and top_k == 0:
            continue
        logits = torch.randn(32, vocab, generator=gen) * scale
        logits[:4, : vocab // 2] = logits[:4, :1]  # exact ties across the boundary
        n = logits.shape[0]
        ref = Sampler.apply_temperature(logits.clone(), torch.full((n,), temperature), True)
        k = torch.full((n,), top_k, dtype=torch.int32) if top_k else None
        p = torch.full((n,), top_p, dtype=torch.float32) if top_p < 1.0 else None
        ref = apply_top_k_top_p(ref, k, p).log_softmax(dim=-1)
        ours = sampling_logits(logits[:, None].expand(n, 2, vocab), temperature, top_p, top_k)[:, 0]
        assert torch.equal(ours.log_softmax(dim=-1), ref), (scale, vocab, temperature, top_p, top_k)
        sampled = torch.multinomial(ref.exp(), 1, generator=gen)[:, 0]  # tokens vLLM could have drawn
        picked = token_logprobs(logits[:, None].expand(n, 2, vocab), torch.stack([sampled, sampled], 1),
                                temperature, top_p, top_k)[:, 1]
        # equal up to the rounding of logsumexp vs log_softmax
        assert torch.allclose(picked, ref.gather(1, sampled[:, None])[:, 0], rtol=0, atol=1e-5)


def test_only_scored_positions_are_truncated():
    """`scored_BT` (the learner passes the loss mask) truncates the rows predicting scored tokens,
    exactly as without it, and leaves the others at the plain temperature softmax (no sort)."""
    logits = torch.randn(2, 5, 30, generator=torch.Generator().manual_seed(2)) * 3
    ids = torch.randint(0, 30, (2, 5), generator=torch.Generator().manual_seed(3))
    scored = torch.tensor([[0.0, 0.0, 1.0, 1.0, 0.0], [0.0, 0.0, 0.0, 0.0, 1.0]])
    full = sampling_logits(logits, 0.8, 0.7, 5)
    part = sampling_logits(logits, 0.8, 0.7, 5, scored_BT=scored)
    rows = scored[:, 1:] > 0
    assert torch.equal(part[rows], full[rows])
    assert torch.equal(part[~rows], logits[:, :-1][~rows] / 0.8)
    assert torch.isinf(full[rows]).any()  # the truncation really happened there
    assert torch.equal(picked_logprobs(part, ids) * scored, token_logprobs(logits, ids, 0.8, 0.7, 5) * scored)


def test_token_outside_the_nucleus_gives_finite_losses_and_gradients():
    """A sampled token outside the learner's nucleus (now, at pi_prox, or at the reference) floors to
    LOGPROB_FLOOR: every loss, correction and KL estimator stays finite, with finite gradients."""
    vocab = 8
    inside = torch.tensor([2.0, 1.5, 1.0, 0.5, 0.0, -0.5, -1.0, -1.5])  # token 3 kept by top_p 0.9
    outside = inside.clone()
    outside[3] = -4.0  # token 3 now far below the nucleus
    ids = torch.tensor([[0, 3, 3, 0]])
    mask = torch.tensor([[0.0, 1.0, 1.0, 1.0]])
    behav = torch.tensor([[0.0, -2.0, -2.0, -1.0]])  # mu: vLLM kept the token
    old_rows = {"in": inside, "out": outside}
    seen = set()
    for (now, old, ref), loss_name, correction, level, adv, trust in itertools.product(
            itertools.product(["in", "out"], repeat=3), ["ppo_clip", "gspo", "cispo"], ["none", "tis", "mask"],
            ["token", "sequence"], [1.0, -1.0], ["none", "clip", "m2"]):
        logits = old_rows[now].expand(1, 4, vocab).clone().requires_grad_(True)
        logp = token_logprobs(logits, ids, 1.0, 0.9)
        with torch.no_grad():
            old_logp = token_logprobs(old_rows[old].expand(1, 4, vocab), ids, 1.0, 0.9) * mask
            ref_logp = token_logprobs(old_rows[ref].expand(1, 4, vocab), ids, 1.0, 0.9) * mask
        seen.add(logp[0, 1].item())
        cfg = AlgoConfig(clip_low=0.2, clip_high=0.2, dual_clip=None, agg="token_mean", constant_norm=1.0,
                         entropy_coef=0.01, trust_region=trust,  # clip: eps 0.2 / 0.2, m2: tau 0.04 (defaults)
                         correction={"type": correction} | ({"level": level} if correction != "none" else {}))
        inp = PolicyLossInputs(logp_BT=logp * mask, old_logp_BT=old_logp, behav_logp_BT=behav,
                               advantages_BT=torch.full((1, 4), adv), mask_BT=mask,
                               entropy_BT=token_entropy(logits, 1.0, 0.9))
        loss, metrics, *_ = POLICY_LOSSES[loss_name](inp, cfg)
        for kind in ("k1", "k2", "k3"):
            loss = loss + 0.1 * (kl_estimate(inp.logp_BT, ref_logp, kind) * mask).sum()
        loss.backward()
        case = (now, old, ref, loss_name, correction, level, adv, trust)
        assert math.isfinite(loss.item()), case
        assert all(math.isfinite(v) for v in metrics.values()), case
        assert torch.isfinite(logits.grad).all(), case
    assert min(seen) == FLOOR and -3.0 < max(seen) < 0.0  # both cases ran: floored and kept


def test_vllm_top_p_logprobs_match_the_learner(tiny_model, tiny_tokenizer):
    """Real vLLM samples with top_p 0.9 (temperature 1.0 and 0.7); the real Learner's logprobs of the
    sampled tokens equal vLLM's within 1e-4, and without the mask they would be off by more than 1e-2."""
    from agentrl.config import AlgoConfig, EngineConfig, LearnerConfig
    from agentrl.learner.rl import Learner
    from agentrl.learner.spec import LearnerSpec
    from agentrl.rollout.engine import Engine
    from agentrl.types import Episode, TrainBatch

    tok = tiny_tokenizer
    prompts = [tok.apply_chat_template([{"role": "user", "content": text}], tokenize=False, add_generation_prompt=True)
               for text in ("Guess my number from 1 to 15.", "Higher.", "What is 7 * 8?", "Lower. Try again")]
    prompt_ids = [tok.encode(p, add_special_tokens=False) for p in prompts]
    temperatures = (1.0, 0.7)

    async def sample() -> dict[float, list]:
        engine = Engine.start(tiny_model, EngineConfig(max_num_seqs=8, max_model_len=256), tok.eos_token_id)
        try:
            jobs = [engine.generate(ids, 24, temperature=t, top_p=0.9, seed=100 * i + int(10 * t))
                    for t in temperatures for i, ids in enumerate(prompt_ids)]
            gens = await asyncio.gather(*jobs)
        finally:
            engine.shutdown()
        return {t: gens[k * len(prompt_ids):(k + 1) * len(prompt_ids)] for k, t in enumerate(temperatures)}

    gens = asyncio.run(sample())
    for temperature in temperatures:
        episodes = []
        for ids, gen in zip(prompt_ids, gens[temperature]):
            ep = Episode(task_id="t", group_id=0)
            ep.append(ids, generated=False)
            ep.append(gen.token_ids, generated=True, logprobs=gen.logprobs, versions=gen.versions)
            episodes.append(ep)
        batch = TrainBatch.from_episodes(episodes, torch.zeros(len(episodes)), tok.pad_token_id)
        learner = Learner(LearnerSpec(tiny_model, LearnerConfig(micro_batch_size=4), AlgoConfig(), len(episodes),
                                      temperature=temperature, top_p=0.9))
        on = batch.loss_mask > 0
        masked = learner.logprobs(batch)
        with torch.no_grad():
            logits = learner.engine.module(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits
        unmasked = token_logprobs(logits, batch.input_ids, temperature)
        diff = (masked - batch.behav_logprobs)[on].abs().max().item()
        naive = (unmasked - batch.behav_logprobs)[on].abs().max().item()
        print(f"temperature {temperature}: {int(on.sum())} sampled tokens, max |learner - vLLM| {diff:.2e} "
              f"with the top-p mask, {naive:.2e} without")
        assert int(on.sum()) >= 60
        assert diff < 1e-4, diff
        assert naive > 1e-2, naive
