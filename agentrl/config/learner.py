"""The trained engines' options: the actor (`LearnerConfig`, with its micro-batch plan), the critic, LoRA, and
what every DeepSpeed engine shares (`OptimConfig`)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, model_validator

from agentrl.config.base import StrictModel


class LoraConfig(StrictModel):
    """LoRA adapters through peft; rank 0 trains the full model."""

    rank: int = Field(0, ge=0, le=1024, description="adapter rank; 0 = LoRA off")
    alpha: float = Field(16.0, gt=0, description="scaling numerator (the update is B @ A * alpha / rank)")
    dropout: float = Field(0.0, ge=0.0, lt=1.0, description="dropout on the adapter input")
    target_modules: list[str] = Field(default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj"],
                                      description="module names that get adapters")


class OptimConfig(StrictModel):
    """What every trained DeepSpeed engine (actor, critic) has: optimizer, schedule, memory options."""

    zero_stage: int = Field(0, ge=0, le=3, description="DeepSpeed ZeRO stage")
    lr: float = Field(3e-4, gt=0, le=1.0, description="peak learning rate")
    weight_decay: float = Field(0.0, ge=0.0, le=1.0, description="AdamW weight decay")
    grad_clip: float = Field(1.0, gt=0, description="gradient norm clip")
    scheduler: Literal["constant", "linear", "cosine"] = Field(
        "constant", description="learning-rate schedule after warmup (decay to min_lr_ratio * lr at the end)")
    warmup_steps: int = Field(0, ge=0, description="optimizer steps of linear warmup from 0")
    min_lr_ratio: float = Field(0.0, ge=0.0, le=1.0, description="final lr / peak lr for linear and cosine")
    gradient_checkpointing: bool = Field(False, description="recompute activations in backward (less memory)")
    offload_optimizer: bool = Field(False, description="ZeRO optimizer state on CPU (needs zero_stage >= 1)")
    offload_params: bool = Field(False, description="ZeRO-3 parameters on CPU (needs zero_stage 3)")
    lora: LoraConfig = Field(default_factory=LoraConfig, description="LoRA adapters (rank 0 = off)")

    @model_validator(mode="after")
    def _offload_needs_zero(self) -> "OptimConfig":
        if self.offload_optimizer and self.zero_stage == 0:
            raise ValueError("offload_optimizer needs zero_stage >= 1")
        if self.offload_params and self.zero_stage != 3:
            raise ValueError("offload_params needs zero_stage 3")
        return self


class LearnerConfig(OptimConfig):
    """The DeepSpeed actor engine, its frozen reference and the actor-only training options."""

    dtype: Literal["float32", "bfloat16"] = Field("float32", description="training precision")
    micro_batch_size: int = Field(32, ge=1, description="sequences per forward/backward (gradient accumulation)")
    # The default is a token budget: it measured faster than row-count micro-batches on every shipped
    # example's learner (1.05-1.55x) and on whole runs (docs/benchmarks.md, "Packing ragged batches").
    micro_batch_tokens: int | None = Field(
        4096, ge=16, le=1 << 24, description="token budget of a micro-batch: rows sorted by length and grouped so "
        "each holds about this many tokens, run only up to its own longest row (a longer row runs alone), ranks "
        "balanced by tokens; None = micro_batch_size rows each, at the batch's longest row (agentrl.learner.packing). "
        "Setting micro_batch_size alone selects None")
    pack_sequences: bool = Field(
        False, description="with micro_batch_tokens: each micro-batch's rows run as one row, positions restarting "
        "per sequence and no attention across them (no padding; flash-attention's varlen kernels where installed). "
        "The reference, teacher and critic passes run packed too; a group's prompt is no longer run once "
        "(agentrl.learner.shared_prefix)")
    mini_batches: int = Field(1, ge=1, le=1024, description="optimizer steps per batch (each bumps the version)")
    target_kl: float | None = Field(
        None, gt=0, le=10.0, description="stops a batch's optimizer steps early (PPO's target_kl: Spinning Up, "
        "Stable-Baselines3): before each step after a batch's first, a no-grad pass measures KL(pi_prox || "
        "pi_theta) over that mini-batch's tokens (k3, a mean); above this the actor skips the batch's remaining "
        "steps (the critic still takes them, each still counts as a version). None = off; needs "
        "learner.mini_batches > 1")
    max_step_kl: float | None = Field(
        None, gt=0, le=10.0, description="bounds every actor optimizer step, a batch's first included: after it, a "
        "no-grad pass measures KL(pi_before || pi_after) over the step's tokens (k3, a mean); above this the step "
        "is shortened along its line until within it (a backtracking line search; dropped after 4 tries: "
        "agentrl.learner.step_bound). None = off; needs learner.zero_stage 0 and dtype float32")
    num_threads: int = Field(1, ge=1, le=256, description="torch threads for the learner")
    reference_offload: bool = Field(False, description="keep the frozen reference's parameters on CPU (ZeRO-3)")
    ema_decay: float = Field(0.0, ge=0.0, lt=1.0, description="actor EMA decay; > 0 keeps an EMA, which is "
                                                               "what gets saved")
    freeze_actor_steps: int = Field(0, ge=0, description="the critic trains alone for this many learner steps")
    unsup_coef: float = Field(0.0, ge=0.0, le=100.0, description="weight of the LM loss on unsup_data "
                                                                  "(DeepSpeed-Chat's unsup_coef); 0 = off")
    unsup_data: str | None = Field(None, description="text dataset for the LM loss: .txt (one text per line) "
                                                     "or .jsonl with a 'text' field")
    unsup_batch_size: int = Field(4, ge=1, description="texts per LM-loss micro-step")

    @model_validator(mode="before")
    @classmethod
    def _row_count_when_asked(cls, data: Any) -> Any:
        """A config that sets micro_batch_size and no token budget asks for micro-batches of that many rows,
        as it did before the default became a budget: honour it rather than ignore the key it set."""
        if isinstance(data, dict) and "micro_batch_size" in data and "micro_batch_tokens" not in data:
            return {**data, "micro_batch_tokens": None}
        return data

    @model_validator(mode="after")
    def _unsup_needs_data(self) -> "LearnerConfig":
        if self.unsup_coef > 0 and not self.unsup_data:
            raise ValueError("learner.unsup_coef > 0 needs learner.unsup_data (a .txt or .jsonl file)")
        return self

    @model_validator(mode="after")
    def _target_kl_needs_steps(self) -> "LearnerConfig":
        if self.target_kl is not None and self.mini_batches == 1:
            raise ValueError(f"learner.target_kl={self.target_kl} needs learner.mini_batches > 1: it stops a batch's "
                             f"later optimizer steps, and with one step a batch there is none")
        return self

    @model_validator(mode="after")
    def _step_bound_needs_own_weights(self) -> "LearnerConfig":
        if self.max_step_kl is not None and (self.zero_stage != 0 or self.dtype != "float32"):
            raise ValueError(f"learner.max_step_kl={self.max_step_kl} needs learner.zero_stage 0 and learner.dtype "
                             f"float32 (it shortens a step in the module's weights, which are the optimizer's only "
                             f"there); got zero_stage {self.zero_stage}, dtype {self.dtype}")
        return self

    @model_validator(mode="after")
    def _packing_needs_budget(self) -> "LearnerConfig":
        if self.pack_sequences and self.micro_batch_tokens is None:
            raise ValueError("learner.pack_sequences needs learner.micro_batch_tokens (the tokens one packed row "
                             "holds), e.g. learner.micro_batch_tokens=4096")
        return self


class CriticConfig(OptimConfig):
    """The value model of PPO with GAE (built only when algo.advantage.type is 'gae')."""

    init_from: str = Field("actor", description="'actor' (the policy's weights, new value head), "
                                                "'reward_model' (the first reward_model source: body and score "
                                                "head, as DeepSpeed-Chat does), or a model folder")
    lr: float = Field(1e-3, gt=0, le=1.0, description="critic learning rate")
