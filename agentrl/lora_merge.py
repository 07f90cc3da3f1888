"""`python -m agentrl.lora_merge --base DIR --lora DIR --out DIR`: a LoRA adapter folder (peft's
`save_pretrained`) merged into its base model, saved as a plain Hugging Face folder (safetensors) that
vLLM, `rewards.reward_model` or any other loader reads without peft.

The base loads in float32, so the merge W + (alpha / r) * B @ A is not rounded to the base's storage
dtype. It loads as a sequence classifier when the adapter was trained as one (peft task type SEQ_CLS,
e.g. a reward model) or the base already is one; else as a causal LM. A SEQ_CLS adapter on a causal-LM
base carries the trained score head (peft's modules_to_save); the classifier is built with that head's
number of outputs, so the saved weights load. The tokenizer is copied from the adapter folder when it
has one (training may add tokens), else from the base. Nothing is downloaded (local_files_only), and
nothing is unpickled: an adapter_model.bin is read with torch.load(weights_only=True).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from agentrl.config import ConfigError
from agentrl.utils.outputs import apart_error, claim_folder
from agentrl.utils.process_exit import run_and_exit
from agentrl.utils.prog import prog

ADAPTER_CONFIG = "adapter_config.json"
_ADAPTER_WEIGHTS = ("adapter_model.safetensors", "adapter_model.bin")
_HEADS = ("score.weight", "classifier.weight")  # the classification heads peft keeps for SEQ_CLS


def check_folders(base: Path, lora: Path, out: Path) -> None:
    """ConfigError naming the flag at fault, before any model loads."""
    for flag, folder in (("--base", base), ("--lora", lora)):
        if not folder.is_dir():
            raise ConfigError(f"{flag} {folder}: no such folder" if not folder.exists()
                              else f"{flag} {folder} is a file; pass a folder")
    if not (base / "config.json").is_file():
        raise ConfigError(f"--base {base}: the folder has no config.json (not a Hugging Face model folder)")
    if not (lora / ADAPTER_CONFIG).is_file():
        raise ConfigError(f"--lora {lora}: the folder has no {ADAPTER_CONFIG} (not a peft adapter folder)")
    if out.exists() and not out.is_dir():
        raise ConfigError(f"--out {out} is a file; pass a folder")
    if error := apart_error(out, "--out", {"--base": base, "--lora": lora}):  # equal to, inside or holding one
        raise ConfigError(error)


def free_folder(out: Path) -> Path:
    """`out`, or the next free `out-N` when it holds a model or a run already (kept as it is), taken now."""
    folder = claim_folder(out)
    if folder != out:
        print(f"--out {out} already holds a model or a run, which is kept as it is: writing to {folder}",
              file=sys.stderr)
    return folder


def _read_json(path: Path, flag: str) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{flag} {path}: unreadable ({exc})") from None


def is_sequence_classifier(adapter_config: dict, base_config: dict) -> bool:
    """SEQ_CLS adapter, or a base whose architectures name a *ForSequenceClassification class."""
    return (adapter_config.get("task_type") == "SEQ_CLS"
            or any(a.endswith("ForSequenceClassification") for a in base_config.get("architectures") or []))


def saved_head_outputs(lora: Path) -> int | None:
    """Rows of the classification head saved with the adapter (peft's modules_to_save), or None."""
    weights = next((lora / name for name in _ADAPTER_WEIGHTS if (lora / name).is_file()), None)
    if weights is None:
        return None
    if weights.suffix == ".safetensors":
        from safetensors import safe_open

        with safe_open(weights, framework="pt") as f:
            shapes = {key: f.get_slice(key).get_shape() for key in f.keys()}
    else:
        shapes = {key: list(t.shape) for key, t in read_bin_weights(weights).items()}
    return next((shape[0] for key, shape in shapes.items() if key.endswith(_HEADS)), None)


def read_bin_weights(weights: Path) -> dict:
    """An adapter_model.bin (a torch pickle) read with weights_only=True: a planted pickle is refused with
    a ConfigError naming the file, before anything in it runs."""
    import pickle

    import torch

    try:
        loaded = torch.load(weights, map_location="cpu", weights_only=True)
    except (pickle.UnpicklingError, RuntimeError, EOFError) as exc:
        why = next((line.strip() for line in str(exc).splitlines() if "GLOBAL" in line), str(exc).splitlines()[0])
        raise ConfigError(f"--lora {weights}: refused: not a plain tensor file ({why}); save the adapter as "
                          f"adapter_model.safetensors") from None
    if not isinstance(loaded, dict) or not all(isinstance(t, torch.Tensor) for t in loaded.values()):
        raise ConfigError(f"--lora {weights}: not a state dict of tensors")
    return loaded


def load_base(base: Path, lora: Path):
    """The base model, float32, as the class the adapter was trained on (see the module docstring)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification

    adapter_config = _read_json(lora / ADAPTER_CONFIG, "--lora")
    base_config = _read_json(base / "config.json", "--base")
    if not is_sequence_classifier(adapter_config, base_config):
        return AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32, local_files_only=True)
    n_out = saved_head_outputs(lora)  # a causal-LM base would get transformers' default of 2 labels
    extra = {} if n_out is None else {"num_labels": n_out}
    return AutoModelForSequenceClassification.from_pretrained(base, dtype=torch.float32, local_files_only=True,
                                                              **extra)


def has_tokenizer(folder: Path) -> bool:
    return (folder / "tokenizer_config.json").is_file() or (folder / "tokenizer.json").is_file()


def merge(base: str | Path, lora: str | Path, out: str | Path) -> Path:
    """Merge the adapter in `lora` into the model in `base` and save model and tokenizer to `out`.
    Returns `out`. ConfigError for a missing or wrong folder."""
    from peft import PeftModel

    from agentrl.data.chat import load_tokenizer

    base, lora, out = Path(base).expanduser(), Path(lora).expanduser(), Path(out).expanduser()
    check_folders(base, lora, out)
    if not (lora / _ADAPTER_WEIGHTS[0]).is_file() and (lora / _ADAPTER_WEIGHTS[1]).is_file():
        read_bin_weights(lora / _ADAPTER_WEIGHTS[1])  # refused here with its name, not deep inside peft
    peft_model = PeftModel.from_pretrained(load_base(base, lora), lora, is_trainable=False)
    merged = peft_model.merge_and_unload()
    out = free_folder(out)  # taken once there is something to write
    # transformers 5 always writes safetensors (the flag is ignored there; 4.x honours it)
    merged.save_pretrained(out, safe_serialization=True)
    load_tokenizer(lora if has_tokenizer(lora) else base).save_pretrained(out)
    return out


def main(argv: list[str] | None = None) -> int:
    from agentrl.run.startup import input_error

    parser = argparse.ArgumentParser(prog=prog("lora_merge"), description=__doc__.splitlines()[0])
    parser.add_argument("--base", required=True, help="the base model's Hugging Face folder")
    parser.add_argument("--lora", required=True, help="the adapter folder (adapter_config.json + weights)")
    parser.add_argument("--out", required=True, help="where to write the merged model and tokenizer")
    args = parser.parse_args(argv)
    try:
        out = merge(args.base, args.lora, args.out)
    except ConfigError as exc:
        return input_error(exc)
    print(f"merged {args.lora} into {args.base}: {out}")
    return 0


if __name__ == "__main__":
    run_and_exit(main)
