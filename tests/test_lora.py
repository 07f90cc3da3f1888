"""LoRA via peft: the merged full weights, loaded into a fresh base model, reproduce the adapted model's
logits (and the critic's values); the merge is W + (alpha / r) * B @ A by hand; the live adapter is left
untouched; only LoRA weights (and the critic's value head) train."""

from __future__ import annotations

import pytest
import torch

from agentrl.learner.models import ValueModel
from agentrl.learner.lora import apply_lora, merged_state_dict

RANK, ALPHA = 4, 8.0
IDS = torch.tensor([[5, 17, 42, 8, 99, 3], [1, 2, 3, 4, 5, 6]])


def save_tiny(path, tie: bool):
    from transformers import AutoModelForCausalLM, Qwen2Config

    cfg = Qwen2Config(hidden_size=64, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=2,
                      head_dim=32, intermediate_size=128, vocab_size=100, tie_word_embeddings=tie, pad_token_id=0)
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(cfg).save_pretrained(path)
    return path


def perturb_adapters(peft_model, seed: int = 0) -> None:
    """B starts at zero (the adapted model equals the base); random B and A make the merge visible."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in peft_model.named_parameters():
            if "lora_" in name or "modules_to_save" in name:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.1)


def trainable(peft_model) -> list[str]:
    return [n for n, p in peft_model.named_parameters() if p.requires_grad]


@pytest.mark.parametrize("tie,targets", [(True, "all-linear"),
                                         (False, ["q_proj", "v_proj", "down_proj", "embed_tokens", "lm_head"])])
def test_merged_weights_reproduce_the_adapted_logits(tmp_path, tie, targets):
    from transformers import AutoModelForCausalLM

    path = save_tiny(tmp_path / "base", tie)
    base_keys = set(AutoModelForCausalLM.from_pretrained(path).state_dict())
    peft_model = apply_lora(AutoModelForCausalLM.from_pretrained(path), RANK, ALPHA, 0.0, targets).eval()
    assert type(peft_model).__name__ == "PeftModelForCausalLM"
    assert trainable(peft_model) and all(".lora_" in n for n in trainable(peft_model))
    perturb_adapters(peft_model)
    adapters = {n: p.detach().clone() for n, p in peft_model.named_parameters()}

    merged = merged_state_dict(peft_model)
    assert set(merged) == base_keys and "lm_head.weight" in merged
    assert all(v.dtype == torch.float32 and v.device.type == "cpu" for v in merged.values())
    fresh = AutoModelForCausalLM.from_pretrained(path).eval()
    fresh.load_state_dict(merged, strict=True)
    with torch.no_grad():
        want = peft_model(input_ids=IDS).logits
        got = fresh(input_ids=IDS).logits
    assert not torch.allclose(want, AutoModelForCausalLM.from_pretrained(path)(input_ids=IDS).logits, atol=1e-3)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-5)
    # the live adapter and base weights are untouched: nothing was merged into the training model
    for n, p in peft_model.named_parameters():
        torch.testing.assert_close(p.detach(), adapters[n], rtol=0, atol=0, msg=n)
    if tie:
        torch.testing.assert_close(merged["lm_head.weight"], merged["model.embed_tokens.weight"], rtol=0, atol=0)
        assert merged["lm_head.weight"].data_ptr() != merged["model.embed_tokens.weight"].data_ptr()


def test_merge_is_w_plus_scaled_b_a_by_hand(tmp_path):
    from transformers import AutoModelForCausalLM

    path = save_tiny(tmp_path / "base", tie=True)
    base_attn = AutoModelForCausalLM.from_pretrained(path).model.layers[1].self_attn
    base_w = base_attn.q_proj.weight.detach()
    peft_model = apply_lora(AutoModelForCausalLM.from_pretrained(path), RANK, ALPHA, 0.1, ["q_proj"])
    perturb_adapters(peft_model, seed=5)
    q = peft_model.base_model.model.model.layers[1].self_attn.q_proj
    a, b = q.lora_A["default"].weight.detach(), q.lora_B["default"].weight.detach()
    want = base_w.clone()
    for i in range(want.shape[0]):  # slow loop: W[i, j] += alpha / r * sum_k B[i, k] A[k, j]
        for j in range(want.shape[1]):
            want[i, j] += ALPHA / RANK * sum(float(b[i, k]) * float(a[k, j]) for k in range(RANK))
    merged = merged_state_dict(peft_model)
    torch.testing.assert_close(merged["model.layers.1.self_attn.q_proj.weight"], want, rtol=1e-6, atol=1e-6)
    # untargeted layers pass through unchanged
    torch.testing.assert_close(merged["model.layers.1.self_attn.k_proj.weight"], base_attn.k_proj.weight.detach(),
                               rtol=0, atol=0)


def test_disabled_or_already_merged_adapters(tmp_path):
    from transformers import AutoModelForCausalLM

    path = save_tiny(tmp_path / "base", tie=True)
    base = AutoModelForCausalLM.from_pretrained(path).state_dict()
    peft_model = apply_lora(AutoModelForCausalLM.from_pretrained(path), RANK, ALPHA, 0.0, "all-linear")
    perturb_adapters(peft_model)
    adapted = merged_state_dict(peft_model)
    with peft_model.disable_adapter():  # the model runs the base weights
        disabled = merged_state_dict(peft_model)
    for key, val in base.items():
        torch.testing.assert_close(disabled[key], val, rtol=0, atol=0, msg=key)
    peft_model.merge_adapter()  # deltas now live in the base weights: not added twice
    for key, val in merged_state_dict(peft_model).items():
        torch.testing.assert_close(val, adapted[key], rtol=1e-6, atol=1e-6, msg=key)
    with peft_model.disable_adapter():  # peft unmerges on disable
        for key, val in merged_state_dict(peft_model).items():
            torch.testing.assert_close(val, base[key], rtol=1e-6, atol=1e-6, msg=key)


def test_critic_lora_keeps_the_value_head_trainable(tmp_path):
    path = save_tiny(tmp_path / "base", tie=True)
    critic_keys = set(ValueModel.from_pretrained(path).state_dict())
    peft_model = apply_lora(ValueModel.from_pretrained(path), RANK, ALPHA, 0.0, "all-linear").eval()
    names = trainable(peft_model)
    assert {n for n in names if "value_head" in n} == {
        "base_model.model.value_head.modules_to_save.default.weight",
        "base_model.model.value_head.modules_to_save.default.bias"}
    assert all(".lora_" in n for n in names if "value_head" not in n)
    assert not any("value_head.lora_" in n for n in names)  # the head trains in full, not through LoRA
    perturb_adapters(peft_model, seed=3)

    mask = torch.ones_like(IDS)
    merged = merged_state_dict(peft_model)
    assert set(merged) == critic_keys
    torch.testing.assert_close(merged["value_head.weight"],
                               peft_model.base_model.model.value_head.modules_to_save["default"].weight.detach(),
                               rtol=0, atol=0)
    fresh = ValueModel.from_pretrained(path).eval()
    fresh.load_state_dict(merged, strict=True)
    with torch.no_grad():
        want = peft_model(IDS, mask)
        got = fresh(IDS, mask)
    assert want.abs().max() > 1e-3  # the zero-initialised head was perturbed
    torch.testing.assert_close(got, want, rtol=0, atol=1e-5)

    peft_model.train()
    (peft_model(IDS, mask) ** 2).mean().backward()
    grads = {n for n, p in peft_model.named_parameters() if p.grad is not None}
    assert grads == set(names)
