"""The learner's models, built from Hugging Face folders: DeepSpeed engines for the actor (optionally
with LoRA and gradient checkpointing), the frozen reference and the critic; the critic's `ValueModel`;
the actor's `ModelEMA`. No training logic here.

Every trained engine gets its own AdamW over its trainable parameters and a warmup + decay
learning-rate schedule (`lr_factor`, a pure function so it is tested by the number). Optimizer
offload keeps torch's AdamW (`zero_force_ds_cpu_optimizer: false`): DeepSpeed's CPU Adam is a C++
op that would be compiled on first use, which costs minutes on a fresh machine.
"""

from __future__ import annotations

import contextlib
import math
import os
from pathlib import Path
from typing import Any, Callable

import torch
from safetensors.torch import load_file, save_file

from agentrl.config import LearnerConfig, OptimConfig


def lr_factor(step: int, kind: str, warmup: int, total: int, min_ratio: float) -> float:
    """Multiplier of the peak lr for optimizer step `step` (0-based).

    Warmup is linear from lr / warmup at step 0 to the peak at step warmup - 1 (step 0 is not wasted
    on lr 0). After it, "linear" and "cosine" decay from the peak to min_ratio * peak at step `total`.
    """
    if warmup and step < warmup:
        return (step + 1) / warmup
    if kind == "constant":
        return 1.0
    progress = min(max((step - warmup) / max(total - warmup, 1), 0.0), 1.0)
    if kind == "linear":
        return min_ratio + (1.0 - min_ratio) * (1.0 - progress)
    if kind == "cosine":
        return min_ratio + (1.0 - min_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))
    raise ValueError(f"unknown lr scheduler {kind!r}")


def ds_config(opt: OptimConfig, micro_batch_size: int, grad_accum: int, bf16: bool,
              stage: int | None = None, offload_params: bool | None = None) -> dict[str, Any]:
    stage = opt.zero_stage if stage is None else stage
    zero: dict[str, Any] = {"stage": stage, "stage3_param_persistence_threshold": 0}
    if opt.offload_optimizer and stage >= 1:
        zero["offload_optimizer"] = {"device": "cpu"}
    if (opt.offload_params if offload_params is None else offload_params) and stage == 3:
        zero["offload_param"] = {"device": "cpu"}
    return {
        "train_micro_batch_size_per_gpu": micro_batch_size,
        "gradient_accumulation_steps": grad_accum,
        "gradient_clipping": opt.grad_clip,
        "zero_optimization": zero,
        "zero_force_ds_cpu_optimizer": False,
        "bf16": {"enabled": bf16},
        "steps_per_print": 10**9,
        "wall_clock_breakdown": False,
    }


def disable_dropout(module: torch.nn.Module) -> torch.nn.Module:
    """Every dropout of `module` set to 0, in place: `nn.Dropout` layers (LoRA's included) and the float
    rates attention layers read in train mode (`attention_dropout`, `dropout`). Train mode stays
    (gradient checkpointing needs it). Returns `module`."""
    for sub in module.modules():
        if isinstance(sub, torch.nn.Dropout):
            sub.p = 0.0
        for attr in ("attention_dropout", "dropout"):
            if isinstance(getattr(sub, attr, None), float):
                setattr(sub, attr, 0.0)
    return module


def trainable_params(module: torch.nn.Module) -> list[torch.nn.Parameter]:
    """The weights the optimizer steps (LoRA and a frozen actor leave some out), in the module's order."""
    return [p for p in module.parameters() if p.requires_grad]


def trained_engine(module: torch.nn.Module, opt: OptimConfig, micro_batch_size: int, grad_accum: int,
                   bf16: bool, total_steps: int):
    """A DeepSpeed engine with AdamW over the trainable parameters and the configured schedule."""
    import deepspeed

    params = trainable_params(module)
    optimizer = torch.optim.AdamW(params, lr=opt.lr, weight_decay=opt.weight_decay)
    schedule: Callable[[int], float] = lambda step: lr_factor(  # noqa: E731
        step, opt.scheduler, opt.warmup_steps, total_steps, opt.min_lr_ratio)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, schedule)
    engine, *_ = deepspeed.initialize(model=module, optimizer=optimizer, lr_scheduler=scheduler,
                                      config=ds_config(opt, micro_batch_size, grad_accum, bf16))
    return engine


