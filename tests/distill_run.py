"""`python -m agentrl.train` with every learner batch saved after its step (tests/test_distill.py): the
batch's teacher log-probs and advantages, as the learner used them, in TRAIN.OUT_DIR/batches/NNNN.pt."""

from __future__ import annotations

import sys
from pathlib import Path

import torch

FIELDS = ("input_ids", "attention_mask", "loss_mask", "behav_logprobs", "advantages", "teacher_logprobs", "rewards")


def main() -> int:
    from agentrl import train
    from agentrl.learner.rl import Learner

    out = Path(next(a.split("=", 1)[1] for a in sys.argv[1:] if a.startswith("train.out_dir="))) / "batches"
    step = Learner.step

    def saving_step(self, batch):
        results = step(self, batch)
        out.mkdir(parents=True, exist_ok=True)
        torch.save({k: getattr(batch, k) for k in FIELDS}, out / f"{self.batches_seen:04d}.pt")
        return results

    Learner.step = saving_step
    return train.main(sys.argv[1:])


if __name__ == "__main__":
    sys.exit(main())
