"""The RL learner: wires the DeepSpeed engines (actor, reference, critic, EMA; built in
`agentrl.learner.models`) to the RL math of `agentrl.algo`, whose registries config picks. No RL math here.

Runs as one rank, or as one of K data-parallel ranks (`agentrl.learner.ray_ranks`): every rank gets
the whole batch, computes the no-grad passes (pi_prox, reference, values) on its block of rows and
all-gathers them, so advantages are computed on the whole batch, identically on every rank; then each
rank trains on its equal share of every mini-batch, its loss weighted by its share of the mini-batch's
tokens, so the averaged gradient equals one rank's on the whole batch. gloo on CPU, nccl on CUDA.
`step` is synchronous and is called from a worker thread so the event loop keeps generating.
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass
from typing import Iterator

import torch

from agentrl.utils import faults, registry
from agentrl.algo import (ADVANTAGES, POLICY_LOSSES, AdvantageInputs, PolicyLossInputs, RunningMoments,
                          aggregate, clip_rewards, kl_estimate, kl_penalized_token_rewards,
                          masked_mean, sequence_kl, staleness_buckets, value_loss)
from agentrl.learner.dist import init_single_process_dist
from agentrl.learner.micro_passes import MicroPasses
from agentrl.learner.packing import Micro, gather_planned, owned_rows, padding_ratio, row_lengths
from agentrl.learner.shared_prefix import MIN_SAVED
from agentrl.learner.spec import LearnerSpec
from agentrl.learner.teacher import build_teacher, distill_into
from agentrl.learner.models import (ModelEMA, disable_dropout, load_causal_lm, load_value_model,
                                    trained_engine)
from agentrl.learner.step_bound import bound_step, trainable_copy
from agentrl.learner.token_record import TokenRecord
from agentrl.learner.step_parts import accumulate, kl_controller, kl_gate, local_grad_norm, weighted, zero_loss
from agentrl.learner.weights_out import full_state_dict_cpu, save_hf_folder
from agentrl.types import TrainBatch

log = logging.getLogger(__name__)


@dataclass
class StepMetrics:
    loss: float
    grad_norm: float
    step_time_s: float
    n_episodes: int
    n_tokens: int
    policy: dict[str, float]
    share: float = 1.0  # this rank's part of the step's tokens (or rows): how rank metrics are merged
    critic_loss: float | None = None  # "policy/critic/loss": like `loss`, this rank's part of the step's sum
    # (B, T) per token, for the run viewer (rollouts.jsonl), on a step's first StepMetrics: "advantages",
    # "learner_logprobs", "trust_kept" and "cause" (why each token was or was not trained): see token_record.py
    token_values: dict[str, torch.Tensor] | None = None


class Learner(MicroPasses):
    """The actor engine, plus the frozen reference (a KL term: algo.kl), the critic (advantage 'gae'), an EMA
    of the actor (ema_decay > 0) and the unsupervised LM loss (unsup_coef > 0), as configured."""

    def __init__(self, spec: LearnerSpec,
                 unsup_batches: Iterator[tuple[torch.Tensor, torch.Tensor]] | None = None) -> None:
        """`spec`: the settings (`LearnerSpec.from_config`). `unsup_batches`: (input_ids, attention_mask)
        batches of text for the LM loss (`agentrl.data.lm_batches`).
        Every policy logprob here (pi_theta, pi_prox, the reference) and the entropy are taken under the
        distribution vLLM samples from (spec.temperature, spec.top_p), temperature-scaled and truncated
        to the top-p nucleus and renormalised (`agentrl.algo.logprobs`): mu is that distribution, so
        r = pi_theta / pi_prox and w = pi_prox / mu compare like with like. The reference uses it too, so
        the KL compares the policy as sampled with the reference as it would be sampled: 0 before any
        update (over the full vocabulary it would start at -log(nucleus mass) per token and push towards
        a sharper policy); a token outside the reference's nucleus is scored as if the reference gave it
        probability e^LOGPROB_FLOOR."""
        cfg, algo = spec.learner, spec.algo
        torch.set_num_threads(cfg.num_threads)
        init_single_process_dist()
        self.rank, self.world = torch.distributed.get_rank(), torch.distributed.get_world_size()
        if cfg.unsup_coef > 0 and unsup_batches is None:
            raise ValueError("learner.unsup_coef > 0 needs unsup_batches (learner.unsup_data)")
        self.spec, self.cfg, self.algo = spec, cfg, algo
        self.temperature, self.top_p = spec.temperature, spec.top_p  # a test may narrow top_p after building
        bf16 = cfg.dtype == "bfloat16"
        rows_per_mini = math.ceil(spec.batch_size / cfg.mini_batches / self.world)  # this rank's share
        self.micro_per_mini = math.ceil(rows_per_mini / cfg.micro_batch_size)
        optimizer_steps = max(spec.total_steps, 1) * cfg.mini_batches
        model_path = self.model_path = spec.model_path
        # No dropout in any RL pass: pi_prox (no grad), pi_theta (train mode) and the reference must be
        # the same function of the weights, or r = pi_theta / pi_prox != 1 at unchanged weights.
        self.engine = trained_engine(disable_dropout(load_causal_lm(model_path, cfg)), cfg, cfg.micro_batch_size,
                                     self.micro_per_mini, bf16, optimizer_steps)
        self.device = self.engine.device
        self.reference = None
        if algo.has_kl:
            from agentrl.learner.models import frozen_causal_lm

            self.reference = frozen_causal_lm(model_path, cfg)
        self.teacher = build_teacher(spec)  # algo.teacher on the learner: frozen, scored at temperature 1
        self.critic = None
        if algo.advantage.type == "gae":  # the spec holds a critic and its folder with gae
            critic = self.critic_cfg = spec.critic
            self.critic = trained_engine(disable_dropout(load_value_model(spec.critic_path, critic)), critic,
                                         cfg.micro_batch_size, self.micro_per_mini, bf16, optimizer_steps)
        self.ema = ModelEMA(self.engine.module, cfg.ema_decay, zero3=cfg.zero_stage == 3) if cfg.ema_decay else None
        self.unsup_batches = unsup_batches
        self.kl_ctl = kl_controller(algo)
        self.reward_moments = RunningMoments()
        self.loss_fn = registry.lookup(POLICY_LOSSES, algo.policy_loss, "algo.policy_loss")
        self.estimator = registry.lookup(ADVANTAGES, algo.advantage.type, "algo.advantage.type")
        self.version = 0  # actor optimizer steps (also counted while the actor is frozen: pushes stay ordered)
        self.batches_seen = 0
        self.unsup_drawn = 0  # batches taken from unsup_batches (a resumed run skips as many)
        self.share_min_saved = MIN_SAVED  # a group runs its prompt once when that saves this many multiply-adds
        self.n_micro = self.micro_per_mini  # micro-batches of the optimizer step under way (the token plan's count)
        if cfg.pack_sequences:
            log.info("learner.pack_sequences: micro-batches run packed, without padding (actor, reference, teacher "
                     "and critic); a group's shared prompt runs once per row (shared-prefix passes are off)")

    # -- advantages -------------------------------------------------------------------------------

    def advantages(self, batch: TrainBatch, old_logp: torch.Tensor, ref_logp: torch.Tensor | None,
                   values: torch.Tensor | None) -> dict[str, float]:
        """Fill batch.advantages (and batch.returns for the critic): rewards clipped, normalised, KL-
        penalised as configured, then the configured estimator. Returns reward/KL metrics."""
        algo, mask = self.algo, batch.loss_mask
        rewards = clip_rewards(batch.rewards, algo.reward_clip)
        if algo.reward_norm:
            self.reward_moments.update(rewards)
            rewards = self.reward_moments.normalize(rewards).float()
        token_rewards, metrics = None, {"reward_shaped_mean": float(rewards.mean())}
        if ref_logp is not None:
            # k1 on tokens sampled from mu estimates KL(mu || ref): InstructGPT's pi_RL is the sampler.
            logp = batch.behav_logprobs if algo.kl.type == "reward" else old_logp
            metrics.update(self._reference_kl(logp, ref_logp, mask))
            if algo.kl.type == "reward":
                token_rewards, _ = kl_penalized_token_rewards(rewards, logp, ref_logp, mask, metrics["kl_coef"])
                if algo.advantage.type != "gae":  # scalar estimators see the episode's total shaped reward
                    rewards = token_rewards.sum(-1)
        est = algo.advantage
        gae_kw = dict(gamma=est.gamma, lam=est.lam, whiten=est.whiten) if est.type == "gae" else {}  # gae's own
        out = self.estimator(AdvantageInputs(rewards, batch.group_ids, mask, values, token_rewards,
                                             input_ids_BT=batch.input_ids, **gae_kw))
        batch.advantages, batch.returns = out.advantages_BT.float(), out.returns_BT
        if algo.teacher is not None:  # on-policy distillation: the teacher's per-token advantage (learner/teacher.py)
            metrics.update(distill_into(batch, algo.teacher))
        return metrics

    def _reference_kl(self, logp: torch.Tensor, ref_logp: torch.Tensor, mask: torch.Tensor) -> dict[str, float]:
        """KL(pi || reference) per sequence (pi: mu or pi_prox) and the weight it met; the controller takes it."""
        metrics = {"kl_seq_k1": sequence_kl(logp, ref_logp, mask), "kl_coef": self.kl_ctl.value}
        self.kl_ctl.update(metrics["kl_seq_k1"], len(mask))
        return metrics

    # -- training ---------------------------------------------------------------------------------

    def _actor_micro_step(self, batch: TrainBatch, micro: Micro, old_logp: torch.Tensor,
                          ref_logp: torch.Tensor | None, weight: float, reuse: bool, taken: torch.Tensor):
        """(loss to backward, its value, metrics). taken: (2, B, T) where this pass's log pi and entropy go
        (`_pass_metrics`); reuse: pi_prox is this pass's own logp (`reuses_prox`), written into old_logp."""
        logp, entropy = self._forward_logprobs(batch, micro, with_entropy=True)
        rows = micro.rows
        mask = batch.loss_mask[rows].to(self.device)
        taken[0, rows], taken[1, rows] = ((t.detach().float() * mask).cpu() for t in (logp, entropy))
        if reuse:
            old_logp[rows] = taken[0, rows]
        inputs = PolicyLossInputs(
            logp_BT=logp * mask, old_logp_BT=old_logp[rows].to(self.device),
            behav_logp_BT=batch.behav_logprobs[rows].to(self.device),
            advantages_BT=batch.advantages[rows].to(self.device), mask_BT=mask, entropy_BT=entropy,
            age_BT=(self.version - batch.versions[rows]).to(self.device))  # versions behind (trust_region.half_life)
        loss, metrics = self.loss_fn(inputs, self.algo).loss, {}  # its metrics: over the whole step (`_pass_metrics`)
        if ref_logp is not None and self.algo.kl.type == "loss":
            kl_BT = kl_estimate(inputs.logp_BT, ref_logp[rows].to(self.device) * mask, self.algo.kl.estimator)
            loss = loss + self.kl_ctl.value * aggregate(kl_BT, mask, self.algo.agg)
        # Weighted by the micro-batch's share of the mini-batch's tokens (or rows) over all ranks
        # (`step_parts.accumulate`); DeepSpeed averages gradients over ranks, which `world` undoes.
        loss = loss * weight
        if self.cfg.unsup_coef > 0:
            lm_loss = self._unsup_loss()
            loss = loss + self.cfg.unsup_coef * lm_loss / (self.n_micro * self.world)
            metrics = {**metrics, "unsup_loss": float(lm_loss.detach())}
        return loss * self.world, loss.item(), metrics

    @torch.no_grad()
    def _pass_metrics(self, batch: TrainBatch, rows: range, taken: torch.Tensor, old_logp: torch.Tensor,
                      ref_logp: torch.Tensor | None, reuse: bool, record: TokenRecord | None = None) -> dict[str, float]:
        """The policy loss's metrics over the whole mini-batch, from the training pass's log pi and entropy
        (`taken`), gathered from every rank: a micro-batch's is_ess or sequence-level means do not average
        into the whole's, so metrics do not depend on how rows were grouped or spread over ranks. Reused,
        pi_prox is gathered into old_logp too. `record`, if given, receives the policy loss's decisions per token
        over these rows (the trust region's keep-mask `trust_masked_frac` counts, and each token's cause)."""
        if self.world > 1:
            owned = owned_rows(self._plan(batch, rows, train=True))
            for t in (taken[0], taken[1], *([old_logp] if reuse else [])):
                t[rows.start:rows.stop] = gather_planned(t[owned[self.rank]].to(self.device), owned, batch.size,
                                                         self.rank).cpu()[rows.start:rows.stop]
        sl, mask = slice(rows.start, rows.stop), batch.loss_mask[rows.start:rows.stop]
        inputs = PolicyLossInputs(logp_BT=taken[0, sl], old_logp_BT=old_logp[sl], behav_logp_BT=batch.behav_logprobs[sl],
                                  advantages_BT=batch.advantages[sl], mask_BT=mask, entropy_BT=taken[1, sl],
                                  age_BT=self.version - batch.versions[sl])
        out = self.loss_fn(inputs, self.algo)
        metrics = out.metrics
        if record is not None:
            record.decided(sl, out, mask)
        if ref_logp is not None and self.algo.kl.type == "loss":
            kl_BT = kl_estimate(taken[0, sl], ref_logp[sl] * mask, self.algo.kl.estimator)
            metrics["kl_ref"] = float(masked_mean(kl_BT, mask))
        return metrics

    def _critic_micro_step(self, batch: TrainBatch, micro: Micro, old_values: torch.Tensor, weight: float):
        values, rows = self._forward_values(batch, micro), micro.rows
        mask = batch.loss_mask[rows].to(self.device)
        clip = self.algo.advantage.value_clip or None  # the critic exists only with gae
        loss, metrics = value_loss(values * mask, old_values[rows].to(self.device), batch.returns[rows].to(self.device),
                                   mask, clip=clip, agg="token_mean")
        return (loss * (weight * self.world), loss.item() * weight,
                {**metrics, "value_mean": float(masked_mean(values.detach(), mask))})

    def _loss_units(self, engine, mask_NT: torch.Tensor) -> float:
        """What a micro-batch's loss averages over, so that weighting each by its share of the step's units
        gives the whole step's loss exactly: tokens (token_mean, the critic), rows with a scored token
        (seq_mean_*: `aggregate` leaves empty rows out), or rows (constant: divides by B)."""
        if self.algo.agg == "token_mean" or engine is self.critic:
            return float(mask_NT.sum())
        return float(len(mask_NT)) if self.algo.agg == "constant" else float(mask_NT.sum(-1).gt(0).sum())

    def _train_engine(self, engine, zero_stage: int, batch: TrainBatch, rows: range, micro_step) -> tuple[float, float, list]:
        """One optimizer step of `engine` over `rows`: the same count of micro-batches on every rank (an empty
        one backs up a zero loss: ZeRO's collectives need every rank's pass). Metrics weigh by scored tokens."""
        total = self._loss_units(engine, batch.loss_mask[rows.start:rows.stop])
        loss_sum, metric_rows, grad_norm = 0.0, [], float("nan")
        slices = self._plan(batch, rows, train=True)[self.rank]
        self.n_micro = len(slices)

        def micro_loss(k: int) -> torch.Tensor:
            nonlocal loss_sum
            micro = slices[k]
            n = self._loss_units(engine, batch.loss_mask[micro.rows])
            if micro.empty or n == 0:
                return self._empty_forward(engine) if self.world > 1 else zero_loss(engine.module)
            loss, loss_val, metrics = micro_step(micro, n / max(total, 1.0))
            loss_sum += loss_val
            metric_rows.append((float(batch.loss_mask[micro.rows].sum()), metrics))
            return loss

        def after_backward(k: int) -> None:
            nonlocal grad_norm
            faults.reached("learner_step")  # gradients taken, weights not yet updated
            if k == len(slices) - 1 and zero_stage == 0:
                grad_norm = local_grad_norm(engine.module)  # DeepSpeed records it only for ZeRO >= 1

        accumulate(engine, len(slices), micro_loss, after_backward)
        if zero_stage > 0:
            grad_norm = float(engine.get_global_grad_norm() or float("nan"))
        return loss_sum, grad_norm, metric_rows

    @property
    def reuses_prox(self) -> bool:
        """Whether pi_prox comes from the training pass, not a no-grad pass of its own (AReaL's reuse_train_logp):
        at one optimizer step a batch both see the same weights without dropout, so they are equal. A reward-mode
        KL reads mu, not pi_prox (`advantages`); a KL loss term's metric reads pi_prox after the training pass,
        unless an adaptive weight, which that KL moves, needs it before."""
        kl, one_step = self.algo.kl, self.algo.mode == "decoupled" and self.cfg.mini_batches == 1
        fixed_loss_term = kl.type == "loss" and kl.controller.type == "fixed"
        return one_step and (self.reference is None or kl.type == "reward" or fixed_loss_term)

    def step(self, batch: TrainBatch) -> list[StepMetrics]:
        """Train on one batch: recompute pi_prox (decoupled), reference logprobs and values as needed,
        compute advantages unless the batch has them, then `mini_batches` optimizer steps of the actor
        (skipped during `freeze_actor_steps`, and once past `target_kl`) and of the critic. One StepMetrics a step."""
        actor_trains = self.batches_seen >= self.cfg.freeze_actor_steps
        reuse = self.reuses_prox and actor_trains
        old_logp = (torch.zeros_like(batch.behav_logprobs) if reuse else
                    self.logprobs(batch) if self.algo.mode == "decoupled" else batch.behav_logprobs)
        ref_logp = self.reference_logprobs(batch) if self.reference is not None else None
        if self.teacher is not None:
            batch.teacher_logprobs = self.teacher_logprobs(batch)
        old_values = self.values(batch) if self.critic is not None else None
        shaped, kl_after = {}, reuse and ref_logp is not None and self.algo.kl.type == "loss"  # waits for pi_prox
        if batch.advantages is None:
            shaped = self.advantages(batch, old_logp, None if kl_after else ref_logp, old_values)
        self.batches_seen += 1
        results, buckets = [], {}
        token_record = TokenRecord(batch)  # the viewer's per-token values (`token_values`)
        per_mini, training, gate = math.ceil(batch.size / self.cfg.mini_batches), actor_trains, {}
        for start in range(0, batch.size, per_mini):
            t0, rows = time.perf_counter(), range(start, min(start + per_mini, batch.size))
            loss, grad_norm, metric_rows, vf_loss, bounded, whole = 0.0, float("nan"), [], None, {}, {}
            lr = self.engine.get_lr()[0]  # the rate this optimizer step uses
            if training and start and self.cfg.target_kl is not None:
                gate, now = kl_gate(self.logprobs, batch, rows, old_logp, self.cfg.target_kl)
                training = not gate["kl_stopped"]
                if not training:
                    token_record.stopped(start)
                if now is not None:  # the rows the actor skips: the viewer's log pi is the weights' now
                    token_record.learner_logp[start:] = now[start:]
            if training:
                self.engine.train()
                taken = torch.zeros(2, *batch.behav_logprobs.shape)
                before = trainable_copy(self.engine.module) if self.cfg.max_step_kl is not None else None
                loss, grad_norm, metric_rows = self._train_engine(
                    self.engine, self.cfg.zero_stage, batch, rows,
                    lambda sl, w: self._actor_micro_step(batch, sl, old_logp, ref_logp, w, reuse, taken))
                whole = self._pass_metrics(batch, rows, taken, old_logp, ref_logp, reuse,
                                           token_record if batch.record_values else None)
                token_record.learner_logp[start:rows.stop] = taken[0, start:rows.stop]  # every rank's rows: gathered above
                if before is not None:  # taken[0]: log pi before the step, on every rank's rows
                    bounded = bound_step(self.engine.module, before, self.logprobs, batch, rows, taken[0],
                                         self.cfg.max_step_kl)
                if self.ema is not None:
                    self.ema.update(self.engine.module)
            extra = {**shaped, **whole, **gate, **bounded, "actor_frozen": float(not actor_trains), "lr": lr,
                     "prox_reused": float(reuse)}
            if self.critic is not None:
                self.critic.train()
                vf_loss, vf_norm, vf_rows = self._train_engine(
                    self.critic, self.critic_cfg.zero_stage, batch, rows,
                    lambda sl, w: self._critic_micro_step(batch, sl, old_values, w))
                extra.update({**{f"critic/{k}": v for k, v in weighted(vf_rows).items()}, "critic/grad_norm": vf_norm})
            self.version += 1
            if start == 0:  # pi_prox before any update (reused: from the first step's pass, gathered)
                buckets = staleness_buckets(old_logp, batch.behav_logprobs, batch.loss_mask,
                                            self.version - 1 - batch.versions, self.algo.correction)
            extra["padding_ratio"] = padding_ratio(self._plan(batch, rows, train=True), row_lengths(batch.attention_mask))
            results.append(StepMetrics(
                loss=loss, grad_norm=grad_norm, step_time_s=time.perf_counter() - t0, n_episodes=len(rows),
                n_tokens=int(batch.loss_mask[start:rows.stop].sum()),
                policy={**weighted(metric_rows), **buckets, **extra}, share=sum(n for n, _ in metric_rows),
                critic_loss=vf_loss))
        if batch.record_values:
            results[0].token_values = token_record.values(batch, actor_trains)
        if kl_after:  # one optimizer step: its pass wrote pi_prox (`_pass_metrics` gathered every rank's rows)
            results[0].policy.update(self._reference_kl(old_logp, ref_logp, batch.loss_mask))
        return results

    # -- checkpoints ------------------------------------------------------------------------------

    def state_dict(self) -> dict:
        """What the learner holds beside its DeepSpeed engines: counters, EMA, KL controller, reward normaliser."""
        return {"version": self.version, "batches_seen": self.batches_seen, "unsup_drawn": self.unsup_drawn,
                "kl_ctl": self.kl_ctl.state_dict(), "reward_moments": self.reward_moments.state_dict(),
                "ema": None if self.ema is None else {"shadow": self.ema.state_dict(),
                                                      "num_updates": self.ema.num_updates}}

    def load_state_dict(self, state: dict) -> None:
        """Restore `state_dict()`'s counters and statistics (extra keys, such as the saved RNG, are ignored)."""
        if (state["ema"] is None) != (self.ema is None):
            raise ValueError(f"the checkpoint {'has no' if state['ema'] is None else 'has an'} EMA, the config "
                             f"asks for {'one' if self.ema is not None else 'none'} (learner.ema_decay)")
        self.version, self.batches_seen = state["version"], state["batches_seen"]
        self.kl_ctl.load_state_dict(state["kl_ctl"])
        self.reward_moments.load_state_dict(state["reward_moments"])
        if self.ema is not None:
            self.ema.load_state_dict(state["ema"]["shadow"])
            self.ema.num_updates = state["ema"]["num_updates"]
        for _ in range(state["unsup_drawn"] - self.unsup_drawn):  # the text stream is deterministic from its seed
            next(self.unsup_batches)
        self.unsup_drawn = state["unsup_drawn"]

    def save_checkpoint(self, folder: str) -> None:
        """Everything a resumed run needs (files: `agentrl.learner.state`); every rank takes part."""
        from agentrl.learner.state import save_engines, save_state

        save_engines({"actor": self.engine, "critic": self.critic}, folder)
        if self.rank == 0:
            save_state(self.state_dict(), folder)

    def load_checkpoint(self, folder: str) -> dict[str, float]:
        """Restore a `save_checkpoint` folder into this learner, built as for a fresh run; returns the
        restored optimizer's digest."""
        from agentrl.learner.state import load_engines, load_state, optimizer_digest, restore_rng

        load_engines({"actor": self.engine, "critic": self.critic}, folder)
        state = load_state(folder)
        try:
            self.load_state_dict(state)
        except ValueError as exc:
            raise ValueError(f"{folder}: {exc}") from None
        restore_rng(state)  # last: nothing after it draws from the RNG before the next step
        return optimizer_digest(self.engine)

    # -- weights out ------------------------------------------------------------------------------

    def state_dict_cpu(self, clone: bool = True) -> dict[str, torch.Tensor]:
        """Full float32 weights on CPU (`weights_out.full_state_dict_cpu`); every rank takes part under ZeRO-3."""
        return full_state_dict_cpu(self.engine.module, self.cfg.zero_stage, self.cfg.lora.rank > 0, clone)

    def save(self, out_dir: str, tokenizer) -> None:
        """The trained policy as a Hugging Face folder: the EMA when enabled, LoRA merged into full weights."""
        if self.ema is not None:
            if self.rank == 0:
                from transformers import AutoModelForCausalLM

                model = AutoModelForCausalLM.from_pretrained(self.model_path, dtype=torch.float32)
                self.ema.save_pretrained(model, out_dir, tokenizer)
            return
        state = self.state_dict_cpu()  # every rank takes part: a ZeRO-3 gather is collective
        if self.rank == 0:
            save_hf_folder(self.model_path, state, out_dir, tokenizer)
