"""Reading a decoder classifier (a reward model) at chosen token positions: the pooling the reward-model
scorer (`rewards.reward_model`, right-padded rows) and the reward-model stage (`agentrl.learner.stages.
reward`, packed rows) share. It runs the model's body, so it sits here and not among `agentrl.algo`'s pure
functions of model outputs."""

from __future__ import annotations

import torch


def last_token_at(attention_mask_BT: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(row, column) index tensors of each right-padded row's last attended token, found from the mask (not
    from a pad id, which a text may contain and a tokenizer may lack)."""
    return torch.arange(attention_mask_BT.shape[0], device=attention_mask_BT.device), attention_mask_BT.sum(dim=1) - 1


def head_scores(model, inputs: dict, at: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    """(N,) float32 scores of a decoder classifier (its body under `model.base_model_prefix`, a `score` head)
    read at the N positions `at` ((row, column) index tensors) of the body's forward on `inputs`. The
    classifier's own forward is bypassed: it pools each row's rightmost non-pad token, which misreads a text
    that contains the pad id, fails without a pad id, and gives one score a row where a packed row holds
    several sequences. Gradients flow unless the caller disables them: the scorer reads rewards with this,
    and reward-model training trains through it."""
    hidden_RTH = getattr(model, model.base_model_prefix)(**inputs).last_hidden_state
    return model.score(hidden_RTH[at]).squeeze(-1).float()
