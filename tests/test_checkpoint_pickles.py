"""Checkpoints hold no pickle, and a planted one is refused before it runs: as the driver file, as the
learner state, as a DeepSpeed model or optimizer file (real DeepSpeed), and as a LoRA adapter. Each
planted pickle would create a marker file when unpickled; the marker must never appear."""

from __future__ import annotations

import builtins
import io
import pickle
import shutil
import zipfile
from pathlib import Path

import pytest
import torch

from agentrl.run.checkpoint import CheckpointError, CheckpointStore, load_run_state, resolve_resume, save_run_state
from agentrl.config import ConfigError
from agentrl.learner.state import CheckpointFileError, check_files, load_state, safe_torch_load, save_state
from test_checkpoint import _fill, _rl_batch, _state


class Planted:
    """Unpickling this writes `marker` (what an attacker's payload would do instead)."""

    def __init__(self, marker: Path) -> None:
        self.marker = str(marker)

    def __reduce__(self):
        return builtins.exec, (f"open({self.marker!r}, 'w').write('ran')",)


def _plain_pickle(marker: Path) -> bytes:
    return pickle.dumps({"step": 2, "payload": Planted(marker)})


def _torch_pickle(marker: Path, **tensors: torch.Tensor) -> bytes:
    buf = io.BytesIO()
    torch.save({**tensors, "payload": Planted(marker)}, buf)
    return buf.getvalue()


def test_no_pickle_in_a_checkpoint_and_a_planted_driver_or_state_file_is_refused(tmp_path):
    marker = tmp_path / "marker"
    out = tmp_path / "run"
    folder = CheckpointStore(out).write(2, _fill(2))
    names = sorted(p.name for p in folder.rglob("*") if p.is_file())
    assert names == ["driver.json", "learner_state.json", "learner_state.safetensors", "weights.bin"]
    for path in folder.rglob("*"):
        if path.is_file() and path.name != "weights.bin":
            assert not path.read_bytes().startswith(b"\x80"), f"{path} is a pickle"
    assert load_run_state(folder).step == 2 and load_state(folder / "learner")["version"] == 2

    driver = folder / "driver.json"
    good = driver.read_bytes()
    driver.write_bytes(_plain_pickle(marker))  # a pickle under the JSON file's name
    with pytest.raises(CheckpointError, match=r"driver\.json: not a driver state file \(JSON expected"):
        load_run_state(folder)
    with pytest.raises(CheckpointError, match="driver.json"):
        resolve_resume("auto", out)  # start-up refuses it before any engine starts
    driver.unlink()
    (folder / "driver.pkl").write_bytes(_plain_pickle(marker))  # a checkpoint of the pickle days
    with pytest.raises(CheckpointError, match=r"holds driver\.pkl, a pickle .* no longer unpickled"):
        resolve_resume(str(folder), out)
    with pytest.raises(CheckpointError, match=r"resume=auto: .* holds only checkpoints of an older agentrl \(step_2"):
        resolve_resume("auto", out)  # not a silent fresh start over them
    driver.write_bytes(good)

    learner = folder / "learner"
    (learner / "learner_state.json").write_bytes(_plain_pickle(marker))
    with pytest.raises(CheckpointFileError, match=r"learner_state\.json.* cannot be read"):
        load_state(learner)
    with pytest.raises(CheckpointError):
        resolve_resume("auto", out)
    (learner / "learner_state.json").unlink()
    (learner / "learner_state.pt").write_bytes(_torch_pickle(marker))
    with pytest.raises(CheckpointFileError, match=r"learner_state\.pt: a pickle written by an older agentrl"):
        load_state(learner)
    with pytest.raises(CheckpointError, match=r"learner_state\.pt: a pickle"):
        resolve_resume(str(folder), out)
    assert not marker.exists()


def test_a_planted_torch_file_is_refused_by_name(tmp_path):
    marker = tmp_path / "marker"
    zipped, raw = tmp_path / "zipped.pt", tmp_path / "raw.pt"
    zipped.write_bytes(_torch_pickle(marker, w=torch.ones(2)))
    raw.write_bytes(_plain_pickle(marker))  # torch's legacy (non-zip) format is a bare pickle
    for path in (zipped, raw):
        with pytest.raises(CheckpointFileError, match=rf"^{path}: "):
            safe_torch_load(path)
    (tmp_path / "learner").mkdir()
    save_state({"version": 1}, tmp_path / "learner")
    shutil.copy(zipped, tmp_path / "learner" / "mp_rank_00_model_states.pt")
    with pytest.raises(CheckpointFileError, match=r"mp_rank_00_model_states\.pt: refused: it would unpickle "
                                                  r"\['builtins\.exec'\]"):
        check_files(tmp_path / "learner")
    assert safe_torch_load(_save(tmp_path / "ok.pt", {"w": torch.arange(3)}))["w"].tolist() == [0, 1, 2]
    assert not marker.exists()


def _save(path: Path, obj) -> Path:
    torch.save(obj, path)
    return path


def _plant_in_torch_zip(path: Path, marker: Path) -> None:
    """Rewrite a real torch.save file's pickle so it also holds the payload, keeping its tensors."""
    state = torch.load(path, weights_only=False)  # the file was written by this test's own learner
    state["payload"] = Planted(marker)
    torch.save(state, path)
    assert zipfile.is_zipfile(path)


