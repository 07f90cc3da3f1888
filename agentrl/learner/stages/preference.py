"""DPO and KTO: the policy against a frozen reference, which is the starting model.

The reference's sequence log-probabilities are computed once, before the first step, with the
starting weights (TRL's `precompute_ref_log_probs`): no second model is kept in memory, and under
LoRA the starting model is the base with zero adapters, so nothing needs switching off. The losses are
`agentrl.algo.preference` functions of (policy, reference) log-probs of chosen and rejected rows.

With packing a micro-batch is still `micro_batch_size` samples (KTO's batch estimate of z is the mean
over the micro-batch): only its sequences, DPO's chosen and rejected alike, share rows of `max_len`
tokens, for the policy and for the reference log-probs both.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from agentrl.algo.preference import PREFERENCE_LOSSES
from agentrl.config.stages import StageOptimConfig
from agentrl.learner.stage import LossOut, chunks
from agentrl.learner.stages.common import save_module, sequence_logprobs


@dataclass(frozen=True)
class WithReference:
    sample: Any  # PairSample (DPO) or LabeledSample (KTO)
    ref: tuple[float, ...]  # reference log-probs of its sequences (chosen, rejected) or (sequence,)


def _sequences(sample) -> list:
    return [sample.chosen, sample.rejected] if hasattr(sample, "chosen") else [sample.sample]


class _PolicyVsReference:
    def __init__(self, pad_id: int, settings: dict[str, Any], zero3: bool = False, *, packing: bool = False,
                 max_len: int = 2048) -> None:
        self.pad_id, self.settings, self.zero3 = pad_id, settings, zero3
        self.pack_len = max_len if packing else None  # rows of this many tokens, or one sequence a row

    def logprobs(self, engine, seqs: list) -> torch.Tensor:
        return sequence_logprobs(engine, seqs, self.pad_id, self.pack_len)

    def load_model(self, path: str, optim: StageOptimConfig) -> torch.nn.Module:
        from agentrl.learner.models import load_causal_lm

        return load_causal_lm(path, optim)

    @torch.no_grad()
    def prepare(self, engine, samples: list, micro_batch_size: int) -> list:
        engine.eval()
        out = []
        for micro in chunks(samples, micro_batch_size):
            seqs = [s for x in micro for s in _sequences(x)]
            logps = self.logprobs(engine, seqs).tolist()
            per = len(seqs) // len(micro)
            out += [WithReference(x, tuple(logps[i * per:(i + 1) * per])) for i, x in enumerate(micro)]
        engine.train()
        return out

    def units(self, sample) -> float:
        return 1.0

    def micro_batches(self, samples: list, micro_batch_size: int) -> list[list]:
        return chunks(samples, micro_batch_size)

    def save(self, module: torch.nn.Module, out_dir: Path, tokenizer) -> None:
        save_module(module, out_dir, tokenizer, self.zero3)


class DPOKind(_PolicyVsReference):
    """`settings`: beta, label_smoothing, nll_coef and `loss` (dpo's "sigmoid" -> dpo, or "ipo")."""

    name = "dpo"

    def loss(self, engine, micro: list[WithReference]) -> LossOut:
        chosen = [x.sample.chosen for x in micro]
        rejected = [x.sample.rejected for x in micro]
        logp = self.logprobs(engine, chosen + rejected)
        pc, pr = logp[:len(micro)], logp[len(micro):]
        rc = torch.tensor([x.ref[0] for x in micro], device=logp.device)
        rr = torch.tensor([x.ref[1] for x in micro], device=logp.device)
        s = self.settings
        fn = PREFERENCE_LOSSES["ipo" if s["loss"] == "ipo" else "dpo"]
        out = fn(pc, pr, rc, rr, beta=s["beta"], label_smoothing=s["label_smoothing"])
        loss_sum = out.losses.sum()
        if s["nll_coef"]:  # RPO: the chosen responses' mean token NLL
            n_tok = torch.tensor([max(sum(c.mask[1:]), 1) for c in chosen], device=logp.device)
            loss_sum = loss_sum + s["nll_coef"] * (-pc / n_tok).sum()
        margin = out.chosen_rewards - out.rejected_rewards
        return LossOut(loss_sum, float(len(micro)),
                       {"reward_accuracy": float((margin > 0).sum()), "reward_margin": float(margin.sum()),
                        "chosen_reward": float(out.chosen_rewards.sum()),
                        "rejected_reward": float(out.rejected_rewards.sum())}, len(micro))


class KTOKind(_PolicyVsReference):
    """`settings`: beta, desirable_weight, undesirable_weight."""

    name = "kto"

    def loss(self, engine, micro: list[WithReference]) -> LossOut:
        logp = self.logprobs(engine, [x.sample.sample for x in micro])
        ref = torch.tensor([x.ref[0] for x in micro], device=logp.device)
        good = torch.tensor([x.sample.desirable for x in micro], dtype=torch.bool, device=logp.device)
        out = PREFERENCE_LOSSES["kto"](logp[good], logp[~good], ref[good], ref[~good], **self.settings)
        # A row's implicit reward has the right sign when desirable rows gain and undesirable ones lose.
        right = (out.chosen_rewards > 0).sum() + (out.rejected_rewards < 0).sum()
        return LossOut(out.losses.sum(), float(len(micro)),
                       {"reward_accuracy": float(right), "desirable_frac": float(good.sum())}, len(micro))
