"""Logits -> log pi and entropy of each token under the distribution vLLM samples from (the learner's
head, for any slice of positions: `logit_tail`, `shared_prefix`)."""

from __future__ import annotations

import torch

from agentrl.algo.fused_logprobs import temperature_logprobs
from agentrl.algo.logprobs import picked_logprobs, sampling_entropy, sampling_logits


def head_logprobs(logits_BSV: torch.Tensor, ids_BS: torch.Tensor, scored_BS: torch.Tensor, temperature: float,
                  top_p: float, with_entropy: bool, entropy_grad: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    """((B, S) log p(ids[s]) from the logits at s - 1, position 0 being 0; (B, S) entropy or None).
    `entropy_grad`: the entropy is a loss term and keeps its graph."""
    if top_p >= 1.0 and not (with_entropy and entropy_grad):
        # The common case, chunked through the cache: cheaper than one log_softmax (fused_logprobs).
        logp, entropy = temperature_logprobs(logits_BSV, ids_BS, temperature, with_entropy=with_entropy)
        return logp, entropy if with_entropy else None
    # Truncating costs a vocabulary sort per row: only rows whose token enters a loss or metric.
    logits = sampling_logits(logits_BSV, temperature, top_p, scored_BT=scored_BS)
    logp = picked_logprobs(logits, ids_BS)
    if not with_entropy:
        return logp, None
    # The entropy keeps its graph only when it is a loss term; as a metric it is computed without
    # one (a (B, T, V) softmax whose graph costs as much as the logprobs' at a 49k vocabulary).
    with torch.set_grad_enabled(entropy_grad):
        return logp, sampling_entropy(logits)
