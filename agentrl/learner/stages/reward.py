"""The reward model (Bradley-Terry on chosen/rejected pairs) and the process reward model (step labels
read from the reward tokens' logits at each step's end).

The reward model is a one-output `AutoModelForSequenceClassification` (its body from the starting
causal LM, a new linear `score` head) read at each sequence's last token, as
`rewards.reward_model.RewardModelScorer` reads it, so the saved folder is what the scorer loads.
The PRM stays a causal LM: OpenRLHF's scheme, where a step's score is the softmax over the reward
tokens ("+", "-") of the logits at the step's end (`rewards.prm.PRMScorer` scores episodes that way).

With packing a micro-batch is still `micro_batch_size` samples (pairs, or PRM sequences) whose sequences
share rows of `max_len` tokens; each score is read at its own sequence's position in its row. The
classifier's own forward is never called: its pooling takes each row's last non-pad token, one score a
row, which a packed row would get wrong; the body runs with the rows' position ids and `score` reads the
hidden state at each sequence's last token: `agentrl.utils.classifier.head_scores`, the read
`rewards.reward_model.last_token_scores` makes on right-padded rows.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import torch

from agentrl.utils.classifier import head_scores
from agentrl.algo.preference import bradley_terry, prm_token_loss
from agentrl.config.stages import StageOptimConfig
from agentrl.data.samples import PairSample, Sample
from agentrl.learner.stage import LossOut, chunks
from agentrl.learner.stages.common import save_module, sequence_rows


class RewardKind:
    """Conversations are tokenised as the rollout ledger does (ending at the last turn's EOS), while the
    scorer tokenises the template's whole rendering, which goes on past that EOS (ChatML: "\\n"). So
    `prepare` appends those tokens to every sequence that ends with EOS: the score is read at the same
    token in training and in `RewardModelScorer`."""

    name = "rm"

    def __init__(self, pad_id: int, eos_id: int, after_eos: list[int], zero3: bool = False, *,
                 packing: bool = False, max_len: int = 2048) -> None:
        """`after_eos`: the tokens a chat template writes after a turn's EOS (ChatML: "\\n")."""
        self.pad_id, self.eos_id, self.after_eos, self.zero3 = pad_id, eos_id, after_eos, zero3
        self.pack_len = max_len if packing else None  # rows of this many tokens, or one sequence a row

    def _as_scored(self, sample: Sample) -> Sample:
        if not self.after_eos or sample.tokens[-1] != self.eos_id:
            return sample
        return replace(sample, tokens=sample.tokens + self.after_eos, mask=sample.mask + [0] * len(self.after_eos))

    def load_model(self, path: str, optim: StageOptimConfig) -> torch.nn.Module:
        from transformers import AutoModelForSequenceClassification

        from agentrl.learner.models import prepare_trainable

        model = AutoModelForSequenceClassification.from_pretrained(
            path, num_labels=1, pad_token_id=self.pad_id, dtype=torch.float32, local_files_only=True)
        return prepare_trainable(model, optim)

    def prepare(self, engine, samples: list, micro_batch_size: int) -> list:
        return [PairSample(self._as_scored(p.chosen), self._as_scored(p.rejected)) for p in samples]

    def units(self, sample) -> float:
        return 1.0

    def micro_batches(self, samples: list, micro_batch_size: int) -> list[list]:
        return chunks(samples, micro_batch_size)

    def scores(self, engine, micro: list) -> tuple[torch.Tensor, torch.Tensor]:
        rows = sequence_rows([p.chosen.tokens for p in micro] + [p.rejected.tokens for p in micro], self.pad_id,
                             self.pack_len)
        module = engine.module
        # Under LoRA the peft wrapper's base model has the adapters injected in place: the pooling below
        # needs the classifier's own `score` and body attributes.
        model = module.get_base_model() if hasattr(module, "get_base_model") else module
        device = model.device
        r = head_scores(model, rows.inputs(device), rows.at([[n - 1] for _, _, n in rows.spans], device))
        return r[:len(micro)], r[len(micro):]

    def loss(self, engine, micro: list) -> LossOut:
        r_c, r_r = self.scores(engine, micro)
        losses = bradley_terry(r_c, r_r)
        d = (r_c - r_r).detach()
        return LossOut(losses.sum(), float(len(micro)),
                       {"accuracy": float((d > 0).sum()), "margin": float(d.sum()),
                        "chosen_score": float(r_c.detach().sum()), "rejected_score": float(r_r.detach().sum())},
                       len(micro))

    def save(self, module: torch.nn.Module, out_dir: Path, tokenizer) -> None:
        save_module(module, out_dir, tokenizer, self.zero3)


class PRMKind:
    name = "prm"

    def __init__(self, pad_id: int, reward_ids: list[int], zero3: bool = False, *, packing: bool = False,
                 max_len: int = 2048) -> None:
        self.pad_id, self.reward_ids, self.zero3 = pad_id, reward_ids, zero3
        self.pack_len = max_len if packing else None  # rows of this many tokens, or one sequence a row

    def load_model(self, path: str, optim: StageOptimConfig) -> torch.nn.Module:
        from agentrl.learner.models import load_causal_lm

        return load_causal_lm(path, optim)

    def prepare(self, engine, samples: list, micro_batch_size: int) -> list:
        return samples

    def units(self, sample) -> float:
        return float(len(sample.positions))

    def micro_batches(self, samples: list, micro_batch_size: int) -> list[list]:
        return chunks(samples, micro_batch_size)

    def step_logits(self, engine, micro: list) -> torch.Tensor:
        """(N, R) logits of the reward tokens at every step of the micro-batch, in order."""
        rows = sequence_rows([s.tokens for s in micro], self.pad_id, self.pack_len)
        device = engine.device
        logits = engine(**rows.inputs(device)).logits
        return logits[rows.at([s.positions for s in micro], device)][:, self.reward_ids].float()

    def loss(self, engine, micro: list) -> LossOut:
        logits_NR = self.step_logits(engine, micro)
        labels_N = torch.tensor([lab for s in micro for lab in s.labels], dtype=torch.long, device=logits_NR.device)
        losses = prm_token_loss(logits_NR, labels_N)
        right = (logits_NR.detach().argmax(-1) == labels_N).sum()
        return LossOut(losses.sum(), float(len(labels_N)), {"step_accuracy": float(right)}, len(labels_N))

    def save(self, module: torch.nn.Module, out_dir: Path, tokenizer) -> None:
        save_module(module, out_dir, tokenizer, self.zero3)