def eval_engine(module: torch.nn.Module, opt: OptimConfig, micro_batch_size: int, offload: bool):
    """A frozen, eval-only engine: ZeRO-3 if the trained model is ZeRO-3 or offload is asked, else ZeRO-0."""
    import deepspeed

    module = module.eval().requires_grad_(False)
    stage = 3 if opt.zero_stage == 3 or offload else 0
    config = ds_config(opt, micro_batch_size, 1, False, stage=stage, offload_params=offload)
    config.pop("zero_force_ds_cpu_optimizer")
    engine, *_ = deepspeed.initialize(model=module, config=config)
    return engine


def frozen_causal_lm(path: str, learner: LearnerConfig):
    """A frozen causal LM read from `path` (the reference, the teacher on the learner): float32 weights, no
    dropout, in an eval-only engine placed like every frozen model of the learner (`eval_engine`: ZeRO-3 with
    a ZeRO-3 actor or with learner.reference_offload, else ZeRO-0), micro_batch_size rows a no-grad pass."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    return eval_engine(disable_dropout(model), learner, learner.micro_batch_size, learner.reference_offload)


def frozen_engine(module: torch.nn.Module, micro_batch_size: int, offload: bool):
    """A frozen model in its own eval-only engine (ZeRO-0; ZeRO-3 with parameters on CPU when `offload`),
    setting up the process group if needed. The reward-model scorer takes this as its `engine_factory`."""
    from agentrl.learner.dist import init_single_process_dist

    init_single_process_dist()
    return eval_engine(module, OptimConfig(), micro_batch_size, offload)


def load_causal_lm(path: str, opt: OptimConfig) -> torch.nn.Module:
    """The actor: float32 weights (DeepSpeed casts for bf16), checkpointing and LoRA as configured."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    return prepare_trainable(model, opt, task_type="CAUSAL_LM")


def load_value_model(path: str, opt: OptimConfig) -> torch.nn.Module:
    """The critic: a causal-LM or reward-model body with a scalar value head (`ValueModel`)."""
    return prepare_trainable(ValueModel.from_pretrained(path), opt, task_type=None)


def prepare_trainable(model: torch.nn.Module, opt: OptimConfig, task_type: str | None = None) -> torch.nn.Module:
    if opt.gradient_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        if getattr(model, "config", None) is not None:
            model.config.use_cache = False
    if opt.lora.rank > 0:
        from agentrl.learner.lora import apply_lora

        model = apply_lora(model, opt.lora.rank, opt.lora.alpha, opt.lora.dropout, opt.lora.target_modules)
    return model


# -- the critic --------------------------------------------------------------------------------------

VALUE_HEAD_FILE = "value_head.safetensors"


