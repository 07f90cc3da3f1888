"""Per-token log-probabilities and entropies from model outputs (pure torch).

Shapes: B sequences, T positions, V vocabulary, H hidden width, N rows of logits. Position t of a
(B, T) result is about token t, predicted from the logits at position t - 1, so position 0 (nothing
predicts it) is 0.

The learner must score tokens under the distribution vLLM sampled them from, or every importance
weight pi/mu is biased. With top-p / top-k that distribution is truncated and renormalised. What
vLLM 0.32 does (engine `logprobs_mode="processed_logprobs"`), read from its source:
  * v1/sample/sampler.py `Sampler.sample` (lines 276-294): logits (float32) / temperature first,
    then the argmax-invariant processors (min_p; off here), then `TopKTopPSampler` on the scaled
    logits. Greedy requests (temperature < 1e-5) are scored at temperature 1 (lines 237-274).
  * Which code runs on CPU: the CPU build has no Triton, so the V1 model runner (config/vllm.py
    lines 724-728) and this `Sampler`; `TopKTopPSampler` picks `forward_cpu` on x86/ARM
    (topk_topp_sampler.py lines 227-235).
  * v1/sample/ops/topk_topp_sampler.py: `forward_cpu` (lines 315-353) runs
    `apply_top_k_top_p` and returns `log_softmax` of its output: masked tokens are -inf and the kept
    ones are renormalised over the kept set. Without Triton (the CPU build) `apply_top_k_top_p`
    (lines 460-470) is `apply_top_k_top_p_pytorch` (lines 473-514), or `apply_top_k_only` (lines
    517-536) when only top-k is set:
      - top-k first, by logit value: tokens strictly below the k-th largest logit are dropped, so
        ties with it are all kept (more than k tokens can survive);
      - then top-p on the softmax of the top-k-masked logits: sort ascending, cumsum (float32),
        drop where cumsum <= 1 - p (1 - p in float32: top_p is stored as float32), never the
        largest. So a token is kept iff the mass of the tokens before it in descending order is
        < p: the smallest prefix whose mass reaches p, including the token that crosses p.
      - Ties at the top-p boundary: the mask is positional in an unstable `torch.sort`, so which
        of several equal tokens straddling the boundary survives is up to the sort; how many
        survive, and hence the normaliser and every kept token's logprob, does not depend on it.
  * Per request, top_k 0 / -1 / >= V means off (v1/worker/gpu_input_batch.py lines 404-412).
  * CUDA builds (vLLM's V2 model runner) use a Triton kernel (v1/sample/ops/topk_topp_triton.py)
    with the same rule up to float summation order and its own tie breaking; only the CPU path
    above is checked by the tests (tests/test_top_p.py).
`sampling_logits` replays the CPU path op for op (same sort, softmax, cumsum and float32
threshold), so on equal logits it keeps exactly the same tokens.

Tokens outside the learner's kept set: a token vLLM sampled may fall outside the set the learner
keeps once their weights differ (pi_prox after a push, pi_theta after a step, the reference model),
and prompt / env tokens often do. Its log-probability is log 0 = -inf, which turns into NaN in
`logp * loss_mask`, in exp(logp - old) * 0 weights and in 0 * -inf entropy terms. We return
`LOGPROB_FLOOR` = -30 there instead (kept tokens keep their exact values):
  * it is below any token a sampler with top_p < 1 can keep (a kept token has probability at least
    (1 - p) / V: > e^-19 for p = 0.999 and V = 152k) and below anything samplable in practice
    (probability e^-30 ~ 1e-13);
  * it keeps every exp() in the losses finite in float32: a ratio exp(logp - old) or k3 KL term
    with a floored side is at most e^30 ~ 1e13, far from float32's 3e38 even times advantages and
    token sums, whereas a floor of -1e4 gives inf and then 0 * inf = NaN where w = 0;
  * the consequences are the intended ones: pi_prox at the floor gives w = pi_prox / mu ~ 0 (the
    token drops out of a token-level correction, and a sequence-level one shrinks), pi_theta at
    the floor is a constant with zero gradient.
The floor is a constant, so gradients never flow into dropped tokens; the entropy sums over kept
tokens only.
"""

from __future__ import annotations

import torch

LOGPROB_FLOOR = -30.0
_SORT_ELEMENTS = 1 << 24  # rows are sorted in chunks of about this many logits (bounds the temporaries)


def _top_k_enabled(top_k: int, vocab: int) -> bool:
    return 0 < top_k < vocab


