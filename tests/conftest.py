"""Shared fixtures. The tokenizer is the embedded default model's, trained locally in about a second."""

from __future__ import annotations

import pytest

from agentrl.config import DefaultModelConfig
from agentrl.default_model import build_tokenizer


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "e2e: end-to-end tests with real vLLM and DeepSpeed")


@pytest.fixture(scope="session")
def tiny_tokenizer(tmp_path_factory: pytest.TempPathFactory):
    """A byte-level BPE tokenizer with the ChatML-style chat template (EOS = <|im_end|>)."""
    return build_tokenizer(DefaultModelConfig(), tmp_path_factory.mktemp("tok"))
