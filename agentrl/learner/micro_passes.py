"""The learner's passes over micro-batches (`agentrl.learner.packing`'s plan): log pi under the sampling
distribution, the reference's, the critic's values, each for a micro-batch (padded to its longest row, or
packed) or for the whole batch, this rank's rows computed and the rest gathered. A mixin of `Learner`,
which holds the engines and settings these read."""

from __future__ import annotations

from functools import partial

import torch

from agentrl.learner.packed_forward import packed_logprobs, packed_values
from agentrl.learner.packing import Micro, gather_planned, owned_rows, plan_micro_batches, row_lengths
from agentrl.learner.policy_head import head_logprobs
from agentrl.learner.shared_prefix import scored_logprobs
from agentrl.learner.step_parts import widen
from agentrl.types import TrainBatch


class MicroPasses:
    """Forward passes of `Learner` (engine, reference, teacher, critic, cfg, algo, world, rank, device, temperature,
    top_p, share_min_saved, micro_per_mini, unsup_batches, unsup_drawn are its attributes)."""

    def _forward_logprobs(self, batch: TrainBatch, rows: slice | Micro, engine=None, with_entropy: bool = False,
                          full_vocab: bool = False):
        """(B, T) log pi of each token, 0 before the scored tail; with_entropy: (logprobs, entropy). A group's
        common prompt runs once (`shared_prefix`), the head only where a scored token reads it (`logit_tail`);
        a packed micro-batch runs as one row (`packed_forward`). B: the rows, T: the batch's width.
        full_vocab: at temperature 1 over the full vocabulary (the teacher), not the sampling distribution."""
        entropy_grad = torch.is_grad_enabled() and self.algo.entropy_coef > 0
        temperature, top_p = (1.0, 1.0) if full_vocab else (self.temperature, self.top_p)
        head = partial(head_logprobs, temperature=temperature, top_p=top_p, with_entropy=with_entropy,
                       entropy_grad=entropy_grad)
        index, width = (rows.rows, rows.width) if isinstance(rows, Micro) else (rows, batch.input_ids.shape[1])
        ids, attn, scored = (t[index, :width].to(self.device)
                             for t in (batch.input_ids, batch.attention_mask, batch.loss_mask))
        if isinstance(rows, Micro) and rows.packed:
            logp, entropy = packed_logprobs(engine or self.engine, ids, attn.sum(1), scored, head)
        else:
            logp, entropy = scored_logprobs(engine or self.engine, ids, attn, scored, batch.group_ids[index], head,
                                            self.share_min_saved)
        T = batch.input_ids.shape[1]
        return (widen(logp, T), None if entropy is None else widen(entropy, T)) if with_entropy else widen(logp, T)

    def _forward_values(self, batch: TrainBatch, rows: slice | Micro) -> torch.Tensor:
        """(B, T) V(s_t): the value of the state before token t, read at position t - 1 (0 at t = 0). A packed
        micro-batch runs as one row (`packed_forward.packed_values`)."""
        index, width = (rows.rows, rows.width) if isinstance(rows, Micro) else (rows, batch.input_ids.shape[1])
        ids, attn = (t[index, :width].to(self.device) for t in (batch.input_ids, batch.attention_mask))
        if isinstance(rows, Micro) and rows.packed:
            values = packed_values(self.critic, ids, attn.sum(1))
        else:
            values = self.critic(input_ids=ids, attention_mask=attn)
        return widen(torch.cat([torch.zeros_like(values[:, :1]), values[:, :-1]], dim=1).float(), batch.input_ids.shape[1])

    def _unsup_loss(self) -> torch.Tensor:
        """Next-token cross-entropy on the next batch of unsupervised text (DeepSpeed-Chat's ptx loss)."""
        ids, attn = (t.to(self.device) for t in next(self.unsup_batches))
        self.unsup_drawn += 1
        logits = self.engine(input_ids=ids, attention_mask=attn).logits[:, :-1].float()
        target = ids[:, 1:].masked_fill(attn[:, 1:] == 0, -100)
        return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), target.reshape(-1))

    def _plan(self, batch: TrainBatch, rows: range, train: bool) -> list[list[Micro]]:
        """[rank][k] micro-batches of `rows` (`packing.plan_micro_batches`): training takes `micro_per_mini`
        row-count slices (or the token plan); a no-grad pass, micro_batch_size rows each (or the token plan).
        Every engine (actor, reference, teacher, critic) runs the same plan, packed with learner.pack_sequences."""
        return plan_micro_batches(row_lengths(batch.attention_mask), rows, self.world, self.cfg.micro_batch_size,
                                  self.cfg.micro_batch_tokens, self.cfg.pack_sequences,
                                  self.micro_per_mini if train else None)

    def _empty_forward(self, engine) -> torch.Tensor:
        """0 from a 1-token forward of `engine`: a rank with no rows in a micro-step still joins its collectives
        (ZeRO-3 gathers the parameters in every forward; other ranks run rows in this one)."""
        out = engine(input_ids=torch.zeros(1, 1, dtype=torch.long, device=self.device))
        return getattr(out, "logits", out).sum() * 0.0

    @torch.no_grad()
    def _over_micro_batches(self, batch: TrainBatch, fn, engine, rows: range | None = None) -> torch.Tensor:
        """(B, T) values of `fn` for the whole batch (or its `rows`, 0 elsewhere): this rank's rows in
        micro-batches, the rest gathered."""
        plan = self._plan(batch, range(batch.size) if rows is None else rows, train=False)
        outs = []
        for micro in plan[self.rank]:
            if micro.empty:
                self._empty_forward(engine)
            else:
                outs.append(fn(batch, micro).float())
        own = torch.cat(outs) if outs else torch.zeros(0, batch.input_ids.shape[1], device=self.device)
        return gather_planned(own, owned_rows(plan), batch.size, self.rank).cpu() * batch.loss_mask

    def logprobs(self, batch: TrainBatch, rows: range | None = None) -> torch.Tensor:
        """(B, T) log pi_theta for the current weights, computed in micro-batches (on `rows` only, if given)."""
        self.engine.eval()
        return self._over_micro_batches(batch, self._forward_logprobs, self.engine, rows)

    def reference_logprobs(self, batch: TrainBatch) -> torch.Tensor:
        return self._over_micro_batches(batch, lambda b, rows: self._forward_logprobs(b, rows, self.reference),
                                        self.reference)

    def teacher_logprobs(self, batch: TrainBatch) -> torch.Tensor:
        """(B, T) log pi_teacher at temperature 1 over its full vocabulary (`agentrl.algo.distill`): the numbers
        vLLM's prompt log-probs give on an engine of its own (placement engine)."""
        return self._over_micro_batches(batch, lambda b, rows: self._forward_logprobs(b, rows, self.teacher,
                                                                                      full_vocab=True), self.teacher)

    def values(self, batch: TrainBatch) -> torch.Tensor:
        self.critic.eval()
        return self._over_micro_batches(batch, self._forward_values, self.critic)
