"""The command line of the stages before RL: `python -m agentrl.sft | rm | prm | dpo | kto`.

    python -m agentrl.sft --config sft.yaml [dotted.key=value ...] [--leaf_name value ...]

The config tree is `agentrl.config.stages.StageConfig`. Besides dotted overrides, every leaf key can
be given by its bare name, as OpenRLHF's flags are (`--input_key question --max_len 1024
--zero_stage 3 --apply_chat_template --lora_rank 8`); a flag without a value sets a boolean. A leaf
name found in several sections goes to this stage's own section (`--beta` is `dpo.beta` under dpo),
and `lora_*` names go to `optim.lora`. Shortcuts: `--model DIR` (model.path), `--dataset
a.jsonl,b.parquet` (data.paths), `--eval_dataset F` (data.eval_path), `--out DIR` (train.out_dir).
A wrong key or a bad data row is one line on stderr and exit code 2, before any training.
`--help` lists every key of the stage with its flag, default and description (`stage_help`).
"""

from __future__ import annotations

import difflib
import json
import logging
import os
import sys
from pathlib import Path
from typing import Any

from agentrl.config import ConfigError, load_config
from agentrl.config.help import keys_help
from agentrl.config.load import all_keys
from agentrl.config.stages import STAGES, StageConfig
from agentrl.utils.prog import prog

log = logging.getLogger("agentrl")

SHORTCUTS = {"model": "model.path", "dataset": "data.paths", "eval_dataset": "data.eval_path",
             "out": "train.out_dir", "pretrain": "model.path", "save_path": "train.out_dir"}


def leaf_path(name: str, stage: str) -> str:
    """The dotted key a bare flag name stands for."""
    if name in SHORTCUTS:
        return SHORTCUTS[name]
    if "." in name:
        return name
    keys = all_keys(StageConfig)
    if name.startswith("lora_") and f"optim.lora.{name[5:]}" in keys:
        return f"optim.lora.{name[5:]}"
    found = [k for k in keys if k.rsplit(".", 1)[-1] == name]
    if len(found) > 1:
        found = [k for k in found if k.startswith(stage + ".")] or found
    if len(found) == 1:
        return found[0]
    if found:
        raise ConfigError(f"--{name} is ambiguous: use one of {', '.join('--' + k for k in found)}")
    leaves = sorted({k.rsplit(".", 1)[-1] for k in keys} | set(SHORTCUTS))
    guess = difflib.get_close_matches(name, leaves, n=1, cutoff=0.6)
    raise ConfigError(f"unknown option --{name}" + (f"; did you mean --{guess[0]}?" if guess else ""))


def flag_of(key: str, stage: str) -> str | None:
    """The bare flag that sets `key` under this stage (`--max_len` for data.max_len, `--lora_rank`,
    `--model`), or None when every bare name of it is ambiguous here."""
    leaf = key.rsplit(".", 1)[-1]
    names = [name for name, dotted in SHORTCUTS.items() if dotted == key]
    names += [f"lora_{leaf}"] if key.startswith("optim.lora.") else []
    for name in [*names, leaf]:
        try:
            if leaf_path(name, stage) == key:
                return "--" + name
        except ConfigError:  # a leaf name shared by sections none of which is this stage's
            continue
    return None


def stage_help(stage: str) -> str:
    """The usage above, then every key of this stage with its flag, default and description; the loss
    sections of the other stages (`dpo.*` under sft) are left out."""
    title = (f"Keys of `{prog(stage)}` and their defaults. Set them in the YAML file given to "
             "--config, as dotted.key=value arguments, or by the bare flag shown before a key "
             "(--max_len 1024, --lora_rank 8; a flag without a value sets a boolean).")
    others = [name for name in STAGES if name != stage and name in StageConfig.model_fields]
    return __doc__.rstrip() + "\n\n" + keys_help(StageConfig, title, lambda key: flag_of(key, stage), others)


def overrides_from(argv: list[str], stage: str) -> tuple[str | None, list[str]]:
    """(config file, dotted overrides) from the command line."""
    config, out = None, []
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg == "--config":
            if i + 1 == len(argv):
                raise ConfigError("--config needs a file")
            config, i = argv[i + 1], i + 2
            continue
        if arg.startswith("--"):
            name, eq, value = arg[2:].partition("=")
            key = leaf_path(name.replace("-", "_"), stage)
            if not eq:
                if i + 1 < len(argv) and not argv[i + 1].startswith("--") and "=" not in argv[i + 1]:
                    value, i = argv[i + 1], i + 1
                else:
                    value = "true"
            if key == "data.paths" and not value.startswith("["):
                value = json.dumps(value.split(","))
            out.append(f"{key}={value}")
        elif "=" in arg:
            out.append(arg)
        else:
            raise ConfigError(f"unexpected argument {arg!r}: use --name value or dotted.key=value")
        i += 1
    return config, out


