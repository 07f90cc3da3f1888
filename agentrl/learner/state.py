"""The learner checkpoint's files: what a resumed run needs to take the same next step. No pickle is
ever loaded from them.

    <folder>/actor/, <folder>/critic/   DeepSpeed checkpoints: weights, the AdamW moments and step
                                        counts, the lr scheduler, per-rank ZeRO shards. DeepSpeed writes
                                        them with torch.save; they are read with torch.load(weights_only=True)
                                        and only the few DeepSpeed classes in `_deepspeed_globals` allowed
    <folder>/learner_state.json         `Learner.state_dict()` (version, batches seen, the KL controller,
    <folder>/learner_state.safetensors  the reward normaliser, the unsupervised-text cursor) as JSON; its
                                        tensors (the EMA shadow, the torch RNG as uint8) in safetensors.
                                        Written by rank 0 (the same on every rank)

These functions know engines, folders and a state dict, not the Learner: the Learner owns its state
(`state_dict` / `load_state_dict`) and composes them. Every rank calls them: DeepSpeed's save and
load are collective.
"""

from __future__ import annotations

import json
import pickle
import re
from pathlib import Path
from typing import Any

import torch

STATE_FILE = "learner_state.json"
TENSORS_FILE = "learner_state.safetensors"
OLD_STATE_FILE = "learner_state.pt"  # a pickle, written before checkpoints held none
_FORMAT = "agentrl.learner_state"
# The oldest torch whose loader this file can use: torch.serialization.safe_globals (the context manager, torch
# 2.5) and get_unsafe_globals_in_checkpoint (torch 2.6), which scans a pickle's opcodes without running it.
# pyproject.toml's torch floor is this (tests/test_torch_floor.py holds them equal).
MIN_TORCH = (2, 6)
_TENSOR = "$tensor"


class CheckpointFileError(ValueError):
    """A learner checkpoint file that is refused (it would need unpickling arbitrary objects) or is
    not what it should be; the message names the file."""


def save_engines(engines: dict[str, Any], folder: str | Path) -> None:
    """Each DeepSpeed engine (None = not built) under its tag, with its optimizer and scheduler."""
    for tag, engine in engines.items():
        if engine is not None:
            engine.save_checkpoint(str(folder), tag=tag, save_latest=False)


def load_engines(engines: dict[str, Any], folder: str | Path) -> None:
    folder = Path(folder)
    for tag, engine in engines.items():
        if engine is None:
            continue
        if not (folder / tag).is_dir():
            raise FileNotFoundError(f"{folder}: no {tag}/ checkpoint (was it written with another algo.advantage?)")
        check_torch_files(folder / tag)
        inner = engine.checkpoint_engine
        engine.checkpoint_engine = _WeightsOnly(inner)  # every file DeepSpeed reads goes through its `load`
        try:
            path, _ = engine.load_checkpoint(str(folder), tag=tag, load_optimizer_states=True,
                                             load_lr_scheduler_states=True)
        finally:
            engine.checkpoint_engine = inner
        if path is None:
            raise FileNotFoundError(f"{folder / tag}: DeepSpeed found no checkpoint to load")


def _deepspeed_globals() -> list[Any]:
    """The non-tensor classes DeepSpeed 0.19 pickles into its checkpoints (ZeRO 1-3 optimizer states):
    plain records and an enum, rebuilt from their fields; none runs code when unpickled."""
    from deepspeed.runtime.fp16.loss_scaler import DynamicLossScaler, LossScaler
    from deepspeed.runtime.zero.config import ZeroStageEnum
    from deepspeed.utils.tensor_fragment import fragment_address

    return [LossScaler, DynamicLossScaler, ZeroStageEnum, fragment_address]


def torch_too_old(version: str) -> str | None:
    """Why torch `version` cannot read checkpoints here (one line, with the fix), or None."""
    found = re.match(r"(\d+)\.(\d+)", version)
    if found and (int(found[1]), int(found[2])) >= MIN_TORCH:
        return None
    need = ".".join(map(str, MIN_TORCH))
    return (f"torch {version} is older than agentrl needs to read a checkpoint without unpickling it (torch>={need}: "
            f"torch.serialization.safe_globals and get_unsafe_globals_in_checkpoint); install torch>={need}")


def _need_torch() -> None:
    if (why := torch_too_old(torch.__version__)) is not None:
        raise CheckpointFileError(why)


