"""`train.save_rollouts`: which episodes a run writes down for `python -m agentrl.view` and `agentrl.replay`."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, model_validator

from agentrl.config.base import StrictModel


class SaveRolloutsConfig(StrictModel):
    """Episodes written to <out_dir>/rollouts.jsonl and eval_episodes.jsonl, at a bounded cost. The boolean of
    earlier versions still loads: true = every trained episode, no cap; false = none."""

    sample_groups: Annotated[int, Field(ge=0)] | Literal["all"] = Field(
        4, description="groups written per learner step, drawn at random (seeded by train.seed and the step) "
                       "from the step's batch, whole groups so a group's baseline can be read; 'all' = every "
                       "group; 0 = no rollouts.jsonl")
    max_mb: float = Field(200.0, ge=0, description="stop writing a file once it holds this many MB (one INFO "
                                                   "line says so); 0 = no cap")
    eval: bool = Field(True, description="also write the held-out evaluations' episodes (before, during, after "
                                         "RL) to <out_dir>/eval_episodes.jsonl, the viewer's before/after")

    @model_validator(mode="before")
    @classmethod
    def _boolean(cls, value: Any) -> Any:
        if isinstance(value, bool):  # the key's earlier form
            return {"sample_groups": "all", "max_mb": 0} if value else {"sample_groups": 0, "eval": False}
        return value