def make_kind(stage: str, cfg: StageConfig, fmt):
    """The stage kind and the samples it trains on."""
    from agentrl.data.examples import build_kto, build_pairs, build_sft
    from agentrl.data.steps import build_prm, reward_token_ids
    from agentrl.learner.stages import DPOKind, KTOKind, PRMKind, RewardKind, SFTKind

    pad = fmt.tokenizer.pad_token_id if fmt.tokenizer.pad_token_id is not None else fmt.eos_id
    zero3 = cfg.optim.zero_stage == 3
    seed = cfg.train.seed
    if stage == "sft":
        return SFTKind(pad, cfg.data.packing, cfg.data.max_len, zero3), build_sft(cfg.data, fmt, seed)
    packing = {"packing": cfg.data.packing, "max_len": cfg.data.max_len}
    if stage == "rm":
        after_eos = fmt.encode(fmt.after_eos) if fmt.after_eos else []
        return RewardKind(pad, fmt.eos_id, after_eos, zero3, **packing), build_pairs(cfg.data, fmt, seed)
    if stage == "prm":
        return (PRMKind(pad, reward_token_ids(cfg.prm, fmt), zero3, **packing),
                build_prm(cfg.data, cfg.prm, fmt, seed))
    if stage == "dpo":
        return DPOKind(pad, cfg.dpo.model_dump(), zero3, **packing), build_pairs(cfg.data, fmt, seed)
    if stage == "kto":
        return KTOKind(pad, cfg.kto.model_dump(), zero3, **packing), build_kto(cfg.data, fmt, seed)
    raise ValueError(f"unknown stage {stage!r}")


def run(stage: str, cfg: StageConfig, show: bool = True) -> dict[str, Any]:
    """Run one stage from a validated config; returns its summary (also written to out_dir/summary.json)."""
    from agentrl.data.chat import ChatFormat, load_tokenizer
    from agentrl.learner.stage import run_stage
    from agentrl.config import DefaultModelConfig
    from agentrl.models.named import resolve_path
    from agentrl.run.startup import check_model
    from agentrl.utils.outputs import apart_error

    check_model(cfg.model)
    if not cfg.data.paths:
        raise ConfigError("data.paths is empty: give at least one dataset (--dataset FILE)")
    model_path = resolve_path(cfg.model.path, DefaultModelConfig())  # unset: the default model, as built by default
    if error := apart_error(cfg.train.out_dir, "train.out_dir", {"model.path": model_path}):
        raise ConfigError(error)  # before anything loads
    tokenizer = load_tokenizer(model_path)
    try:
        fmt = ChatFormat(tokenizer)
    except ValueError as exc:
        raise ConfigError(f"model.path: {exc}") from None
    kind, built = make_kind(stage, cfg, fmt)
    stats = {"rows": built.rows, "train": len(built.train), "eval": len(built.eval), "dropped": built.dropped}
    log.info("%s: %d training and %d held-out samples from %s; dropped %s", stage, len(built.train),
             len(built.eval), cfg.data.paths, built.dropped or "none")
    cfg.train.out_dir = str(output_folder(cfg.train.out_dir))
    return run_stage(kind, cfg, model_path, built.train, built.eval, tokenizer, stats, show)


def output_folder(out_dir: str) -> Path:
    """The folder a stage writes (its input model's was refused before): never one that holds a run or a
    model already, which gets the next free `<out_dir>-N` instead (agentrl.utils.outputs). Rank 0 takes
    it; under torchrun the other ranks write nothing there."""
    from agentrl.utils.outputs import claim_folder, run_files

    if int(os.environ.get("RANK", "0")) != 0:
        return Path(out_dir)
    folder = claim_folder(out_dir)
    if folder != Path(out_dir).expanduser():
        held = ", ".join(f for f in run_files(out_dir) if not f.startswith("."))
        log.warning("train.out_dir=%s already holds a run or a model (%s), which is kept as it is: this stage "
                    "writes to %s", out_dir, held, folder)
    return folder


def main(stage: str, argv: list[str] | None = None) -> int:
    from agentrl.telemetry.metrics import setup_logging
    from agentrl.run.startup import input_error

    argv = sys.argv[1:] if argv is None else argv
    if "-h" in argv or "--help" in argv:
        print(stage_help(stage), end="")
        return 0
    setup_logging()
    try:
        config, overrides = overrides_from(argv, stage)
        cfg = load_config(config, overrides, StageConfig)
        summary = run(stage, cfg)
    except ConfigError as exc:
        return input_error(exc)
    last = summary["evals"][-1] if summary["evals"] else summary["final_train"]
    print(json.dumps({"stage": stage, "steps": summary["steps"], "saved": summary["saved"], **last}))
    return 0

