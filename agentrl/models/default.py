"""The embedded default model: built here, because nothing can be downloaded at run time.

Steps (each cached in a folder keyed by a hash of its settings):
1. train a byte-level BPE tokenizer with a Qwen-style chat template on the warm-start task's text
   (`model.default.task`: guess_number, the default, or calculator, whose demonstrations hold tool calls);
2. build a tiny Qwen2-architecture causal LM (head_dim 64, which vLLM's CPU attention supports);
3. warm-start it with a short supervised stage on imperfect demonstrations (`agentrl.learner.stage`,
   the loop of `python -m agentrl.sft`).
The result is a normal Hugging Face folder that vLLM, DeepSpeed and `from_pretrained` all load.
A user's own model path replaces all of this.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import math
import random
import shutil
from pathlib import Path

from agentrl.data.chat import ChatFormat, ledger_from_messages
from agentrl.config import DefaultModelConfig
from agentrl.config.stages import StageConfig
from agentrl.models.demos import demo_source, optimal_prob, teacher_digest, try_teacher
from agentrl.utils.files import build_folder, publish_folder

log = logging.getLogger(__name__)

SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
CHAT_TEMPLATE = (
    "{%- for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def cache_root() -> Path:
    return Path(os.environ.get("AGENTRL_CACHE", Path.home() / ".cache" / "agentrl"))


# Settings added after the first models were cached: left out of the key while at their defaults,
# so the models built before them keep their keys.
_LATER_DEFAULTS = {"task": "guess_number", "split_digits": False, "demo_max_turns": None}


# The warm start's training loop is part of the key: models warm-started by an earlier loop (a plain torch
# loop with a one-cycle schedule, before the stage loop) are not reused.
WARM_START_LOOP = "stage-v1"


def _key(cfg: DefaultModelConfig) -> str:
    """The cache folder's key: the settings (the teacher's strength as it applies), the warm-start loop and
    the teacher's code (`teacher_digest`: editing demo_tasks or demonstration builds anew)."""
    settings = cfg.model_dump(exclude={"cache_dir", "min_start_reward"})  # what the run does, not the model
    settings["demo_optimal_prob"] = optimal_prob(cfg.task, cfg.demo_optimal_prob)
    settings = {k: v for k, v in settings.items() if _LATER_DEFAULTS.get(k, object()) != v}
    settings["warm_start_loop"] = WARM_START_LOOP
    settings["teacher"] = teacher_digest(cfg.task)
    blob = json.dumps(settings, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:12]


def _corpus(cfg: DefaultModelConfig) -> list[str]:
    """Text the tokenizer is trained on: rendered demonstrations plus digits and common words."""
    make_tasks, demonstration = demo_source(cfg.task, cfg.demo_max_turns)
    rng = random.Random(cfg.seed)
    texts = []
    for task in make_tasks(2000, cfg.seed, "tokenizer"):
        msgs = demonstration(task, rng, 0.5)
        texts.append("".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in msgs))
    texts += [f"What is {a} + {b}? {a + b}" for a in range(30) for b in range(30)]
    texts += ["Reply with one number. Higher. Lower. Correct. The answer is"] * 50
    return texts


def build_tokenizer(cfg: DefaultModelConfig, out: Path):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    if cfg.split_digits:
        tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), tok.pre_tokenizer])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=cfg.vocab_size, special_tokens=SPECIAL_TOKENS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(_corpus(cfg), trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                   bos_token=None, unk_token=None, additional_special_tokens=SPECIAL_TOKENS[1:])
    fast.chat_template = CHAT_TEMPLATE
    fast.model_max_length = cfg.max_position_embeddings
    fast.save_pretrained(out)
    return fast


def build_model(cfg: DefaultModelConfig, tokenizer, out: Path):
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(cfg.seed)
    mcfg = Qwen2Config(
        vocab_size=len(tokenizer), hidden_size=cfg.hidden_size, intermediate_size=cfg.intermediate_size,
        num_hidden_layers=cfg.num_layers, num_attention_heads=cfg.hidden_size // 64,
        num_key_value_heads=cfg.hidden_size // 64, head_dim=64,
        max_position_embeddings=cfg.max_position_embeddings, tie_word_embeddings=True,
        bos_token_id=None, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
        torch_dtype="float32",
    )
    model = Qwen2ForCausalLM(mcfg)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    return model


def demonstration_samples(cfg: DefaultModelConfig, fmt: ChatFormat) -> list:
    """`cfg.sft_demos` imperfect demonstrations of `cfg.task` as token samples, tokenised as rollouts are."""
    from agentrl.data.samples import Sample

    make_tasks, demonstration = demo_source(cfg.task, cfg.demo_max_turns)
    turns = {} if cfg.demo_max_turns is None else {"max_turns": cfg.demo_max_turns}
    prob = optimal_prob(cfg.task, cfg.demo_optimal_prob)
    rng = random.Random(cfg.seed)
    samples = []
    for i, task in enumerate(make_tasks(cfg.sft_demos, cfg.seed, "demo")):
        tokens, mask = ledger_from_messages(fmt, demonstration(task, rng, prob, **turns))
        samples.append(Sample(tokens, mask, f"demonstration {i}"))
    return samples