class ValueModel(torch.nn.Module):
    """values_BT = value_head(body(input_ids).last_hidden_state). The head is Linear(hidden, 1) with a bias.

    The PPO critic: a decoder body with a scalar value head, V(s_t) for every token position t.

    `ValueModel.from_pretrained(path)` reads three kinds of folder:
      * a folder written by `ValueModel.save_pretrained` (body + `value_head.safetensors`): reloaded as saved;
      * a sequence-classifier reward model (`*ForSequenceClassification`, num_labels=1): the body AND its
        `score` weight initialise the critic, as DeepSpeed-Chat and OpenRLHF start the critic from the
        reward model, so the first value estimates already track the reward;
      * a causal LM (the actor's starting weights): the body without the LM head, and a value head of
        zeros. Zeros, not small random values: every initial value is exactly 0, so the first GAE
        advantages are the plain discounted returns instead of returns minus noise, and runs are
        reproducible across seeds of the head. The head's own gradient (dL/dV * h) is non-zero from the
        first step; the body receives gradient from the second step on, once the head is non-zero.

    The body is `AutoModel` (e.g. `Qwen2Model`). Causal-LM and classifier checkpoints both keep the body
    under the model's `base_model_prefix` (`model.` for Qwen2/Llama), which `AutoModel.from_pretrained`
    strips, so both load the same body weights; the classifier's `score.weight` (and `lm_head.weight`)
    are reported as unexpected keys and ignored by that load.
    """

    def __init__(self, body: torch.nn.Module, value_head: torch.nn.Linear) -> None:
        super().__init__()
        self.body = body
        self.value_head = value_head

    @property
    def config(self):
        """The body's Hugging Face config (peft and DeepSpeed read `model.config`)."""
        return self.body.config

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                position_ids: torch.Tensor | None = None) -> torch.Tensor:
        """(B, T) float32 values, one per position: the value of the state ending at token t.
        Without position_ids, positions are 0..T-1 (right padding); padded positions get values that callers
        mask out. With position_ids restarting at 0 and no attention_mask, one row holds several packed
        sequences that do not attend to each other (`packed_forward`)."""
        hidden_BTH = self.body(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                               use_cache=False).last_hidden_state
        return self.value_head(hidden_BTH.to(self.value_head.weight.dtype)).squeeze(-1).float()

    def gradient_checkpointing_enable(self, gradient_checkpointing_kwargs: dict | None = None) -> None:
        self.body.gradient_checkpointing_enable(gradient_checkpointing_kwargs=gradient_checkpointing_kwargs)

    def gradient_checkpointing_disable(self) -> None:
        self.body.gradient_checkpointing_disable()

    def enable_input_require_grads(self) -> None:
        """Needed only for reentrant checkpointing with a frozen embedding (LoRA); transformers 5 defaults to
        non-reentrant checkpointing, which does not need it."""
        self.body.enable_input_require_grads()

    def get_input_embeddings(self) -> torch.nn.Module:
        return self.body.get_input_embeddings()

    @classmethod
    def from_pretrained(cls, path: str | os.PathLike, dtype: torch.dtype = torch.float32) -> "ValueModel":
        """Load a saved critic, a reward model (body + score as head) or a causal LM (body + zero head)."""
        from transformers import AutoModel, AutoModelForSequenceClassification

        path = str(path)
        if (Path(path) / VALUE_HEAD_FILE).exists():
            body = AutoModel.from_pretrained(path, dtype=dtype)
            head = _linear_head(body.config.hidden_size, dtype)
            head.load_state_dict(load_file(Path(path) / VALUE_HEAD_FILE))
            return cls(body, head)
        if _is_sequence_classifier(path):
            rm = AutoModelForSequenceClassification.from_pretrained(path, dtype=dtype)
            score = getattr(rm, "score", None)
            if not isinstance(score, torch.nn.Linear) or score.out_features != 1:
                raise ValueError(f"{path}: a critic needs a reward model with a Linear `score` of one output, "
                                 f"got {score!r}")
            head = _linear_head(rm.config.hidden_size, dtype)
            with torch.no_grad():
                head.weight.copy_(score.weight)
                head.bias.copy_(score.bias if score.bias is not None else torch.zeros(1))
            return cls(rm.base_model, head)
        body = AutoModel.from_pretrained(path, dtype=dtype)
        return cls(body, _linear_head(body.config.hidden_size, dtype))

    def save_pretrained(self, out_dir: str | os.PathLike, state_dict: dict[str, torch.Tensor] | None = None) -> None:
        """Write the body as a normal Hugging Face folder plus `value_head.safetensors` (keys weight, bias).
        `state_dict` (keys as in `self.state_dict()`) replaces the live weights, e.g. gathered ZeRO-3 ones."""
        out_dir = Path(out_dir)
        out_dir.mkdir(parents=True, exist_ok=True)
        sd = state_dict if state_dict is not None else self.state_dict()
        body_sd = {k[len("body."):]: v for k, v in sd.items() if k.startswith("body.")}
        self.body.save_pretrained(out_dir, state_dict=body_sd)
        head_sd = {k[len("value_head."):]: v.detach().cpu().contiguous() for k, v in sd.items()
                   if k.startswith("value_head.")}
        save_file(head_sd, out_dir / VALUE_HEAD_FILE)


