"""Offline by default: a hub id (`model.path=org/name`) passes start-up only when every file the loaders
read is in the local Hugging Face cache; a missing one is a start-up error naming it, and nothing touches
the network (a socket connect fails the test). With the files there the loaders read the cache only."""

from __future__ import annotations

import hashlib
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from huggingface_hub import constants

from agentrl.config import ConfigError, load_config
from agentrl.models.named import missing_hub_files
from agentrl.run.startup import OFFLINE_VARS, check_model, check_model_path, stay_offline

REPO = Path(__file__).resolve().parents[1]
REV = "0123456789abcdef0123456789abcdef01234567"
CONFIG = json.dumps({"model_type": "qwen2", "architectures": ["Qwen2ForCausalLM"]})


def cache_model(cache: Path, repo_id: str, files: dict[str, bytes | str]) -> Path:
    """A model in `cache` laid out as huggingface_hub writes it: blobs, a snapshot of links, refs/main."""
    root = cache / f"models--{repo_id.replace('/', '--')}"
    (root / "refs").mkdir(parents=True, exist_ok=True)
    (root / "refs" / "main").write_text(REV)
    snapshot = root / "snapshots" / REV
    snapshot.mkdir(parents=True, exist_ok=True)
    for name, data in files.items():
        data = data.encode() if isinstance(data, str) else data
        blob = root / "blobs" / hashlib.sha256(data).hexdigest()
        blob.parent.mkdir(exist_ok=True)
        blob.write_bytes(data)
        (snapshot / name).symlink_to(blob)
    return snapshot


@pytest.fixture
def hub_cache(tmp_path, monkeypatch):
    """An empty Hugging Face cache for this test; any network connection fails the test."""
    cache = tmp_path / "hub"
    cache.mkdir()
    monkeypatch.setenv("HF_HUB_CACHE", str(cache))
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))  # read at import: the test process has it already
    for var in OFFLINE_VARS:  # set first: monkeypatch restores only what it saw, and the checks set these
        monkeypatch.setenv(var, "0")
        monkeypatch.delenv(var)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    tried = []

    def no_network(self, address, *args):
        if self.family in (socket.AF_INET, socket.AF_INET6):
            tried.append(address)
            raise AssertionError(f"network connection attempted to {address}")
        return real_connect(self, address, *args)

    real_connect = socket.socket.connect
    monkeypatch.setattr(socket.socket, "connect", no_network)
    yield cache
    assert tried == []


def test_only_config_json_cached_is_an_error_naming_every_missing_file(hub_cache):
    cache_model(hub_cache, "org/name", {"config.json": CONFIG})
    with pytest.raises(ConfigError) as err:
        check_model_path("org/name")
    assert str(err.value) == (
        f"model.path='org/name': tokenizer_config.json and the tokenizer (tokenizer.json, or a sentencepiece or "
        f"tiktoken file, or vocab.json and merges.txt) and the weights (model.safetensors, or model.safetensors.index.json and its "
        f"shards, or pytorch_model.bin) are not in the local Hugging Face cache "
        f"({hub_cache}/models--org--name/snapshots/{REV}); nothing is downloaded unless model.allow_download=true. "
        f"Fetch it where the hub is reachable with `hf download org/name` into this cache (HF_HOME / "
        f"HF_HUB_CACHE), pass a local folder, or set model.allow_download=true")


def test_a_missing_shard_is_named(hub_cache):
    index = {"weight_map": {"a.weight": "model-00001-of-00002.safetensors", "b.weight": "model-00002-of-00002.safetensors"}}
    cache_model(hub_cache, "org/sharded", {"config.json": CONFIG, "tokenizer_config.json": "{}", "tokenizer.json": "{}",
                                           "model.safetensors.index.json": json.dumps(index),
                                           "model-00001-of-00002.safetensors": b"x"})
    with pytest.raises(ConfigError, match=r"^model.path='org/sharded': model-00002-of-00002.safetensors is not in "
                                          r"the local Hugging Face cache"):
        check_model_path("org/sharded")


