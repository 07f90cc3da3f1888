"""The torch floor is written once: agentrl.learner.state.MIN_TORCH (the checkpoint loader's torch.serialization
APIs) is what pyproject.toml asks pip for, and a torch below it is one clear line, not an AttributeError."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest
import torch

from agentrl.learner import state
from agentrl.learner.state import MIN_TORCH, CheckpointFileError, torch_too_old

REPO = Path(__file__).resolve().parents[1]


def pyproject_floor() -> tuple[int, ...]:
    deps = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
    [spec] = [d for d in deps if re.match(r"torch\b", d)]
    found = re.fullmatch(r"torch>=(\d+)\.(\d+)", spec.replace(" ", ""))
    assert found, f"pyproject's torch requirement {spec!r} is not a plain floor"
    return tuple(int(x) for x in found.groups())


def test_pyproject_asks_for_the_torch_the_loader_needs():
    assert pyproject_floor() == MIN_TORCH


def test_the_installed_torch_has_what_the_loader_calls():
    assert torch_too_old(torch.__version__) is None
    assert callable(torch.serialization.safe_globals) and callable(torch.serialization.get_unsafe_globals_in_checkpoint)


@pytest.mark.parametrize("version, old", [("2.4.1", True), ("2.5.1+cu124", True), ("2.6.0", False), ("2.6a0", False),
                                          ("2.13.0+cpu", False), ("3.0.0a0", False), ("2.10.0", False),
                                          ("unknown", True)])
def test_versions_are_compared_as_numbers(version, old):
    assert (torch_too_old(version) is not None) == old


def test_an_older_torch_is_one_line_naming_the_floor(monkeypatch, tmp_path):
    monkeypatch.setattr(torch, "__version__", "2.4.1")
    with pytest.raises(CheckpointFileError) as err:
        state.check_torch_files(tmp_path)
    assert str(err.value) == ("torch 2.4.1 is older than agentrl needs to read a checkpoint without unpickling it "
                              "(torch>=2.6: torch.serialization.safe_globals and get_unsafe_globals_in_checkpoint); "
                              "install torch>=2.6")
