"""ModelEMA against a hand loop of shadow = decay * shadow + (1 - decay) * param, a save -> reload round
trip through a normal Hugging Face folder, and the same under DeepSpeed ZeRO-3 partitioned parameters."""

from __future__ import annotations

import pytest
import torch

from agentrl.learner.models import ModelEMA

DECAY = 0.9
IDS = torch.tensor([[5, 17, 42, 8, 99, 3]])


def tiny_model(seed: int = 0, tie: bool = True):
    from transformers import AutoModelForCausalLM, Qwen2Config

    cfg = Qwen2Config(hidden_size=64, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=2,
                      head_dim=32, intermediate_size=128, vocab_size=100, tie_word_embeddings=tie, pad_token_id=0)
    torch.manual_seed(seed)
    return AutoModelForCausalLM.from_config(cfg)


def _perturb(model: torch.nn.Module, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * 0.1)


def test_three_updates_match_a_hand_loop():
    model = tiny_model()
    ema = ModelEMA(model, DECAY)
    ref = {n: p.detach().double().clone() for n, p in model.named_parameters()}
    for k in range(3):
        _perturb(model, seed=k)
        ema.update(model)
        for n, p in model.named_parameters():
            ref[n] = DECAY * ref[n] + (1 - DECAY) * p.detach().double()
    shadow = ema.state_dict()
    assert ema.num_updates == 3 and set(shadow) == set(ref)
    assert "lm_head.weight" not in shadow  # tied to model.embed_tokens.weight: named once
    for n, val in ref.items():
        assert shadow[n].dtype == torch.float32 and shadow[n].device.type == "cpu"
        torch.testing.assert_close(shadow[n].double(), val, rtol=1e-6, atol=1e-7, msg=n)
    # the shadow is a copy: it differs from the live weights after perturbations
    assert not torch.equal(shadow["model.norm.weight"], model.model.norm.weight.detach())


def test_decay_edges_and_bf16_module():
    model = tiny_model().to(torch.bfloat16)
    start = {n: p.detach().float().clone() for n, p in model.named_parameters()}
    frozen, follow = ModelEMA(model, 1.0), ModelEMA(model, 0.0)
    _perturb(model, seed=7)
    frozen.update(model)
    follow.update(model)
    for n, p in model.named_parameters():
        assert follow.shadow[n].dtype == torch.float32
        torch.testing.assert_close(frozen.shadow[n], start[n], rtol=0, atol=0)
        torch.testing.assert_close(follow.shadow[n], p.detach().float(), rtol=0, atol=0)
    with pytest.raises(ValueError):
        ModelEMA(model, 1.5)


@pytest.mark.parametrize("tie", [True, False])
def test_save_pretrained_round_trip(tmp_path, tiny_tokenizer, tie):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = tiny_model(tie=tie)
    ema = ModelEMA(model, DECAY)
    for k in range(2):
        _perturb(model, seed=10 + k)
        ema.update(model)
    ema.save_pretrained(model, tmp_path / "ema", tokenizer=tiny_tokenizer)
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path / "ema", dtype=torch.float32).eval()
    loaded_params = dict(loaded.named_parameters())
    assert set(loaded_params) == set(ema.shadow)
    for n, val in ema.shadow.items():
        torch.testing.assert_close(loaded_params[n].detach(), val, rtol=0, atol=0, msg=n)
    head = loaded.lm_head.weight.detach()
    torch.testing.assert_close(head, ema.shadow["model.embed_tokens.weight" if tie else "lm_head.weight"],
                               rtol=0, atol=0)
    assert AutoTokenizer.from_pretrained(tmp_path / "ema").vocab_size == tiny_tokenizer.vocab_size


def test_zero3_partitioned_parameters(tmp_path):
    import deepspeed
    from transformers import AutoModelForCausalLM

    from agentrl.learner.dist import init_single_process_dist

    init_single_process_dist()
    model = tiny_model(seed=3)
    start = {n: p.detach().clone() for n, p in model.named_parameters()}
    config = {"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 1,
              "zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 0},
              "steps_per_print": 10**9}
    engine, *_ = deepspeed.initialize(model=model, optimizer=torch.optim.AdamW(model.parameters(), lr=1e-2),
                                      config=config)
    module = engine.module
    assert module.model.norm.weight.numel() == 0  # partitioned: the data lives in the ZeRO-3 shards
    ema = ModelEMA(module, 0.5, zero3=True)
    for n, val in start.items():
        torch.testing.assert_close(ema.shadow[n], val, rtol=0, atol=0, msg=n)
    engine.backward(engine(input_ids=IDS, labels=IDS).loss)
    engine.step()
    ema.update(module)
    with deepspeed.zero.GatheredParameters(list(module.parameters())):
        after = {n: p.detach().clone() for n, p in module.named_parameters()}
    assert not torch.equal(after["model.norm.weight"], start["model.norm.weight"])
    for n, val in start.items():
        torch.testing.assert_close(ema.shadow[n], 0.5 * val + 0.5 * after[n], rtol=1e-6, atol=1e-7, msg=n)
    ema.save_pretrained(module, tmp_path / "ema3")
    loaded = dict(AutoModelForCausalLM.from_pretrained(tmp_path / "ema3", dtype=torch.float32).named_parameters())
    for n, val in ema.shadow.items():
        torch.testing.assert_close(loaded[n].detach(), val, rtol=0, atol=0, msg=n)
