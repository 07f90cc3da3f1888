"""The learner's side of on-policy distillation (algo.teacher): the frozen teacher beside the reference
(placement learner), and the distillation advantage written into the batch (`agentrl.algo.distill`).
With placement engine the teacher's log-probs arrive on the batch from the episodes
(`TrainBatch.teacher_logprobs`, scored by `agentrl.rollout.teacher`) and only the advantage is made here."""

from __future__ import annotations

from agentrl.algo import combine_advantages, distill_advantages, distill_metrics
from agentrl.config import TeacherConfig
from agentrl.learner.models import frozen_causal_lm
from agentrl.learner.spec import LearnerSpec
from agentrl.types import TrainBatch


def build_teacher(spec: LearnerSpec):
    """A frozen eval-only engine of the teacher (placement learner), placed like the reference (ZeRO-3 with
    the actor, or offloaded with learner.reference_offload); None without one or on an engine of its own."""
    teacher = spec.algo.teacher
    if teacher is None or teacher.placement != "learner":
        return None
    return frozen_causal_lm(spec.teacher_path, spec.learner)


def distill_into(batch: TrainBatch, teacher: TeacherConfig) -> dict[str, float]:
    """Replace batch.advantages (the env's, from `algo.advantage`) with A_distill [+ env_weight * A_env]
    from the behaviour log-probs mu and batch.teacher_logprobs; returns the reverse-KL metrics."""
    if batch.teacher_logprobs is None:
        raise RuntimeError(f"algo.teacher (placement {teacher.placement}): the batch has no teacher log-probs; "
                           "with placement engine every episode must be scored by the teacher engine")
    mask = batch.loss_mask
    distill = distill_advantages(batch.behav_logprobs, batch.teacher_logprobs, mask, teacher.coef)
    batch.advantages = combine_advantages(distill, batch.advantages, teacher.env_scale).float()
    return distill_metrics(batch.behav_logprobs, batch.teacher_logprobs, mask)
