"""ValueModel against the source models' own numbers: the body loaded from a causal LM or a reward-model
folder equals the source's hidden states, a reward-model critic's last value equals the reward model's
score, and a saved critic reloads to the same values."""

from __future__ import annotations

import pytest
import torch

from agentrl.learner.models import VALUE_HEAD_FILE, ValueModel

IDS = torch.tensor([[5, 17, 42, 8, 99, 3], [1, 2, 3, 4, 5, 6]])


def tiny_config(tie: bool = True, num_labels: int | None = None):
    from transformers import Qwen2Config

    cfg = Qwen2Config(hidden_size=64, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=2,
                      head_dim=32, intermediate_size=128, vocab_size=100, tie_word_embeddings=tie, pad_token_id=0)
    if num_labels is not None:
        cfg.num_labels = num_labels  # transformers 5: from_config(cfg, num_labels=1) is a TypeError
    return cfg


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification

    root = tmp_path_factory.mktemp("critic")
    torch.manual_seed(0)
    lm = AutoModelForCausalLM.from_config(tiny_config()).eval()
    rm = AutoModelForSequenceClassification.from_config(tiny_config(num_labels=1)).eval()
    with torch.no_grad():  # a score head far from zero, so copying it is visible
        rm.score.weight.normal_(0.0, 1.0)
    lm.save_pretrained(root / "lm")
    rm.save_pretrained(root / "rm")
    return {"lm": (root / "lm", lm), "rm": (root / "rm", rm), "root": root}


@pytest.mark.parametrize("kind", ["lm", "rm"])
def test_body_equals_the_source_models_body(folders, kind):
    path, src = folders[kind]
    vm = ValueModel.from_pretrained(path).eval()
    src_body = src.model.state_dict()
    body = vm.body.state_dict()
    assert set(body) == set(src_body)
    for key, val in body.items():
        torch.testing.assert_close(val, src_body[key], rtol=0, atol=0, msg=key)
    with torch.no_grad():
        hidden = vm.body(input_ids=IDS).last_hidden_state
        ref = src(input_ids=IDS, output_hidden_states=True).hidden_states[-1]
    torch.testing.assert_close(hidden, ref, rtol=0, atol=1e-6)


def test_causal_lm_init_gives_zero_values(folders):
    vm = ValueModel.from_pretrained(folders["lm"][0])
    values = vm(IDS, torch.ones_like(IDS))
    assert values.dtype == torch.float32
    torch.testing.assert_close(values, torch.zeros(IDS.shape), rtol=0, atol=0)


def test_reward_model_init_copies_the_score_head(folders):
    path, rm = folders["rm"]
    vm = ValueModel.from_pretrained(path).eval()
    torch.testing.assert_close(vm.value_head.weight, rm.score.weight, rtol=0, atol=0)
    assert vm.value_head.bias.item() == 0.0  # Qwen2's score has no bias
    with torch.no_grad():
        values = vm(IDS, torch.ones_like(IDS))
        rm_score = rm(input_ids=IDS).logits[:, 0]  # unpadded rows: the RM pools the last token
        hidden = rm.model(input_ids=IDS).last_hidden_state
    # per-position values: V_t = w . h_t (hand-computed), and the last one is the reward model's score
    torch.testing.assert_close(values, hidden @ rm.score.weight[0], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(values[:, -1], rm_score, rtol=1e-5, atol=1e-5)


def test_right_padding_leaves_real_positions_unchanged(folders):
    vm = ValueModel.from_pretrained(folders["rm"][0]).eval()
    short = IDS[:1, :4]
    padded = torch.cat([short, torch.zeros(1, 2, dtype=torch.long)], dim=1)
    mask = torch.tensor([[1, 1, 1, 1, 0, 0]])
    with torch.no_grad():
        v_short = vm(short, torch.ones_like(short))
        v_padded = vm(padded, mask)
    torch.testing.assert_close(v_padded[:, :4], v_short, rtol=1e-5, atol=1e-5)


def test_save_and_reload_round_trip(folders, tmp_path):
    vm = ValueModel.from_pretrained(folders["lm"][0]).eval()
    with torch.no_grad():
        vm.value_head.weight.normal_()
        vm.value_head.bias.fill_(0.25)
        vm.body.layers[0].mlp.up_proj.weight.add_(0.1)
    vm.save_pretrained(tmp_path / "critic")
    assert (tmp_path / "critic" / VALUE_HEAD_FILE).exists()
    again = ValueModel.from_pretrained(tmp_path / "critic").eval()
    for key, val in vm.state_dict().items():
        torch.testing.assert_close(again.state_dict()[key], val, rtol=0, atol=0, msg=key)
    with torch.no_grad():
        torch.testing.assert_close(again(IDS), vm(IDS), rtol=0, atol=0)


def test_gradient_checkpointing_gives_the_same_gradients(folders):
    def grads(checkpointing: bool) -> dict[str, torch.Tensor]:
        vm = ValueModel.from_pretrained(folders["rm"][0]).train()
        if checkpointing:
            vm.gradient_checkpointing_enable()
            assert vm.body.is_gradient_checkpointing
        (vm(IDS, torch.ones_like(IDS)) ** 2).mean().backward()
        return {n: p.grad.clone() for n, p in vm.named_parameters()}

    plain, ckpt = grads(False), grads(True)
    assert plain["body.layers.0.self_attn.q_proj.weight"].abs().sum() > 0
    for key, val in plain.items():
        torch.testing.assert_close(ckpt[key], val, rtol=1e-5, atol=1e-6, msg=key)
