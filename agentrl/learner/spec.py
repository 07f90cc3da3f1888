"""What an RL `Learner` is built from: the config sections it acts on, whole, and the few values it needs
from other sections, read out of the config tree in one place (`LearnerSpec.from_config`)."""

from __future__ import annotations

from dataclasses import dataclass

from agentrl.config import AlgoConfig, Config, CriticConfig, LearnerConfig


@dataclass(frozen=True)
class LearnerSpec:
    """The learner's settings, checked together when built; a Learner takes one (`Learner(spec)`)."""

    model_path: str  # the actor's (and the frozen reference's) Hugging Face folder
    learner: LearnerConfig  # the `learner` section: optimizer, engine, batching, LoRA, EMA, LM loss
    algo: AlgoConfig  # the `algo` section: the RL math, read as it is by the policy loss
    batch_size: int  # episodes a learner batch (buffer.batch_size)
    # The rollout's sampling (rollout.temperature, rollout.top_p): every policy logprob and the entropy
    # are taken under the distribution vLLM samples from (agentrl.algo.logprobs), so r and w compare
    # like with like.
    temperature: float = 1.0
    top_p: float = 1.0
    total_steps: int = 1  # learner batches of the run (train.steps), for the lr schedules
    critic: CriticConfig | None = None  # the `critic` section, with algo.advantage gae only
    critic_path: str | None = None  # the folder the critic starts from (critic.init_from, resolved)
    teacher_path: str | None = None  # the teacher's folder (algo.teacher.model, resolved), placement learner

    def __post_init__(self) -> None:
        if self.algo.advantage.type == "gae" and (self.critic is None or self.critic_path is None):
            raise ValueError("algo.advantage 'gae' needs a critic (critic config and critic_path)")
        if self.learner.ema_decay > 0 and self.learner.lora.rank > 0:
            raise ValueError("learner.ema_decay with learner.lora.rank > 0 is not supported: the EMA tracks "
                             "full weights; use one or the other")

    @classmethod
    def from_config(cls, cfg: Config, model_path: str, teacher_path: str | None = None) -> "LearnerSpec":
        """The spec of `cfg`'s learner, whose actor starts from `model_path` (the resolved model.path);
        `teacher_path`: algo.teacher.model resolved (a named model's folder), else the key as written."""
        gae, teacher = cfg.algo.advantage.type == "gae", cfg.algo.teacher
        return cls(model_path=model_path, learner=cfg.learner, algo=cfg.algo, batch_size=cfg.buffer.batch_size,
                   temperature=cfg.rollout.temperature, top_p=cfg.rollout.top_p, total_steps=cfg.train.steps,
                   critic=cfg.critic if gae else None, critic_path=critic_init_path(cfg, model_path) if gae else None,
                   teacher_path=teacher_path or (teacher.model if teacher is not None else None))


def critic_init_path(cfg: Config, model_path: str) -> str:
    """critic.init_from: 'actor', 'reward_model' (the first reward_model source's folder) or a folder."""
    if cfg.critic.init_from == "actor":
        return model_path
    if cfg.critic.init_from == "reward_model":
        source = next(s for s in cfg.rewards.sources if s.type == "reward_model")
        return source.reward_model.path
    return cfg.critic.init_from
