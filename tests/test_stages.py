"""The stage loop (agentrl.learner.stage) under every stage kind, on a real DeepSpeed engine.

* packing: a packed SFT batch gives the per-token losses, the loss and the updated weights of the
  unpacked one;
* the preference losses start where the formulas say (policy == reference before the first step);
* ZeRO-3 and LoRA each run through every stage via `agentrl.stage_cli.run`, and what is saved loads
  (LoRA adapters through `python -m agentrl.lora_merge`).
"""

from __future__ import annotations

import json
import math
import random

import pytest
import torch

from agentrl.config import load_config
from agentrl.config.stages import STAGES, StageConfig
from envs.guess_number import demo_tasks, demonstration, preference_pairs


def _steps_ok(messages) -> list[bool]:
    """Per assistant turn: is the guess still consistent with the earlier replies?"""
    lo, hi, out, last = 1, 15, [], None
    for m in messages:
        if m["role"] == "assistant":
            last = int(m["content"])
            out.append(lo <= last <= hi)
        elif m["content"] == "Higher.":
            lo = max(lo, last + 1)
        elif m["content"] == "Lower.":
            hi = min(hi, last - 1)
    return out


@pytest.fixture(scope="module")
def datasets(tmp_path_factory) -> dict[str, str]:
    root = tmp_path_factory.mktemp("stage-data")
    rng = random.Random(0)
    demos = [demonstration(t, rng, 0.3) for t in demo_tasks(48, 0, "demo")]
    pairs = preference_pairs(24, seed=0)
    rows = {
        "sft": [{"messages": m} for m in demos],
        "rm": [{"chosen": c, "rejected": r} for c, r in pairs],
        "dpo": [{"chosen": c, "rejected": r} for c, r in pairs],
        "kto": [{"messages": m, "label": good} for c, r in pairs for m, good in ((c, True), (r, False))],
        "prm": [{"messages": m, "label": _steps_ok(m)} for m in demos],
    }
    out = {}
    for stage, data in rows.items():
        path = root / f"{stage}.jsonl"
        path.write_text("".join(json.dumps(r) + "\n" for r in data))
        out[stage] = str(path)
    return out


def _config(stage: str, model: str, data: str, out, *extra: str) -> StageConfig:
    keys = [] if stage in ("rm", "dpo") else ["data.messages_key=messages"]
    return load_config(None, [f"model.path={model}", f"data.paths=[{data}]", f"train.out_dir={out}",
                              "optim.batch_size=4", "optim.micro_batch_size=2", "optim.max_steps=2",
                              "optim.lr=1e-3", "data.eval_fraction=0.2", *keys, *extra], StageConfig)


def test_packed_sft_batch_equals_the_unpacked_one(tiny_model, datasets, tmp_path):
    from agentrl.data.chat import ChatFormat, load_tokenizer
    from agentrl.data.examples import build_sft
    from agentrl.learner.stage import run_stage
    from agentrl.learner.stages import SFTKind
    from safetensors.torch import load_file

    tokenizer = load_tokenizer(tiny_model)
    cfg = _config("sft", tiny_model, datasets["sft"], tmp_path, "data.eval_fraction=0",
                  "optim.batch_size=16", "optim.micro_batch_size=4", "optim.max_steps=1")
    samples = build_sft(cfg.data, ChatFormat(tokenizer), 0).train
    packed_kind = SFTKind(tokenizer.pad_token_id, packing=True, max_len=256)
    rows = [r for micro in packed_kind.micro_batches(samples[:16], 4) for r in micro]
    assert sum(len(r) for r in rows) == 16 and len(rows) <= 8  # really packed: several samples a row
    assert all(sum(len(s.tokens) for s in r) <= 256 for r in rows)
    runs = {}
    for name, kind in (("unpacked", SFTKind(tokenizer.pad_token_id)), ("packed", packed_kind)):
        cfg.train.out_dir = str(tmp_path / name)
        summary = run_stage(kind, cfg, tiny_model, samples, [], tokenizer, show=False)
        runs[name] = (summary["final_train"]["train/loss"], load_file(tmp_path / name / "model.safetensors"))
    (loss_u, w_u), (loss_p, w_p) = runs["unpacked"], runs["packed"]
    assert abs(loss_u - loss_p) < 1e-5, (loss_u, loss_p)
    assert max(float((w_u[k] - w_p[k]).abs().max()) for k in w_u) < 1e-5  # the same update