@pytest.mark.parametrize("tokenizer, weights", [("spiece.model", "model.safetensors"),
                                                 ("cl100k_base.tiktoken", "consolidated.safetensors"),
                                                 ("sentencepiece.bpe.model", "pytorch_model.bin")])
def test_a_cache_complete_under_other_file_names_passes(hub_cache, tokenizer, weights):
    """A sentencepiece or tiktoken tokenizer and a single weights file under another name are complete."""
    cache_model(hub_cache, "org/other", {"config.json": CONFIG, "tokenizer_config.json": "{}", tokenizer: b"x",
                                         weights: b"x"})
    assert missing_hub_files("org/other")[0] == []


def test_a_lone_shard_without_its_index_is_not_the_weights(hub_cache):
    cache_model(hub_cache, "org/partial", {"config.json": CONFIG, "tokenizer_config.json": "{}", "tokenizer.json": "{}",
                                           "model-00001-of-00002.safetensors": b"x"})
    assert missing_hub_files("org/partial")[0] == ["the weights (model.safetensors, or model.safetensors.index.json "
                                                   "and its shards, or pytorch_model.bin)"]


def test_an_id_not_in_the_cache_at_all(hub_cache):
    with pytest.raises(ConfigError, match=r"^model.path='org/absent': no such folder, and no model of that id in "
                                          r"the local Hugging Face cache \(.*hub\); nothing is downloaded unless "
                                          r"model.allow_download=true"):
        check_model(load_config(None, ["model.path=org/absent"]).model)
    assert os.environ["HF_HUB_OFFLINE"] == "1" and constants.HF_HUB_OFFLINE is True


def test_allow_download_passes_start_up_and_leaves_the_hub_online(hub_cache):
    cache_model(hub_cache, "org/name", {"config.json": CONFIG})
    check_model(load_config(None, ["model.path=org/name", "model.allow_download=true"]).model)
    check_model(load_config(None, ["model.path=org/absent", "model.allow_download=true"]).model)
    assert not any(var in os.environ for var in OFFLINE_VARS) and constants.HF_HUB_OFFLINE is False


