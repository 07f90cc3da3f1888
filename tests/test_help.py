"""`--help` of the command lines lists every config key with its default and description, generated from
the schema (agentrl.config.help); run as a user runs it, in a subprocess.

The expected keys come from `all_keys` and each key's field is found again by walking `model_fields`,
a route independent of the one the help text takes; each key's line must hold `key = default` followed
by the whole description (wrapped lines joined back), exactly as many times as the key has fields
(`rewards.sources.N.name` once per source type).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from pydantic import BaseModel
from pydantic.fields import FieldInfo

from agentrl.config import SOURCE_TYPES, Config
from agentrl.config.help import WIDTH, default_text, description
from agentrl.config.load import all_keys, nested_model
from agentrl.config.variants import variants
from agentrl.config.stages import STAGES, StageConfig

ROOT = Path(__file__).resolve().parents[1]
HEAVY = ("vllm", "deepspeed", "ray", "transformers")


def _run(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)


_outputs: dict[str, str] = {}


def _help(module: str) -> str:
    """`python -m <module> --help`: exit code 0, its stdout (one run per module for the whole file)."""
    if module not in _outputs:
        proc = _run("-m", module, "--help")
        assert proc.returncode == 0, proc.stderr
        _outputs[module] = proc.stdout
    return _outputs[module]


def _resolve(model: type[BaseModel], key: str) -> list[FieldInfo]:
    """The fields behind a dotted key, walking `model_fields`; `rewards.sources.N.<rest>` is looked up in
    every source type that has it, a key inside a typed sub-config (algo.kl.coef) in every member that
    has it, each member listed once (algo.kl.controller's members under loss and reward: once)."""
    before, sep, rest = key.partition(".N.")
    if sep:
        assert before == "rewards.sources"
        return [f for source in SOURCE_TYPES.values() if rest.split(".")[0] in source.model_fields
                for f in _resolve(source, rest)]
    head, _, tail = key.partition(".")
    field = model.model_fields[head]
    if not tail:
        return [field]
    nested = nested_model(field.annotation)
    if nested is not None:
        return _resolve(nested, tail)
    found: dict[tuple[type, str], FieldInfo] = {}
    for member in variants(field.annotation):
        if tail.split(".")[0] in member.model_fields:
            found.update(_owned(member, tail))
    return list(found.values())


def _owned(model: type[BaseModel], key: str) -> dict[tuple[type, str], FieldInfo]:
    """`_resolve` keyed by (the model that owns the field, its name), so a member reached twice counts once."""
    head, _, tail = key.partition(".")
    if not tail:
        return {(model, head): model.model_fields[head]}
    ann = model.model_fields[head].annotation
    nested = nested_model(ann)
    members = [nested] if nested is not None else [m for m in variants(ann) if tail.split(".")[0] in m.model_fields]
    return {k: v for m in members for k, v in _owned(m, tail).items()}


def _check_every_key(text: str, model: type[BaseModel], keys: list[str]) -> None:
    flat = " ".join(text.split())
    for key in keys:
        fields = _resolve(model, key)
        if nested_model(fields[0].annotation) is not None:
            assert re.search(rf"^\[{re.escape(key)}\] ", text, re.M), f"no section header for {key}"
            continue
        lines = re.findall(rf"^  (?:--\w+, )?{re.escape(key)} = ", text, re.M)
        assert len(lines) == len(fields), f"{key}: {len(lines)} lines for {len(fields)} fields"
        for field in fields:
            expected = f"{key} = {default_text(field)} {description(field)}".strip()
            assert expected in flat, f"{key}: {expected!r} not in the help text"


def _keys_part(text: str, title: str) -> str:
    """The generated key list: from its title to the end."""
    return text[text.index(title):]


def test_train_help_lists_every_key_with_default_and_description():
    text = _help("agentrl.train")
    assert text.startswith("usage: python -m agentrl.train")
    keys = _keys_part(text, "Config keys and their defaults.")
    assert "--config CONFIG" in text[: len(text) - len(keys)]  # argparse's options come first
    assert "dotted.key=value" in keys[: keys.index("\n\n")]  # the title says how to set a key
    _check_every_key(keys, Config, all_keys(Config))
    assert all(len(line) <= WIDTH for line in keys.splitlines())


def test_train_help_hand_picked_lines():
    lines = _help("agentrl.train").splitlines()

    def one(pattern: str) -> str:
        found = [line for line in lines if re.fullmatch(pattern, line)]
        assert len(found) == 1, f"{pattern!r}: {found}"
        return found[0]

    one(r"\[buffer\] Batch assembly and the staleness bound\.")
    one(r"  buffer\.max_staleness = 1 +max learner version minus oldest token version; 0 = on-policy\. A")
    one(r" +version is one optimizer step \(learner\.mini_batches of them a batch\)")
    one(r"  algo\.mode = decoupled +\{decoupled\|bypass\} decoupled: learner recomputes pi_prox; bypass:")
    one(r"  model\.path = unset +Hugging Face model folder, .*")
    one(r'  train\.loggers = \["jsonl"\] +\{jsonl\|tensorboard\|wandb\} metric sinks; .*')
    one(r"  engine\.enforce_eager = true +skip graph capture/compilation \(faster start on CPU\)")
    one(r"  learner\.lr = 0\.0003 +peak learning rate")
    # Reward sources: one block per type, each with the keys of that type only.
    text = "\n".join(lines)
    rule = text[text.index("[rewards.sources.N, type: rule]"):]
    rule = rule[: rule.index("\n\n")]
    assert re.search(r"^  rewards\.sources\.N\.type = rule +rule: a function", rule, re.M)
    assert re.search(r"^  rewards\.sources\.N\.rule = \(required\) +'package\.module:function'", rule, re.M)
    assert re.search(r"^  rewards\.sources\.N\.answer_key = answer ", rule, re.M)
    assert "http.url" not in rule
    assert re.search(r"^  rewards\.sources\.N\.http\.url = \(required\) +Full URL", text, re.M)


@pytest.mark.parametrize("cli", ["eval", "check"])
def test_eval_and_check_help_have_the_same_key_list(cli):
    text = _help(f"agentrl.{cli}")
    assert text.startswith(f"usage: python -m agentrl.{cli}")
    assert _keys_part(text, "Config keys and their defaults.") == _keys_part(_help("agentrl.train"),
                                                                            "Config keys and their defaults.")


@pytest.mark.parametrize("stage", STAGES)
def test_stage_help_lists_the_stage_keys_with_their_flags(stage):
    from agentrl.stage_cli import leaf_path

    text = _help(f"agentrl.{stage}")
    assert text.startswith("The command line of the stages before RL")  # the usage, then the keys
    keys = _keys_part(text, f"Keys of `python -m agentrl.{stage}`")
    others = [s for s in STAGES if s != stage and s in StageConfig.model_fields]
    mine = [k for k in all_keys(StageConfig) if k.split(".")[0] not in others]
    _check_every_key(keys, StageConfig, mine)
    for other in others:  # the loss sections of the other stages are left out
        assert not re.search(rf"^(\[{other}\]|  (--\w+, )?{other}\.)", keys, re.M)
    flags = re.findall(r"^  --(\w+), (\S+) = ", keys, re.M)
    assert len(flags) > 30
    for name, key in flags:  # every flag shown sets the key it stands beside
        assert leaf_path(name, stage) == key
    assert all(len(line) <= WIDTH for line in keys.splitlines())


def test_stage_help_hand_picked_lines():
    sft = _help("agentrl.sft").splitlines()
    dpo = _help("agentrl.dpo").splitlines()

    def one(lines: list[str], pattern: str) -> None:
        assert len([line for line in lines if re.fullmatch(pattern, line)]) == 1, pattern

    one(sft, r"  --max_len, data\.max_len = 2048 +tokens per sample; longer rows are dropped and")
    one(sft, r"  --lora_rank, optim\.lora\.rank = 0 +adapter rank; 0 = LoRA off")
    one(sft, r"  --model, model\.path = unset +Hugging Face model folder, .*")
    one(sft, r"  --dataset, data\.paths = \[\] +training datasets: .*")
    one(sft, r"  --lr, optim\.lr = 1e-05 +peak learning rate")
    one(sft, r"  --seed, train\.seed = 0 +shuffling, the eval split, new heads")  # model.default.seed left the stages
    assert not [line for line in sft if "model.default" in line and "=" in line]
    one(dpo, r"  --beta, dpo\.beta = 0\.1 +strength of the implicit KL constraint")
    one(dpo, r"  --loss, dpo\.loss = sigmoid +\{sigmoid\|ipo\} sigmoid \(DPO\) .*")


def test_help_exits_before_engines_and_learners_are_imported():
    """`--help` answers without importing vLLM, DeepSpeed, Ray or transformers."""
    script = (
        "import sys, contextlib, io\n"
        "from agentrl import train, eval as ev, stage_cli\n"
        "for call in (lambda: train.main(['--help']), lambda: ev.main(['--help'])):\n"
        "    with contextlib.redirect_stdout(io.StringIO()):\n"
        "        try: call()\n"
        "        except SystemExit as e: assert e.code == 0\n"
        "with contextlib.redirect_stdout(io.StringIO()):\n"
        "    assert stage_cli.main('sft', ['--max_len', '8', '--help']) == 0\n"
        f"print(sorted(m for m in {HEAVY!r} if m in sys.modules))\n")
    proc = _run("-c", script)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"
