"""bench/_common.py's host line: every benchmark prints it first, so a table says which CPU it ran on."""

from __future__ import annotations

import os
from pathlib import Path

from bench._common import host_line, print_host


def test_host_line_names_the_cpu_model_usable_cores_and_wide_vector_units():
    line = host_line()
    cpuinfo = Path("/proc/cpuinfo").read_text()
    model = next(ln.partition(":")[2].strip() for ln in cpuinfo.splitlines() if ln.startswith("model name"))
    flags = set(next(ln.partition(":")[2] for ln in cpuinfo.splitlines() if ln.startswith("flags")).split())
    assert line.startswith(f"host: {model}, {len(os.sched_getaffinity(0))} usable cores of {os.cpu_count()}, ")
    assert ("AVX-512" in line) == ("avx512f" in flags) and ("AMX" in line) == ("amx_tile" in flags)


def test_print_host_prints_the_host_line_first_but_not_for_a_help_request(capsys):
    print_host(["--out", "x"])
    assert capsys.readouterr().out == host_line() + "\n"
    for argv in (["--help"], ["--out", "x", "-h"]):
        print_host(argv)
        assert capsys.readouterr().out == ""


def test_resolve_model_builds_the_default_model_with_the_settings_named(monkeypatch):
    """`--model default:KEY=VALUE,...` reaches ensure_default_model as validated `model.default` settings."""
    import pytest

    import agentrl.models.named as named
    from agentrl.config import ConfigError, DefaultModelConfig
    from bench._common import resolve_model

    seen = []
    monkeypatch.setattr(named, "resolve_path", lambda path, default: seen.append((path, default)) or "folder")
    assert resolve_model("default:hidden_size=256, num_layers=6,sft_lr=1e-3") == "folder"
    path, cfg = seen.pop()
    assert path is None and (cfg.hidden_size, cfg.num_layers, cfg.sft_lr) == (256, 6, 1e-3)
    assert cfg.model_copy(update={"hidden_size": 128, "num_layers": 4, "sft_lr": 2e-3}) == DefaultModelConfig()
    resolve_model("default")
    assert seen.pop() == (None, DefaultModelConfig())
    resolve_model("/models/mine")
    assert seen.pop() == ("/models/mine", DefaultModelConfig())
    with pytest.raises(ConfigError, match="model.default.hidden_sise.*did you mean 'model.default.hidden_size'"):
        resolve_model("default:hidden_sise=256")
    with pytest.raises(SystemExit, match="'num_layers' is not KEY=VALUE"):
        resolve_model("default:num_layers")
    assert not seen
