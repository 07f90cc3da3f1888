"""The config tree of the stages before RL (`python -m agentrl.sft | rm | prm | dpo | kto`).

One tree for every stage, loaded like the RL config (YAML, `dotted.key=value` overrides, nearest-key
errors), so a user moving from `train_sft` to `train_dpo` changes the stage name and the keys of its
own section, nothing else. OpenRLHF's flags map onto it: `--input_key` is `data.input_key`, `--max_len`
is `data.max_len`, `--zero_stage` is `optim.zero_stage`, and `agentrl.stage_cli` also accepts those
bare leaf names as `--input_key value`.
"""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import Field, model_validator

from agentrl.config.learner import OptimConfig
from agentrl.config.schema import ALLOW_DOWNLOAD
from agentrl.config.base import StrictModel

STAGES = ("sft", "rm", "prm", "dpo", "kto")

# Keys the stage tree had and no longer has (one-line "moved" errors; see agentrl.config.load).
STAGE_MOVED_KEYS = {
    "model.default": "model.path (a folder of `python -m agentrl.models prepare default [key=value ...]`; a stage "
                     "with model.path unset starts from the default model with its default settings)",
}


class StageModelConfig(StrictModel):
    """The starting model. The embedded default's own settings (`model.default` of the RL config) are not
    stage settings: unset, a stage starts from the default model as built with its defaults, the folder
    `python -m agentrl.models prepare default` prints; other settings make a folder to pass as path."""

    path: str | None = Field(None, description="Hugging Face model folder, a hub id (org/name) whose files are all "
                                               "in the local Hugging Face cache, or a named model prepared offline "
                                               "(`python -m agentrl.models list`); unset = the embedded default")
    allow_download: bool = Field(False, description=ALLOW_DOWNLOAD)


class StageDataConfig(StrictModel):
    """Datasets, their keys and how rows become tokens."""

    paths: list[str] = Field(default_factory=list, description="training datasets: .jsonl, .json, .parquet, or a "
                                                               "folder saved with datasets' save_to_disk")
    probs: list[float] | None = Field(None, description="mixing weights of `paths` (normalised; default: "
                                                        "each dataset in full)")
    eval_path: str | None = Field(None, description="held-out dataset (same formats); unset = eval_fraction of "
                                                    "the training rows")
    eval_fraction: float = Field(0.05, ge=0.0, lt=1.0, description="share of training rows held out when "
                                                                   "eval_path is unset")
    input_key: str = Field("input", description="prompt text (SFT with output_key, KTO, PRM; the shared prompt "
                                                "of chosen/rejected strings)")
    output_key: str = Field("output", description="response text (SFT, KTO)")
    messages_key: str | None = Field(None, description="a list of chat messages per row (multi-turn SFT, KTO); "
                                                       "set, it replaces input_key/output_key")
    chosen_key: str = Field("chosen", description="preferred response: a string, or a list of messages")
    rejected_key: str = Field("rejected", description="dispreferred response: a string, or a list of messages")
    label_key: str = Field("label", description="KTO: desirable (true) or not; PRM: the list of step labels")
    tools_key: str | None = Field(None, description="a list of tool schemas per row, rendered into the first "
                                                    "prompt as rollouts render them")
    apply_chat_template: bool = Field(False, description="render with the tokenizer's chat template (prompt as "
                                                         "a user message); else input_template or raw text")
    input_template: str | None = Field(None, description="prompt template with one '{}', e.g. "
                                                         "'User: {}\\nAssistant: '")
    max_len: int = Field(2048, ge=8, le=1_048_576, description="tokens per sample; longer rows are dropped and "
                                                               "counted, never cut")
    max_samples: int | None = Field(None, ge=1, description="at most this many training rows (after mixing)")
    packing: bool = Field(False, description="several sequences per row of max_len tokens, positions restarting "
                                             "and attention kept inside each: SFT packs samples into rows "
                                             "(micro_batch_size rows a micro-batch); RM, PRM, DPO and KTO pack "
                                             "the sequences of each micro-batch of micro_batch_size samples "
                                             "(the reference log-probs too); the losses stay exact")

    @model_validator(mode="after")
    def _consistent(self) -> "StageDataConfig":
        if self.probs is not None and len(self.probs) != len(self.paths):
            raise ValueError(f"data.probs has {len(self.probs)} weights for {len(self.paths)} data.paths")
        if self.probs is not None and (any(p < 0 for p in self.probs) or sum(self.probs) <= 0):
            raise ValueError("data.probs must be non-negative with a positive sum")
        if self.input_template is not None and self.input_template.count("{}") != 1:
            raise ValueError(f"data.input_template must contain exactly one '{{}}', got {self.input_template!r}")
        if self.input_template is not None and self.apply_chat_template:
            raise ValueError("data.input_template and data.apply_chat_template are exclusive: choose one")
        return self


