"""`algo.teacher`: on-policy distillation from a teacher model (agentrl.algo.distill). Unset = off."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from agentrl.config.base import StrictModel


class TeacherConfig(StrictModel):
    """A frozen teacher scores every token the student samples; -coef * (log mu - log pi_teacher) is each
    token's advantage, alone or added to the env's reward-based advantage. The teacher must share the
    student's tokenizer (checked at start-up)."""

    model: str = Field(min_length=1, description="the teacher: a Hugging Face folder, a hub id in the local cache, "
                                                 "or a named model (`python -m agentrl.models list`)")
    coef: float = Field(1.0, gt=0.0, le=100.0, description="weight of the per-token reverse KL advantage "
                                                           "-coef * (log pi_student - log pi_teacher)")
    env_advantage: Literal["none", "add"] = Field(
        "none", description="none: the distillation advantage alone (rewards are still computed and logged); "
                            "add: plus env_weight times the env's advantage (algo.advantage)")
    env_weight: float = Field(1.0, gt=0.0, le=100.0, description="weight of the env's advantage (env_advantage add)")
    placement: Literal["learner", "engine"] = Field(
        "learner", description="learner: a frozen copy on every learner rank, beside the reference (small teachers); "
                               "engine: a vLLM engine of its own scores each finished episode (large teachers)")

    @model_validator(mode="before")
    @classmethod
    def _weight_needs_add(cls, data):
        # env_weight read only under 'add': written under 'none' it would be silently ignored.
        if isinstance(data, dict) and "env_weight" in data and data.get("env_advantage", "none") != "add":
            raise ValueError("algo.teacher.env_weight applies only with algo.teacher.env_advantage add "
                             "(with none the distillation advantage is used alone)")
        return data

    @property
    def env_scale(self) -> float | None:
        """The env advantage's weight in A = A_distill + w * A_env; None: not added."""
        return self.env_weight if self.env_advantage == "add" else None
