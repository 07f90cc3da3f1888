"""What the stage kinds share: per-sequence log-probabilities of the
trained tokens, and writing the trained module as a Hugging Face folder."""

from __future__ import annotations

from pathlib import Path

import torch

from agentrl.algo.logprobs import token_logprobs
from agentrl.utils.padding import pad_right, pad_tokens


def sequence_logprobs(engine, rows: list[list[int]], masks: list[list[int]], pad_id: int) -> torch.Tensor:
    """(B,) sum over each row's masked tokens of log p(token | tokens before it), at temperature 1:
    the sequence log-probability DPO and KTO compare between the policy and the reference."""
    ids, attn = pad_tokens(rows, pad_id)
    device = engine.device
    ids, attn = ids.to(device), attn.to(device)
    logits = engine(input_ids=ids, attention_mask=attn, use_cache=False).logits.float()
    logp_BT = token_logprobs(logits, ids, 1.0)
    return (logp_BT * pad_right(masks, 0.0, torch.float32, ids.shape[1]).to(device)).sum(-1)


def save_module(module: torch.nn.Module, out_dir: Path, tokenizer, zero3: bool) -> None:
    """`module.save_pretrained` in float32 with the tokenizer: a full model, or for a peft model its
    adapter (merged into a full model by `python -m agentrl.lora_merge`). Under ZeRO-3 the weights are
    gathered first, a collective every rank joins; rank 0 writes."""
    import deepspeed
    import torch.distributed as dist

    with deepspeed.zero.GatheredParameters(list(module.parameters()), enabled=zero3):
        if dist.is_initialized() and dist.get_rank() != 0:
            return
        state = {k: v.detach().to("cpu", torch.float32) for k, v in module.state_dict().items()}
        module.save_pretrained(out_dir, state_dict=state, safe_serialization=True)
    tokenizer.save_pretrained(out_dir)
