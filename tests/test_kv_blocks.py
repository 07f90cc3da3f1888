"""KV-cache blocks small enough for prefix caching to share short prompts (agentrl.rollout.engine.kv_block_size):
vLLM's CPU default of 128-token blocks shares nothing under 128 tokens, and prefix caching reuses whole
blocks only. On a real engine: tests/test_e2e_versions.py (a 70-token prompt sent twice finds 64 tokens
cached)."""

from __future__ import annotations

import pytest

from agentrl.rollout.engine import CPU_BLOCK_SIZE, kv_block_size


def test_the_block_size_asked_for():
    assert kv_block_size(None, cpu=True) == CPU_BLOCK_SIZE == 32
    assert kv_block_size(None, cpu=False) is None  # vLLM's choice per attention backend
    assert kv_block_size(64, cpu=True) == 64 and kv_block_size(16, cpu=False) == 16


def test_a_size_the_cpu_kernels_refuse_names_the_key():
    with pytest.raises(ValueError, match=r"engine\.block_size=48: vLLM's CPU attention takes multiples of 32"):
        kv_block_size(48, cpu=True)
    assert kv_block_size(48, cpu=False) == 48  # GPU backends have sizes of their own; vLLM checks them
