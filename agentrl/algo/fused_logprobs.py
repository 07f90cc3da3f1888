"""Token log-probabilities at a temperature, computed in cache-sized chunks (pure torch).

The learner's logit head is the widest tensor of a step: (B, T, V) with V = 49k-152k for real models.
Written with plain ops, `log_softmax(logits[:, :-1] / T).gather(ids)` materialises the scaled logits,
the log-softmax, a zero-filled gradient for the gather and a second copy for the `[:, :-1]` slice, each a
full pass through memory forward and backward (on SmolLM2, 8 x 256 tokens: 0.7 s of a 10 s CPU step
over a plain DeepSpeed step). Here forward and backward walk the rows in chunks of about a megabyte,
keep only (B, T) results between them and write the gradient once, straight into a (B, T, V) buffer
shaped like the model's logits, so the head costs about one read forward and one write backward.

Same values as `logprobs.token_logprobs` without truncation (top_p = 1, top_k off): the logits are
upcast to float32 and divided by the temperature, as vLLM's sampler does, and the log-normaliser is
`torch.logsumexp`; the tests compare the two, gradients included. Truncated sampling (top-p / top-k)
needs a vocabulary sort and stays on `logprobs.sampling_logits`.
"""

from __future__ import annotations

import torch

# Logits per chunk. CPU: 1 MiB of float32, so each chunk's temporaries stay in cache. CUDA: 128 MiB, so
# a 16k-token row at V = 152k is ~75 chunks of kernel launches, not 16k.
CHUNK_ELEMENTS = {"cpu": 1 << 18, "cuda": 1 << 25}


def _row_chunks(seq: int, vocab: int, device: torch.device):
    step = max(1, CHUNK_ELEMENTS.get(device.type, 1 << 25) // vocab)
    return [(start, min(start + step, seq)) for start in range(0, seq, step)]


class _TemperatureLogprobs(torch.autograd.Function):
    """logits (B, T, V) -> ((B, T) log p(ids[t]) from the logits at t - 1, (B, T) entropy or empty).
    Position 0 is 0; the logits at the last position predict nothing and get a zero gradient."""

    @staticmethod
    def forward(ctx, logits_BTV, ids_BT, temperature: float, with_entropy: bool):
        B, T, V = logits_BTV.shape
        lse_BS = logits_BTV.new_empty((B, T - 1), dtype=torch.float32)
        picked_BS = torch.empty_like(lse_BS)
        ent_BS = torch.empty_like(lse_BS) if with_entropy else None
        for b in range(B):
            for t0, t1 in _row_chunks(T - 1, V, logits_BTV.device):
                scaled_CV = logits_BTV[b, t0:t1].float() / temperature
                lse_C = torch.logsumexp(scaled_CV, dim=-1)
                lse_BS[b, t0:t1] = lse_C
                picked_BS[b, t0:t1] = scaled_CV.gather(-1, ids_BT[b, t0 + 1:t1 + 1, None]).squeeze(-1)
                if with_entropy:  # H = lse - sum_v p_v * s_v (vecdot: torch.bmm is 20x slower here)
                    p_CV = scaled_CV.sub(lse_C[:, None]).exp_()
                    ent_BS[b, t0:t1] = lse_C - torch.linalg.vecdot(p_CV, scaled_CV)
        ctx.save_for_backward(logits_BTV, ids_BT, lse_BS)
        ctx.temperature = temperature
        zero = lse_BS.new_zeros((B, 1))
        logp_BT = torch.cat([zero, picked_BS - lse_BS], dim=1)
        ent_BT = torch.cat([zero, ent_BS], dim=1) if with_entropy else lse_BS.new_empty(0)
        ctx.mark_non_differentiable(ent_BT)
        return logp_BT, ent_BT

    @staticmethod
    def backward(ctx, grad_BT, _grad_entropy):
        logits_BTV, ids_BT, lse_BS = ctx.saved_tensors
        B, T, V = logits_BTV.shape
        # d logp_t / d s_v = [v = id] - p_v, and ds/dlogits = 1 / temperature
        g_BS = grad_BT[:, 1:].float() / ctx.temperature
        grad_BTV = torch.empty_like(logits_BTV)
        grad_BTV[:, T - 1].zero_()
        for b in range(B):
            for t0, t1 in _row_chunks(T - 1, V, logits_BTV.device):
                g_C1 = g_BS[b, t0:t1, None]
                chunk_CV = (logits_BTV[b, t0:t1].float() / ctx.temperature).sub_(lse_BS[b, t0:t1, None]).exp_()
                chunk_CV.mul_(-g_C1).scatter_add_(-1, ids_BT[b, t0 + 1:t1 + 1, None], g_C1)
                grad_BTV[b, t0:t1] = chunk_CV
        return grad_BTV, None, None, None


def temperature_logprobs(logits_BTV: torch.Tensor, ids_BT: torch.Tensor, temperature: float,
                         with_entropy: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    """((B, T) log p(ids[t] | ids[:t]) at `temperature`, float32; (B, T) entropy of each predicting
    distribution when `with_entropy`, else None). Position 0 is 0 in both. The entropy carries no
    gradient (a metric); as a loss term use `logprobs.token_entropy`."""
    logp_BT, ent_BT = _TemperatureLogprobs.apply(logits_BTV, ids_BT, float(temperature), with_entropy)
    return logp_BT, (ent_BT if with_entropy else None)
