"""The PPO critic: a decoder body with a scalar value head, V(s_t) for every token position t.

`ValueModel.from_pretrained(path)` reads three kinds of folder:
  * a folder written by `ValueModel.save_pretrained` (body + `value_head.safetensors`): reloaded as saved;
  * a sequence-classifier reward model (`*ForSequenceClassification`, num_labels=1): the body AND its
    `score` weight initialise the critic, as DeepSpeed-Chat and OpenRLHF start the critic from the
    reward model, so the first value estimates already track the reward;
  * a causal LM (the actor's starting weights): the body without the LM head, and a value head of
    zeros. Zeros, not small random values: every initial value is exactly 0, so the first GAE
    advantages are the plain discounted returns instead of returns minus noise, and runs are
    reproducible across seeds of the head. The head's own gradient (dL/dV * h) is non-zero from the
    first step; the body receives gradient from the second step on, once the head is non-zero.

The body is `AutoModel` (e.g. `Qwen2Model`). Causal-LM and classifier checkpoints both keep the body
under the model's `base_model_prefix` (`model.` for Qwen2/Llama), which `AutoModel.from_pretrained`
strips, so both load the same body weights; the classifier's `score.weight` (and `lm_head.weight`)
are reported as unexpected keys and ignored by that load.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

VALUE_HEAD_FILE = "value_head.safetensors"


class ValueModel(torch.nn.Module):
    """values_BT = value_head(body(input_ids).last_hidden_state). The head is Linear(hidden, 1) with a bias."""

    def __init__(self, body: torch.nn.Module, value_head: torch.nn.Linear) -> None:
        super().__init__()
        self.body = body
        self.value_head = value_head

    @property
    def config(self):
        """The body's Hugging Face config (peft and DeepSpeed read `model.config`)."""
        return self.body.config

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        """(B, T) float32 values, one per position: the value of the state ending at token t.
        Positions are 0..T-1 (right padding); padded positions get values that callers mask out."""
        hidden_BTH = self.body(input_ids=input_ids, attention_mask=attention_mask, use_cache=False).last_hidden_state
        return self.value_head(hidden_BTH.to(self.value_head.weight.dtype)).squeeze(-1).float()

    def gradient_checkpointing_enable(self, gradient_checkpointing_kwargs: dict | None = None) -> None:
        self.body.gradient_checkpointing_enable(gradient_checkpointing_kwargs=gradient_checkpointing_kwargs)

    def gradient_checkpointing_disable(self) -> None:
        self.body.gradient_checkpointing_disable()

    def enable_input_require_grads(self) -> None:
        """Needed only for reentrant checkpointing with a frozen embedding (LoRA); transformers 5 defaults to
        non-reentrant checkpointing, which does not need it."""
        self.body.enable_input_require_grads()

    def get_input_embeddings(self) -> torch.nn.Module:
        return self.body.get_input_embeddings()

    @classmethod
    def from_pretrained(cls, path: str | os.PathLike, dtype: torch.dtype = torch.float32) -> "ValueModel":
        """Load a saved critic, a reward model (body + score as head) or a causal LM (body + zero head)."""
        from transformers import AutoModel, AutoModelForSequenceClassification

        path = str(path)
        if (Path(path) / VALUE_HEAD_FILE).exists():
            body = AutoModel.from_pretrained(path, dtype=dtype)
            head = _linear_head(body.config.hidden_size, dtype)
            head.load_state_dict(load_file(Path(path) / VALUE_HEAD_FILE))
            return cls(body, head)
        if _is_sequence_classifier(path):
            rm = AutoModelForSequenceClassification.from_pretrained(path, dtype=dtype)
            score = getattr(rm, "score", None)
            if not isinstance(score, torch.nn.Linear) or score.out_features != 1:
                raise ValueError(f"{path}: a critic needs a reward model with a Linear `score` of one output, "
                                 f"got {score!r}")
            head = _linear_head(rm.config.hidden_size, dtype)
            with torch.no_grad():
                head.weight.copy_(score.weight)
                head.bias.copy_(score.bias if score.bias is not None else torch.zeros(1))
            return cls(rm.base_model, head)
        body = AutoModel.from_pretrained(path, dtype=dtype)
        return cls(body, _linear_head(body.config.hidden_size, dtype))

    def save_pretrained(self, out_dir: str | os.PathLike, state_dict: dict[str, torch.Tensor] | None = None) -> None:
        """Write the body as a normal Hugging Face folder plus `value_head.safetensors` (keys weight, bias).
        `state_dict` (keys as in `self.state_dict()`) replaces the live weights, e.g. gathered ZeRO-3 ones."""
        out_dir = Path(out_dir)
        out_dir.mkdir(parents=True, exist_ok=True)
        sd = state_dict if state_dict is not None else self.state_dict()
        body_sd = {k[len("body."):]: v for k, v in sd.items() if k.startswith("body.")}
        self.body.save_pretrained(out_dir, state_dict=body_sd)
        head_sd = {k[len("value_head."):]: v.detach().cpu().contiguous() for k, v in sd.items()
                   if k.startswith("value_head.")}
        save_file(head_sd, out_dir / VALUE_HEAD_FILE)


def _linear_head(hidden: int, dtype: torch.dtype) -> torch.nn.Linear:
    head = torch.nn.Linear(hidden, 1, dtype=dtype)
    torch.nn.init.zeros_(head.weight)
    torch.nn.init.zeros_(head.bias)
    return head


def _is_sequence_classifier(path: str) -> bool:
    from transformers import AutoConfig

    architectures = AutoConfig.from_pretrained(path).architectures or []
    return any(a.endswith("ForSequenceClassification") for a in architectures)
