"""`python -m agentrl.lora_merge`: the merged folder, loaded by plain transformers, reproduces the PEFT
model's logits (a causal LM; a sequence classifier on a classifier base and on a causal-LM base); the
tokenizer comes from the adapter folder when it has one; a wrong folder is one line and exit code 2."""

from __future__ import annotations

import json
import sys

import pytest
import torch

from agentrl.learner.lora import apply_lora
from agentrl.lora_merge import main, saved_head_outputs
import warm_python

RANK, ALPHA = 4, 8.0
IDS = torch.tensor([[5, 17, 42, 8, 99, 3], [11, 12, 13, 14, 15, 16]])


def tiny_config(tokenizer, **kw):
    from transformers import Qwen2Config

    return Qwen2Config(hidden_size=64, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=2,
                       head_dim=32, intermediate_size=128, vocab_size=len(tokenizer), tie_word_embeddings=True,
                       pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id, **kw)


def save_base(path, tokenizer, classifier: bool = False):
    """A tiny Qwen2 (causal LM, or a one-output sequence classifier) with the default model's tokenizer."""
    from transformers import Qwen2ForCausalLM, Qwen2ForSequenceClassification

    torch.manual_seed(0)
    if classifier:
        Qwen2ForSequenceClassification(tiny_config(tokenizer, num_labels=1)).save_pretrained(path)
    else:
        Qwen2ForCausalLM(tiny_config(tokenizer)).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def perturb(peft_model, seed: int = 0) -> None:
    """B starts at zero (the adapted model equals the base): random B (and head copy) make the merge visible."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in peft_model.named_parameters():
            if "lora_B" in name or "modules_to_save" in name:
                p.copy_(torch.randn(p.shape, generator=gen) * 0.1)


def run_cli(base, lora, out) -> int:
    return main(["--base", str(base), "--lora", str(lora), "--out", str(out)])


def test_causal_lm_merge_reproduces_the_peft_logits(tmp_path, tiny_tokenizer):
    from transformers import AutoModelForCausalLM

    from agentrl.data.chat import load_tokenizer

    base = save_base(tmp_path / "base", tiny_tokenizer)
    peft_model = apply_lora(AutoModelForCausalLM.from_pretrained(base), RANK, ALPHA).eval()
    perturb(peft_model)
    peft_model.save_pretrained(tmp_path / "lora")
    with torch.no_grad():
        want = peft_model(input_ids=IDS).logits
        plain = AutoModelForCausalLM.from_pretrained(base).eval()(input_ids=IDS).logits

    assert run_cli(base, tmp_path / "lora", tmp_path / "out") == 0
    assert (tmp_path / "out" / "model.safetensors").is_file()
    assert not (tmp_path / "out" / "adapter_config.json").exists()
    merged = AutoModelForCausalLM.from_pretrained(tmp_path / "out").eval()
    assert not any("lora" in name for name in merged.state_dict())
    assert merged.dtype == torch.float32
    with torch.no_grad():
        got = merged(input_ids=IDS).logits
    assert (want - plain).abs().max() > 1e-2  # the adapter changes the logits, so the check below means something
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    # no tokenizer in the adapter folder: the base's, unchanged
    text = "What is 437 * 89?"
    assert load_tokenizer(tmp_path / "out")(text)["input_ids"] == tiny_tokenizer(text)["input_ids"]


@pytest.mark.parametrize("base_kind", ["classifier", "causal_lm"])
def test_sequence_classifier_merge_reproduces_the_peft_scores(tmp_path, tiny_tokenizer, base_kind):
    """A reward model: SEQ_CLS LoRA with the score head trained in full (peft's modules_to_save). On a
    causal-LM base the classifier is built as reward training builds it (num_labels=1)."""
    from peft import LoraConfig, TaskType, get_peft_model
    from transformers import AutoModelForSequenceClassification

    from agentrl.data.chat import load_tokenizer

    base = save_base(tmp_path / "base", tiny_tokenizer, classifier=base_kind == "classifier")
    model = AutoModelForSequenceClassification.from_pretrained(base, num_labels=1)
    config = LoraConfig(r=RANK, lora_alpha=ALPHA, target_modules=["q_proj", "v_proj", "down_proj"],
                        task_type=TaskType.SEQ_CLS)
    peft_model = get_peft_model(model, config).eval()
    assert any("score" in n and "modules_to_save" in n for n, _ in peft_model.named_parameters())
    perturb(peft_model)
    peft_model.save_pretrained(tmp_path / "lora")
    # the head's one output is read from the adapter: a causal-LM base would otherwise get 2 labels and
    # the saved (1, hidden) head would not load
    assert saved_head_outputs(tmp_path / "lora") == 1
    tokenizer = load_tokenizer(base)
    tokenizer.add_special_tokens({"additional_special_tokens": ["<|extra|>"]})
    tokenizer.save_pretrained(tmp_path / "lora")  # the adapter folder's tokenizer wins over the base's
    with torch.no_grad():
        want = peft_model(input_ids=IDS).logits
    assert want.shape == (2, 1)

    assert run_cli(base, tmp_path / "lora", tmp_path / "out") == 0
    merged = AutoModelForSequenceClassification.from_pretrained(tmp_path / "out").eval()
    assert merged.config.num_labels == 1 and type(merged).__name__ == "Qwen2ForSequenceClassification"
    with torch.no_grad():
        got = merged(input_ids=IDS).logits
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    assert "<|extra|>" in load_tokenizer(tmp_path / "out").get_vocab()


def test_missing_adapter_config_is_one_line_and_exit_code_2(tmp_path, tiny_tokenizer):
    base = save_base(tmp_path / "base", tiny_tokenizer)
    (tmp_path / "lora").mkdir()
    proc = warm_python.run([sys.executable, "-m", "agentrl.lora_merge", "--base", str(base),
                           "--lora", str(tmp_path / "lora"), "--out", str(tmp_path / "out")],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip() == f"config error: --lora {tmp_path / 'lora'}: the folder has no " \
                                  "adapter_config.json (not a peft adapter folder)"
    assert not (tmp_path / "out").exists()


def test_wrong_folders(tmp_path, tiny_tokenizer, capsys):
    base = save_base(tmp_path / "base", tiny_tokenizer)
    lora = tmp_path / "lora"
    lora.mkdir()
    (lora / "adapter_config.json").write_text(json.dumps({"task_type": "CAUSAL_LM"}))
    cases = [
        (tmp_path / "nope", lora, tmp_path / "out", "--base", "no such folder"),
        (base, tmp_path / "nope", tmp_path / "out", "--lora", "no such folder"),
        (lora, lora, tmp_path / "out", "--base", "no config.json"),
        (base, lora, base, "--out", "is an input folder"),
    ]
    capsys.readouterr()  # saving the base wrote a progress bar
    for b, lo, out, flag, words in cases:
        assert run_cli(b, lo, out) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith(f"config error: {flag} ") and words in err and "\n" not in err, err
