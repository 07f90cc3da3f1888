"""Per-token log-probabilities, entropies and last-token pooling from model outputs (pure torch).

Shapes: B sequences, T positions, V vocabulary, H hidden width. Position t of a (B, T) result is
about token t, predicted from the logits at position t - 1, so position 0 (nothing predicts it) is 0.
"""

from __future__ import annotations

import torch


def token_logprobs(logits_BTV: torch.Tensor, ids_BT: torch.Tensor, temperature: float) -> torch.Tensor:
    """(B, T) log p(ids[t] | ids[:t]); position 0 has no prediction and is 0."""
    logits = logits_BTV[:, :-1].float() / temperature
    target = ids_BT[:, 1:]
    picked = torch.gather(logits, -1, target.unsqueeze(-1)).squeeze(-1)
    lp = picked - torch.logsumexp(logits, dim=-1)
    return torch.cat([torch.zeros_like(lp[:, :1]), lp], dim=1)


def token_entropy(logits_BTV: torch.Tensor, temperature: float) -> torch.Tensor:
    """(B, T) entropy of the distribution that predicted token t (aligned with `token_logprobs`)."""
    logp = torch.log_softmax(logits_BTV[:, :-1].float() / temperature, dim=-1)
    ent = -(logp.exp() * logp).sum(-1)
    return torch.cat([torch.zeros_like(ent[:, :1]), ent], dim=1)


def last_token_hidden(hidden_BTH: torch.Tensor, attention_mask_BT: torch.Tensor) -> torch.Tensor:
    """(B, H) hidden state at each right-padded row's last attended token, found from the mask (not from
    a pad id, which a text may contain and a tokenizer may lack)."""
    last_B = attention_mask_BT.sum(dim=1) - 1
    return hidden_BTH[torch.arange(hidden_BTH.shape[0], device=hidden_BTH.device), last_B]