class StageOptimConfig(OptimConfig):
    """The DeepSpeed engine and batch sizes (the same options and schedules as the RL learner)."""

    lr: float = Field(1e-5, gt=0, le=1.0, description="peak learning rate")
    scheduler: Literal["constant", "linear", "cosine"] = Field("cosine", description="after warmup, decay to "
                                                                                     "min_lr_ratio * lr")
    min_lr_ratio: float = Field(0.1, ge=0.0, le=1.0, description="final lr / peak lr for linear and cosine")
    dtype: Literal["float32", "bfloat16"] = Field("float32", description="training precision")
    micro_batch_size: int = Field(8, ge=1, description="samples (or packed rows) per forward/backward per rank")
    batch_size: int = Field(64, ge=1, description="samples per optimizer step over all ranks (a multiple of "
                                                  "micro_batch_size * ranks)")
    epochs: int = Field(1, ge=1, le=100_000, description="passes over the training rows")
    max_steps: int | None = Field(None, ge=0, description="stop after this many optimizer steps (default: epochs)")


class StageTrainConfig(StrictModel):
    """Outputs, evaluation and logging."""

    out_dir: str = Field("runs/stage", description="the saved Hugging Face folder, metrics.jsonl, summary.json")
    eval_every: int = Field(0, ge=0, description="evaluate on the held-out rows every N steps (0 = at the end only)")
    seed: int = Field(0, ge=0, description="shuffling, the eval split, new heads")
    loggers: list[Literal["jsonl", "tensorboard", "wandb"]] = Field(
        default_factory=lambda: ["jsonl"], description="metric sinks (metrics.jsonl is always written)")
    wandb_project: str = Field("agentrl", description="wandb project")
    save_model: bool = Field(True, description="save the trained model (LoRA: the adapter) to out_dir")


class DPOConfig(StrictModel):
    """Direct preference optimisation against a frozen reference (the starting model)."""

    beta: float = Field(0.1, gt=0, le=100.0, description="strength of the implicit KL constraint")
    loss: Literal["sigmoid", "ipo"] = Field("sigmoid", description="sigmoid (DPO) or ipo (squared hinge, Azar et al.)")
    label_smoothing: float = Field(0.0, ge=0.0, lt=0.5, description="conservative DPO: assumed share of flipped "
                                                                     "labels")
    nll_coef: float = Field(0.0, ge=0.0, description="weight of the SFT loss on chosen responses (RPO)")


class KTOConfig(StrictModel):
    """Kahneman-Tversky optimisation on unpaired desirable / undesirable examples."""

    beta: float = Field(0.1, gt=0, le=100.0, description="strength of the implicit KL constraint")
    desirable_weight: float = Field(1.0, gt=0, description="loss weight of desirable examples")
    undesirable_weight: float = Field(1.0, gt=0, description="loss weight of undesirable examples")


class PRMConfig(StrictModel):
    """Process reward model: step labels at placeholder tokens, trained on the reward tokens' logits."""

    placeholder_token: str = Field("ки", description="marks the end of each step in the input text")
    reward_tokens: list[str] = Field(default_factory=lambda: ["+", "-"],
                                     description="label tokens, the good label first; a step's score is "
                                                 "softmax over them at its placeholder")


class StageConfig(StrictModel):
    """One supervised or preference stage."""

    moved_keys: ClassVar[dict[str, str]] = STAGE_MOVED_KEYS
    model: StageModelConfig = Field(default_factory=StageModelConfig, description="the starting model")
    data: StageDataConfig = Field(default_factory=StageDataConfig, description="datasets and tokenisation")
    optim: StageOptimConfig = Field(default_factory=StageOptimConfig, description="DeepSpeed engine and batches")
    train: StageTrainConfig = Field(default_factory=StageTrainConfig, description="outputs and evaluation")
    dpo: DPOConfig = Field(default_factory=DPOConfig, description="the dpo stage's loss")
    kto: KTOConfig = Field(default_factory=KTOConfig, description="the kto stage's loss")
    prm: PRMConfig = Field(default_factory=PRMConfig, description="the prm stage's labels")