def warm_start_config(cfg: DefaultModelConfig, out: Path) -> StageConfig:
    """The SFT stage of the warm start: `sft_steps` steps of `sft_batch_size` demonstrations, 10 % linear
    warmup to `sft_lr`, then cosine decay to 0."""
    epochs = max(1, math.ceil(cfg.sft_steps * cfg.sft_batch_size / cfg.sft_demos))
    return StageConfig.model_validate({
        "optim": {"lr": cfg.sft_lr, "warmup_steps": cfg.sft_steps // 10, "scheduler": "cosine", "min_lr_ratio": 0.0,
                  "batch_size": cfg.sft_batch_size, "micro_batch_size": cfg.sft_batch_size, "epochs": epochs,
                  "max_steps": cfg.sft_steps},
        "data": {"eval_fraction": 0.0},
        "train": {"out_dir": str(out), "seed": cfg.seed},
    })


def warm_start(init: Path, out: Path, tokenizer, cfg: DefaultModelConfig) -> None:
    """Supervised warm start of the model in `init` on the demonstrations, through the SFT stage
    (`agentrl.learner.stage`, the loop `python -m agentrl.sft` runs); saved to `out`.

    Torch threads are capped at the usable cores meanwhile: more OpenMP threads than cores spin
    against each other and slowed this step 25x under contention. One thread is no cure: on an idle
    2-core machine the main job's 300 steps took 127 s on one thread against 63 s on two, while on 2
    cores shared with other runs two threads took 4.0-4.7 s a step where one took 0.6-1.4 s."""
    import torch

    from agentrl.learner.dist import usable_cores
    from agentrl.learner.stage import run_stage
    from agentrl.learner.stages import SFTKind

    samples = demonstration_samples(cfg, ChatFormat(tokenizer))
    threads = torch.get_num_threads()
    torch.set_num_threads(max(1, min(threads, usable_cores())))
    try:
        run_stage(SFTKind(tokenizer.pad_token_id), warm_start_config(cfg, out), str(init), samples, [], tokenizer)
    finally:
        torch.set_num_threads(threads)


def _cached(cfg: DefaultModelConfig) -> Path:
    return (Path(cfg.cache_dir) if cfg.cache_dir else cache_root()) / f"default-model-{_key(cfg)}"


def ensure_default_tokenizer(cfg: DefaultModelConfig) -> Path:
    """A folder with the default model's tokenizer, for what needs no weights (a scripted dry run): the
    model's own folder when it is built, else its tokenizer alone, built in seconds and cached."""
    out = _cached(cfg)
    if (out / "config.json").exists() and (out / "DONE").exists():
        return out
    out = out.with_name(out.name.replace("default-model-", "default-tokenizer-"))
    if (out / "DONE").exists():
        return out
    try_teacher(cfg.task, cfg.seed, optimal_prob(cfg.task, cfg.demo_optimal_prob), cfg.demo_max_turns)
    tmp = build_folder(out)
    build_tokenizer(cfg, tmp)
    (tmp / "DONE").write_text("ok\n")
    return publish_folder(tmp, out, "DONE")


def ensure_default_model(cfg: DefaultModelConfig) -> Path:
    """Return the folder of the warm-started default model, building it on first use."""
    out = _cached(cfg)
    if (out / "config.json").exists() and (out / "DONE").exists():
        log.info("using cached default model %s", out)
        return out
    try_teacher(cfg.task, cfg.seed, optimal_prob(cfg.task, cfg.demo_optimal_prob), cfg.demo_max_turns)
    log.info("building the embedded default model in %s: a tokenizer, then %d warm-start steps of %d "
             "demonstrations of %s (a minute or two on 2 cores; cached for the next run with these settings "
             "and this teacher code)", out, cfg.sft_steps, cfg.sft_batch_size, cfg.task)
    # Built in a folder of this process's own and renamed into place: two runs (or test workers) that
    # start on the same empty cache build side by side, and neither reads the other's half-written files.
    tmp = build_folder(out)
    tokenizer = build_tokenizer(cfg, tmp)
    model = build_model(cfg, tokenizer, tmp)
    if cfg.sft_steps == 0:  # an untrained model
        model.save_pretrained(tmp, safe_serialization=True)
    else:
        init = tmp / "init"
        model.save_pretrained(init, safe_serialization=True)
        tokenizer.save_pretrained(init)
        warm_start(init, tmp, tokenizer, cfg)
        shutil.rmtree(init)
    tokenizer.save_pretrained(tmp)
    (tmp / "DONE").write_text("ok\n")
    return publish_folder(tmp, out, "DONE")