@torch.no_grad()
def kept_tokens(logits_NV: torch.Tensor, top_p: float = 1.0, top_k: int = 0) -> torch.Tensor:
    """(N, V) bool: the tokens vLLM's CPU sampler may draw from each row of temperature-scaled
    float32 logits under top-k then top-p (module docstring); all True when both are off."""
    n, vocab = logits_NV.shape
    use_k, use_p = _top_k_enabled(top_k, vocab), top_p < 1.0
    if not use_p:
        if not use_k:
            return torch.ones_like(logits_NV, dtype=torch.bool)
        kth_N1 = logits_NV.topk(top_k, dim=-1).values[:, -1:]  # vLLM's apply_top_k_only
        return ~(logits_NV < kth_N1)
    keep = torch.empty_like(logits_NV, dtype=torch.bool)
    one_minus_p = 1 - torch.tensor([top_p], dtype=torch.float32, device=logits_NV.device)
    step = max(1, _SORT_ELEMENTS // vocab)
    for start in range(0, n, step):
        rows = slice(start, start + step)
        sorted_CV, idx_CV = logits_NV[rows].sort(dim=-1, descending=False)
        drop_CV = torch.zeros_like(sorted_CV, dtype=torch.bool)
        if use_k:
            drop_CV = sorted_CV < sorted_CV[:, vocab - top_k:vocab - top_k + 1]
            sorted_CV = sorted_CV.masked_fill(drop_CV, float("-inf"))
        cum_CV = sorted_CV.softmax(dim=-1).cumsum(dim=-1)
        drop_p_CV = cum_CV <= one_minus_p
        drop_p_CV[:, -1] = False  # at least one token
        keep[rows] = torch.empty_like(drop_CV).scatter_(-1, idx_CV, ~(drop_CV | drop_p_CV))
    return keep


def sampling_logits(logits_BTV: torch.Tensor, temperature: float, top_p: float = 1.0, top_k: int = 0,
                    scored_BT: torch.Tensor | None = None) -> torch.Tensor:
    """(B, T - 1, V) float32 logits of the distributions vLLM samples token t + 1 from: the logits
    at positions 0..T-2 divided by the temperature, -inf outside the top-k / top-p kept set.
    `scored_BT` (optional, aligned with the ids, e.g. the loss mask): only rows predicting a token
    where it is > 0 are truncated, the others keep the plain temperature softmax. Sorting the
    vocabulary is the cost (about 2 s per 512 positions at V = 49k on one core), and prompt and
    env tokens are never scored."""
    logits = logits_BTV[:, :-1].float() / temperature
    vocab = logits.shape[-1]
    if top_p >= 1.0 and not _top_k_enabled(top_k, vocab):
        return logits
    flat = logits.detach().reshape(-1, vocab)
    if scored_BT is None:
        keep = kept_tokens(flat, top_p, top_k)
    else:
        rows = scored_BT[:, 1:].reshape(-1) > 0
        keep = torch.ones_like(flat, dtype=torch.bool)
        keep[rows] = kept_tokens(flat[rows], top_p, top_k)
    return logits.masked_fill(~keep.view(logits.shape), float("-inf"))


def picked_logprobs(sampling_logits_BSV: torch.Tensor, ids_BT: torch.Tensor,
                    floor: float = LOGPROB_FLOOR) -> torch.Tensor:
    """(B, T) log p(ids[t]) under `sampling_logits` (S = T - 1 rows); position 0 is 0, a token
    outside the kept set gets `floor` (module docstring)."""
    picked = torch.gather(sampling_logits_BSV, -1, ids_BT[:, 1:].unsqueeze(-1)).squeeze(-1)
    lp = picked - torch.logsumexp(sampling_logits_BSV, dim=-1)
    lp = torch.where(torch.isneginf(lp), floor, lp)  # the -inf branch gets a zero gradient
    return torch.cat([torch.zeros_like(lp[:, :1]), lp], dim=1)


def sampling_entropy(sampling_logits_BSV: torch.Tensor) -> torch.Tensor:
    """(B, T) entropy -sum_v p log p of each `sampling_logits` row over its kept tokens (dropped
    ones have p = 0; 0 log 0 is taken as 0 without a NaN gradient); position 0 is 0."""
    logp = torch.log_softmax(sampling_logits_BSV, dim=-1)
    ent = -(logp.exp() * logp.masked_fill(torch.isneginf(logp), 0.0)).sum(-1)
    return torch.cat([torch.zeros_like(ent[:, :1]), ent], dim=1)


def token_logprobs(logits_BTV: torch.Tensor, ids_BT: torch.Tensor, temperature: float, top_p: float = 1.0,
                   top_k: int = 0) -> torch.Tensor:
    """(B, T) log p(ids[t] | ids[:t]) under the sampler's distribution (temperature, then top-k and
    top-p, renormalised); position 0 has no prediction and is 0; dropped tokens get LOGPROB_FLOOR."""
    return picked_logprobs(sampling_logits(logits_BTV, temperature, top_p, top_k), ids_BT)


def token_entropy(logits_BTV: torch.Tensor, temperature: float, top_p: float = 1.0, top_k: int = 0) -> torch.Tensor:
    """(B, T) entropy of the sampler's distribution that predicted token t (aligned with `token_logprobs`)."""
    return sampling_entropy(sampling_logits(logits_BTV, temperature, top_p, top_k))