def _linear_head(hidden: int, dtype: torch.dtype) -> torch.nn.Linear:
    head = torch.nn.Linear(hidden, 1, dtype=dtype)
    torch.nn.init.zeros_(head.weight)
    torch.nn.init.zeros_(head.bias)
    return head


def _is_sequence_classifier(path: str) -> bool:
    from transformers import AutoConfig

    architectures = AutoConfig.from_pretrained(path).architectures or []
    return any(a.endswith("ForSequenceClassification") for a in architectures)


# -- the actor EMA --------------------------------------------------------------------------------

class ModelEMA:
    """Exponential moving average of the trained weights, kept in float32 on the CPU.

        shadow_k = decay * shadow_{k-1} + (1 - decay) * theta_k,    shadow_0 = theta_0

    The shadow covers every parameter of the module (frozen ones included, so the saved folder is a full
    model), under `named_parameters()` names; a tied parameter (lm_head = embed_tokens) appears once, under
    its first name, as in `named_parameters()`. It costs 4 bytes per parameter of host memory on every rank.

    Under DeepSpeed ZeRO-3 (`zero3=True`) each parameter is gathered on its own
    (`deepspeed.zero.GatheredParameters`, read-only) while it is read, so the peak extra device memory is
    one parameter rather than the whole model. Gathering is a collective: every rank must call
    `__init__` and `update`. Pass the bare module (`engine.module`), not the DeepSpeed engine, so names
    carry no `module.` prefix.
    """

    def __init__(self, module: torch.nn.Module, decay: float, zero3: bool = False) -> None:
        if not 0.0 <= decay <= 1.0:
            raise ValueError(f"EMA decay must be in [0, 1], got {decay}")
        self.decay, self.zero3 = decay, zero3
        self.num_updates = 0
        self.shadow: dict[str, torch.Tensor] = {}
        for name, param in module.named_parameters():
            with self._gathered(param):
                self.shadow[name] = param.detach().to("cpu", torch.float32, copy=True)

    def _gathered(self, param: torch.nn.Parameter):
        if not self.zero3:
            return contextlib.nullcontext()
        import deepspeed

        return deepspeed.zero.GatheredParameters([param], enabled=True)

    @torch.no_grad()
    def update(self, module: torch.nn.Module) -> None:
        """shadow = decay * shadow + (1 - decay) * param, for every parameter of `module`."""
        for name, param in module.named_parameters():
            if name not in self.shadow:
                raise KeyError(f"parameter {name!r} is not in the EMA (built from a different module?)")
            with self._gathered(param):
                value = param.detach().to("cpu", torch.float32)
            self.shadow[name].mul_(self.decay).add_(value, alpha=1.0 - self.decay)
        self.num_updates += 1

    def state_dict(self) -> dict[str, torch.Tensor]:
        """{full parameter name: float32 CPU tensor}; the live shadow tensors, not copies."""
        return dict(self.shadow)

    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        missing = set(self.shadow) ^ set(state)
        if missing:
            raise KeyError(f"EMA state keys differ: {sorted(missing)[:5]}")
        for name, value in state.items():
            self.shadow[name].copy_(value)

    def save_pretrained(self, model_template, out_dir: str | os.PathLike, tokenizer=None) -> None:
        """Write a normal Hugging Face folder holding the EMA weights (float32), reloadable with
        `AutoModelForCausalLM.from_pretrained`. `model_template` is any instance of the model class whose
        `named_parameters()` match the shadow (e.g. the trained module; under ZeRO-3 its partitioned
        parameters are not read); its config and generation config are written alongside.
        Only rank 0 writes when torch.distributed is initialised."""
        if torch.distributed.is_available() and torch.distributed.is_initialized() and torch.distributed.get_rank() != 0:
            return
        model_template.save_pretrained(out_dir, state_dict=self.state_dict())
        if tokenizer is not None:
            tokenizer.save_pretrained(out_dir)