def safe_torch_load(path: str | Path, map_location: Any = None) -> Any:
    """torch.load(weights_only=True) with DeepSpeed's record classes allowed; CheckpointFileError
    naming the file for anything else (a planted pickle is refused before it runs)."""
    _need_torch()
    try:
        with torch.serialization.safe_globals(_deepspeed_globals()):
            return torch.load(path, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as exc:
        why = next((line.strip() for line in str(exc).splitlines() if "GLOBAL" in line), str(exc).splitlines()[0])
        raise CheckpointFileError(f"{path}: refused: loading it would unpickle objects a checkpoint must not "
                                  f"hold ({why}); only tensors and plain data are read") from None
    except (RuntimeError, EOFError, OSError) as exc:
        raise CheckpointFileError(f"{path}: not a readable torch checkpoint file ({exc})") from None


def check_files(folder: str | Path) -> None:
    """CheckpointFileError naming the file when a learner checkpoint folder holds a file that loading
    would refuse: checked at start-up, before any engine starts (`check_torch_files`, the state's format)."""
    folder = Path(folder)
    if not (folder / STATE_FILE).is_file():
        raise CheckpointFileError(_old_pickle(folder) if (folder / OLD_STATE_FILE).is_file()
                                  else f"{folder}: no {STATE_FILE} (not a learner checkpoint folder)")
    _read_doc(folder)
    check_torch_files(folder)


def _old_pickle(folder: Path) -> str:
    return (f"{folder / OLD_STATE_FILE}: a pickle written by an older agentrl; checkpoints are no longer "
            f"unpickled (a pickle can run code). Resume it with the agentrl version that wrote it, or start a "
            f"fresh run")


def check_torch_files(folder: str | Path) -> None:
    """Every torch file under `folder` read far enough to know it holds only allowed globals (the pickle's
    opcodes are scanned, nothing is built)."""
    _need_torch()
    allowed = {f"{c.__module__}.{c.__qualname__}" for c in _deepspeed_globals()}
    for path in sorted(Path(folder).rglob("*.pt")):
        try:
            unsafe = set(torch.serialization.get_unsafe_globals_in_checkpoint(path)) - allowed
        except (ValueError, RuntimeError, OSError) as exc:
            raise CheckpointFileError(f"{path}: not a torch zip checkpoint ({exc}); other pickles are refused") from None
        if unsafe:
            raise CheckpointFileError(f"{path}: refused: it would unpickle {sorted(unsafe)}, which a checkpoint "
                                      f"must not hold; only tensors and plain data are read")


class _WeightsOnly:
    """A DeepSpeed checkpoint engine whose `load` is `safe_torch_load`; everything else is the engine's."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def load(self, path: str, map_location: Any = None) -> Any:
        return safe_torch_load(path, map_location)


def save_state(state: dict[str, Any], folder: str | Path) -> None:
    """`state` with the torch RNG as it is now (the RNG goes back last, in `restore_rng`): plain values
    as JSON, tensors in safetensors under their key path."""
    from safetensors.torch import save_file

    tensors: dict[str, torch.Tensor] = {}
    doc = {"format": _FORMAT, "version": 1, "state": _pack({**state, "rng": torch.get_rng_state()}, "", tensors)}
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(Path(folder) / TENSORS_FILE))
    (Path(folder) / STATE_FILE).write_text(json.dumps(doc))


def load_state(folder: str | Path) -> dict[str, Any]:
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    folder = Path(folder)
    if not (folder / STATE_FILE).is_file() and (folder / OLD_STATE_FILE).is_file():
        raise CheckpointFileError(_old_pickle(folder))
    doc = _read_doc(folder)
    try:
        tensors = load_file(str(folder / TENSORS_FILE))
    except (OSError, SafetensorError) as exc:
        raise CheckpointFileError(f"{folder / TENSORS_FILE}: cannot be read: {type(exc).__name__}: {exc}") from None
    return _unpack(doc["state"], tensors, folder / STATE_FILE)


def _read_doc(folder: Path) -> dict[str, Any]:
    path = folder / STATE_FILE
    try:
        doc = json.loads(path.read_bytes().decode("utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise CheckpointFileError(f"{path}: the learner state cannot be read (JSON expected; nothing in a "
                                  f"checkpoint is unpickled): {type(exc).__name__}: {exc}") from None
    if not isinstance(doc, dict) or doc.get("format") != _FORMAT or doc.get("version") != 1:
        raise CheckpointFileError(f"{path}: not an agentrl learner state (format {_FORMAT}, version 1)")
    return doc


def _pack(value: Any, key: str, tensors: dict[str, torch.Tensor]) -> Any:
    if isinstance(value, torch.Tensor):
        tensors[key] = value.detach().cpu()
        return {_TENSOR: key}
    if isinstance(value, dict):
        if not all(isinstance(k, str) and "/" not in k for k in value):
            raise TypeError(f"learner state at {key or '/'}: keys must be strings without '/'")
        return {k: _pack(v, f"{key}/{k}", tensors) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_pack(v, f"{key}/{i}", tensors) for i, v in enumerate(value)]
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    raise TypeError(f"learner state at {key}: a {type(value).__name__} is neither a tensor nor plain data")


def _unpack(value: Any, tensors: dict[str, torch.Tensor], path: Path) -> Any:
    if isinstance(value, dict):
        if set(value) == {_TENSOR}:
            if value[_TENSOR] not in tensors:
                raise CheckpointFileError(f"{path}: tensor {value[_TENSOR]!r} is not in {TENSORS_FILE}")
            return tensors[value[_TENSOR]]
        return {k: _unpack(v, tensors, path) for k, v in value.items()}
    if isinstance(value, list):
        return [_unpack(v, tensors, path) for v in value]
    return value


def restore_rng(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["rng"])


def optimizer_digest(engine) -> dict[str, float]:
    """Sums of the actor's Adam moments, its step count and learning rate: equal before a save and
    after a load exactly when the optimizer came back (sums over this rank's partitions under ZeRO)."""
    inner = getattr(engine.optimizer, "optimizer", engine.optimizer)  # ZeRO wraps the torch optimizer
    exp_avg = exp_avg_sq = 0.0
    steps = 0.0
    for st in inner.state.values():
        if "exp_avg" in st:
            exp_avg += float(st["exp_avg"].double().sum())
            exp_avg_sq += float(st["exp_avg_sq"].double().sum())
            steps = max(steps, float(st["step"]))
    return {"exp_avg_sum": exp_avg, "exp_avg_sq_sum": exp_avg_sq, "adam_step": steps, "lr": engine.get_lr()[0]}