@pytest.mark.parametrize("zero_stage,planted", [(0, "mp_rank_00_model_states.pt"),
                                                (2, "zero_pp_rank_0_mp_rank_00_optim_states.pt")])
def test_a_planted_deepspeed_file_is_refused_and_a_real_one_loads(tmp_path, tiny_model, zero_stage, planted):
    """DeepSpeed writes its checkpoints with torch.save; they load with weights_only=True (its ZeRO
    optimizer records allowed by name), and a payload planted in one stops the load, naming the file."""
    from agentrl.config import AlgoConfig, LearnerConfig
    from agentrl.learner.rl import Learner
    from agentrl.learner.spec import LearnerSpec

    marker = tmp_path / "marker"
    cfg = LearnerConfig(lr=1e-3, micro_batch_size=2, zero_stage=zero_stage)
    a = Learner(LearnerSpec(tiny_model, cfg, AlgoConfig(), 4, total_steps=4))
    a.step(_rl_batch(1))
    a.save_checkpoint(str(tmp_path / "ckpt"))
    check_files(tmp_path / "ckpt")  # what DeepSpeed wrote passes the scan
    assert a.load_checkpoint(str(tmp_path / "ckpt"))["adam_step"] == 1  # and loads, weights_only

    _plant_in_torch_zip(tmp_path / "ckpt" / "actor" / planted, marker)
    with pytest.raises(CheckpointFileError, match=rf"{planted}: refused"):
        check_files(tmp_path / "ckpt")
    with pytest.raises(CheckpointFileError, match=rf"{planted}: refused"):
        a.load_checkpoint(str(tmp_path / "ckpt"))  # the scan in load_engines stops it
    with pytest.raises(CheckpointFileError, match=rf"{planted}: refused: loading it would unpickle"):
        _load_without_scan(a.engine, tmp_path / "ckpt")  # past the scan, DeepSpeed's own reads refuse it
    assert not marker.exists()


def _load_without_scan(engine, folder: Path) -> None:
    from agentrl.learner import state

    scan, state.check_torch_files = state.check_torch_files, lambda folder: None
    try:
        state.load_engines({"actor": engine}, folder)
    finally:
        state.check_torch_files = scan


def test_a_planted_adapter_file_is_refused(tmp_path):
    from agentrl.lora_merge import merge

    marker = tmp_path / "marker"
    base, lora = tmp_path / "base", tmp_path / "lora"
    base.mkdir(), lora.mkdir()
    (base / "config.json").write_text("{}")
    (lora / "adapter_config.json").write_text('{"task_type": "CAUSAL_LM"}')
    (lora / "adapter_model.bin").write_bytes(_torch_pickle(marker, w=torch.ones(2)))
    with pytest.raises(ConfigError, match=r"--lora .*adapter_model\.bin: refused"):
        merge(base, lora, tmp_path / "out")
    assert not marker.exists() and not (tmp_path / "out").exists()


def test_driver_state_round_trips_through_json(tmp_path):
    """Every container a component hands over comes back equal and of the same type."""
    from collections import Counter, defaultdict

    from agentrl.rollout.tools.counts import ToolCallStats
    from agentrl.types import Episode, Group, Segment, Turn
    from rewards.sources import SourceStats

    ep = Episode(task_id="t", group_id=3, reward=float("nan"), status="truncated", turns=[Turn(0, 2, "hi", 1, 0.5)],
                 segments=[Segment([1], [0], [0.0], [-1], 1, "rewritten")], info={"env": {"x": (1, 2)}, 7: {3}})
    ep.append([5, 6], generated=True, logprobs=[-0.1, -1e-300], versions=[2, 2])
    stats = defaultdict(SourceStats)
    stats["env"].status["ok"] += 3
    state = _state(4)
    state.components["buffer"]["ready"] = [Group(3, {"id": "t", "$t": "user key"}, [ep], 2)]
    state.components["pool"] = {"status_counts": Counter(ok=2), "tool_stats": ToolCallStats(episodes=1),
                                "scorer_stats": stats, "generated_tokens": 9}
    (tmp_path / "s").mkdir()
    save_run_state(tmp_path / "s", state)
    back = load_run_state(tmp_path / "s")
    got = back.components["buffer"]["ready"][0]
    assert got.episodes[0].turns == ep.turns and got.episodes[0].segments == ep.segments
    assert got.episodes[0].logprobs == [-0.1, -1e-300] and got.episodes[0].reward != got.episodes[0].reward  # NaN
    assert got.episodes[0].info == {"env": {"x": (1, 2)}, 7: {3}} and got.task == {"id": "t", "$t": "user key"}
    pool = back.components["pool"]
    assert pool["status_counts"] == Counter(ok=2) and isinstance(pool["status_counts"], Counter)
    assert pool["tool_stats"] == ToolCallStats(episodes=1)
    assert isinstance(pool["scorer_stats"], defaultdict) and pool["scorer_stats"]["new"] == SourceStats()
    assert pool["scorer_stats"]["env"].status == Counter(ok=3)
    assert back.step == 4 and back.cursor == state.cursor and back.in_flight == state.in_flight