def test_a_complete_cache_loads_with_no_network(hub_cache, tiny_model):
    """Config, tokenizer and weights of a real model folder, cached as the hub would: start-up passes and
    transformers loads all three from the cache with the offline switches on."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    files = {p.name: p.read_bytes() for p in Path(tiny_model).iterdir() if p.is_file()}
    assert "model.safetensors" in files and "tokenizer.json" in files
    cache_model(hub_cache, "org/tiny", files)
    check_model(load_config(None, ["model.path=org/tiny"]).model)  # sets HF_HUB_OFFLINE=1
    assert AutoConfig.from_pretrained("org/tiny").num_hidden_layers == 1
    assert AutoTokenizer.from_pretrained("org/tiny")("12 + 30").input_ids  # a tokenizer that encodes
    loaded = AutoModelForCausalLM.from_pretrained("org/tiny", dtype=torch.float32).state_dict()
    local = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32).state_dict()
    assert loaded.keys() == local.keys() and all(torch.equal(loaded[k], local[k]) for k in local)


def test_stay_offline_sets_every_switch_for_child_processes(hub_cache):
    stay_offline(allow_download=False)
    child = subprocess.run([sys.executable, "-c", "import os, huggingface_hub.constants as c; "
                            f"print([os.environ.get(v) for v in {OFFLINE_VARS!r}], c.HF_HUB_OFFLINE)"],
                           capture_output=True, text=True, check=True)
    assert child.stdout.strip() == "['1', '1', '1'] True"


def test_the_train_cli_names_the_missing_file_cold(tmp_path):
    """`python -m agentrl.train model.path=org/name` started cold, as a user starts it, with a cache holding
    config.json only: exit 2, one line, and no socket opened to anything (sitecustomize guards connect)."""
    cache = tmp_path / "hub"
    cache_model(cache, "org/name", {"config.json": CONFIG})
    guard = tmp_path / "guard"
    guard.mkdir()
    (guard / "sitecustomize.py").write_text(
        "import socket\n_real = socket.socket.connect\n"
        "def _connect(self, address, *a):\n"
        "    if self.family in (socket.AF_INET, socket.AF_INET6):\n"
        f"        open({str(tmp_path / 'connected')!r}, 'a').write(repr(address) + '\\n')\n"
        "        raise OSError('network disabled by the test')\n"
        "    return _real(self, address, *a)\n"
        "socket.socket.connect = _connect\n")
    env = {**os.environ, "PYTHONPATH": f"{guard}:{REPO}", "HF_HUB_CACHE": str(cache),
           "AGENTRL_CACHE": str(tmp_path / "agentrl-cache")}
    for var in OFFLINE_VARS:
        env.pop(var, None)
    proc = subprocess.run([sys.executable, "-m", "agentrl.train", "model.path=org/name",
                           f"train.out_dir={tmp_path / 'run'}"], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 2, proc.stderr
    [line] = proc.stderr.strip().splitlines()
    assert line.startswith("config error: model.path='org/name': tokenizer_config.json and the tokenizer ") and \
        "are not in the local Hugging Face cache" in line and "model.allow_download=true" in line, line
    assert not (tmp_path / "connected").exists() and not (tmp_path / "run").exists()


def test_a_teacher_hub_id_is_checked_against_the_cache_like_the_model(hub_cache, tiny_model):
    """algo.teacher.model (the distillation teacher) given as a hub id: the same check as model.path, named by
    its own key, at config check time (agentrl.run.startup.check_teacher_model, called by prepare)."""
    from agentrl.run.startup import check_teacher_model

    with pytest.raises(ConfigError, match=r"^algo.teacher.model='org/teacher': no such folder, and no model of that "
                                          r"id in the local Hugging Face cache \(.*hub\); nothing is downloaded unless "
                                          r"model.allow_download=true"):
        check_teacher_model(load_config(None, ["algo.teacher.model=org/teacher"]))
    cache_model(hub_cache, "org/teacher", {"config.json": CONFIG})
    with pytest.raises(ConfigError, match=r"^algo.teacher.model='org/teacher': tokenizer_config.json and the "
                                          r"tokenizer .* are not in the local Hugging Face cache"):
        check_teacher_model(load_config(None, ["algo.teacher.model=org/teacher"]))
    check_teacher_model(load_config(None, ["algo.teacher.model=org/teacher", "model.allow_download=true"]))
    files = {p.name: p.read_bytes() for p in Path(tiny_model).iterdir() if p.is_file()}
    cache_model(hub_cache, "org/complete", files)
    check_teacher_model(load_config(None, ["algo.teacher.model=org/complete"]))
    check_teacher_model(load_config(None, []))  # no teacher: nothing to check
    with pytest.raises(ConfigError, match=r"^algo.teacher.model='/nonexistent/teacher': no such folder$"):
        check_teacher_model(load_config(None, ["algo.teacher.model=/nonexistent/teacher"]))


def test_the_check_cli_names_a_teacher_missing_from_the_cache(tmp_path):
    """`python -m agentrl.check algo.teacher.model=org/absent` started as a user starts it: exit 2, one line,
    before any model is built or engine started."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "HF_HUB_CACHE": str(tmp_path / "hub"),
           "AGENTRL_CACHE": str(tmp_path / "agentrl-cache")}
    for var in OFFLINE_VARS:
        env.pop(var, None)
    proc = subprocess.run([sys.executable, "-m", "agentrl.check", "algo.teacher.model=org/absent"], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().splitlines() == [
        f"config error: algo.teacher.model='org/absent': no such folder, and no model of that id in the local "
        f"Hugging Face cache ({tmp_path / 'hub'}); nothing is downloaded unless model.allow_download=true. Fetch it "
        f"where the hub is reachable with `hf download org/absent` into this cache (HF_HOME / HF_HUB_CACHE), pass "
        f"a local folder, or set model.allow_download=true"]
    assert not (tmp_path / "agentrl-cache" / "models").exists()  # the embedded default was not built
