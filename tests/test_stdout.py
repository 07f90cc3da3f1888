"""stdout belongs to the command (agentrl.utils.stdio): on a cold cache, `python -m agentrl.models prepare
default` prints its folder and nothing else, though building the model imports DeepSpeed, which
wrote its accelerator notice to stdout unless routed (the pipeline example's first-run failure); on a
CPU-only machine the notice is not written at all now (agentrl.utils.stdio.pin_cpu_accelerator)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_prepare_default_prints_only_the_folder_on_a_cold_cache(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "AGENTRL_CACHE": str(tmp_path / "cache")}
    env.pop("VLLM_LOGGING_STREAM", None)
    proc = subprocess.run([sys.executable, "-m", "agentrl.models", "prepare", "default", "--sft-steps", "0"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    folder = Path(proc.stdout.strip())
    assert proc.stdout == f"{folder}\n" and folder.parent == tmp_path / "cache"
    assert (folder / "config.json").is_file() and (folder / "DONE").is_file()
    assert "building the embedded default model" in proc.stderr  # a cold cache: it was built here
    # DeepSpeed was imported, with DS_ACCELERATOR=cpu (agentrl.utils.stdio.pin_cpu_accelerator): no notice anywhere.
    assert "Setting accelerator to CPU" not in proc.stderr + proc.stdout, proc.stderr[-3000:]


def test_a_bad_default_setting_is_one_line_with_the_nearest_key(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "AGENTRL_CACHE": str(tmp_path / "cache")}
    proc = subprocess.run([sys.executable, "-m", "agentrl.models", "prepare", "default", "sft_stepz=0"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert (proc.returncode, proc.stdout) == (2, "")
    assert proc.stderr.strip().splitlines()[-1] == ("config error: unknown config key 'model.default.sft_stepz'; "
                                                    "did you mean 'model.default.sft_steps'?")