def test_preference_losses_start_at_the_formulas_value(tiny_model, datasets, tmp_path):
    from agentrl.stage_cli import run

    # Before the first step the policy is the reference: every implicit reward is 0.
    dpo = run("dpo", _config("dpo", tiny_model, datasets["dpo"], tmp_path / "dpo", "dpo.beta=0.1"), show=False)
    assert dpo["evals"][0]["eval/loss"] == pytest.approx(math.log(2), abs=1e-5)  # -log sigmoid(0)
    assert dpo["evals"][0]["eval/reward_margin"] == pytest.approx(0.0, abs=1e-5)
    ipo = run("dpo", _config("dpo", tiny_model, datasets["dpo"], tmp_path / "ipo", "dpo.loss=ipo", "dpo.beta=0.5"),
              show=False)
    assert ipo["evals"][0]["eval/loss"] == pytest.approx(1.0, abs=1e-4)  # (0 - 1 / (2 * 0.5))^2
    kto = run("kto", _config("kto", tiny_model, datasets["kto"], tmp_path / "kto", "kto.desirable_weight=2.0"),
              show=False)
    share = kto["evals"][0]["eval/desirable_frac"]
    # 1 - sigmoid(0) = 0.5 per example, times its weight (2 for desirable rows, 1 for the others)
    assert kto["evals"][0]["eval/loss"] == pytest.approx(0.5 * (2 * share + (1 - share)), abs=1e-5)
    for summary in (dpo, ipo, kto):
        assert summary["steps"] == 2 and summary["evals"][-1]["eval/loss"] != summary["evals"][0]["eval/loss"]


def _loads(stage: str, folder) -> None:
    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification

    cls = AutoModelForSequenceClassification if stage == "rm" else AutoModelForCausalLM
    model = cls.from_pretrained(folder, dtype=torch.float32)
    assert (stage == "rm") == hasattr(model, "score")


@pytest.mark.parametrize("stage", STAGES)
@pytest.mark.parametrize("variant", ["zero3", "lora"])
def test_every_stage_runs_under_zero3_and_lora(stage, variant, tiny_model, datasets, tmp_path):
    from safetensors.torch import load_file

    from agentrl.lora_merge import merge
    from agentrl.stage_cli import run

    extra = ["optim.zero_stage=3"] if variant == "zero3" else ["optim.lora.rank=4", "optim.lora.alpha=8"]
    if stage == "sft":
        extra.append("data.packing=true")
    summary = run(stage, _config(stage, tiny_model, datasets[stage], tmp_path / "out", *extra), show=False)
    assert summary["steps"] == 2 and len(summary["evals"]) == 2
    assert all(math.isfinite(e["eval/loss"]) for e in summary["evals"])
    assert math.isfinite(summary["final_train"]["train/loss"])
    assert len((tmp_path / "out" / "metrics.jsonl").read_text().splitlines()) == 2
    if variant == "lora":
        adapter = load_file(tmp_path / "out" / "adapter_model.safetensors")
        assert any("lora_B" in k and float(v.abs().max()) > 0 for k, v in adapter.items())  # adapters trained
        _loads(stage, merge(tiny_model, tmp_path / "out", tmp_path / "merged"))
    else:
        _loads(stage, tmp_path / "out")
        before, after = load_file(f"{tiny_model}/model.safetensors"), load_file(tmp_path / "out" / "model.safetensors")
        key = "model.layers.0.self_attn.q_proj.weight"
        assert after[key].shape == before[key].shape and not torch.equal(after[key], before[key])


def test_sft_runs_with_bf16_gradient_checkpointing_and_optimizer_offload(tiny_model, datasets, tmp_path):
    from agentrl.stage_cli import run

    summary = run("sft", _config("sft", tiny_model, datasets["sft"], tmp_path, "optim.dtype=bfloat16",
                                 "optim.gradient_checkpointing=true", "optim.zero_stage=2",
                                 "optim.offload_optimizer=true", "optim.warmup_steps=1", "optim.max_steps=3"),
                  show=False)
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    # One warmup step, then cosine from the peak to min_lr_ratio (0.1) at the end: 1, 1, 0.1 + 0.9 * 0.5
    assert [r["lr"] for r in records] == pytest.approx([1e-3, 1e-3, 0.55e-3])
    assert summary["evals"][-1]["eval/loss"] < summary["evals"][0]["eval/loss"] + 0.5
    assert all(math.isfinite(r["train/loss"]) for r in records)
