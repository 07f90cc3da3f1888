"""A resume changes nothing outside its own out_dir: a branch from another run's checkpoint leaves that
run byte for byte as it was; a rollback within a run moves the later checkpoints aside, never deletes.

`RLRun.load_checkpoint` and `save_checkpoint` run for real on real files (CheckpointStore, driver.json,
the learner state's JSON + safetensors); only the learner's DeepSpeed engines and the engines' weight
push are stood in for (the learner-side files are tested with DeepSpeed in test_checkpoint.py)."""

from __future__ import annotations

import asyncio
import hashlib
import json
from pathlib import Path
from typing import Any

import torch

from agentrl.run.checkpoint import CheckpointStore, RunState, load_run_state, resolve_resume, save_run_state
from agentrl.config import load_config
from agentrl.learner.state import load_state, save_state
from agentrl.run.rl_run import RLRun
from agentrl.types import Episode, Group


def _group(gid: int) -> Group:
    ep = Episode(task_id=f"t{gid}", group_id=gid)
    ep.append([1, 2], generated=False)
    ep.append([3, 4], generated=True, logprobs=[-0.25, -1.5], versions=[gid, gid])
    ep.reward = 0.5
    return Group(gid, {"id": f"t{gid}", "question": "1+1"}, [ep], issued_version=gid)


def _state(step: int) -> RunState:
    return RunState(step=step, learner_version=step, elapsed_s=float(step), components={
        "producer": {"cursor": 4 * step + 2, "in_flight": [4 * step + 1], "counters": {"groups_finished": step,
                                                                                        "groups_filtered": 0}},
        "buffer": {"ready": [_group(4 * step)], "counters": {"issued": 2}, "in_flight": 1, "next_version": step},
        "pool": {"generated_tokens": 7 * step}, "stream": {"seed": 0, "tasks": 10}})


class Part:
    """A component: hands over what it was given."""

    def __init__(self, state: dict[str, Any]) -> None:
        self.state = state

    def state_dict(self) -> dict[str, Any]:
        return self.state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.state = state


class Learner:
    """The learner's own files for real (`agentrl.learner.state`); no DeepSpeed engine."""

    def __init__(self) -> None:
        self.version = 0

    def save_checkpoint(self, folder: str) -> None:
        Path(folder).mkdir()
        save_state({"version": self.version, "ema": {"shadow": {"w": torch.full((3,), float(self.version))}}},
                   folder)

    def load_checkpoint(self, folder: str) -> dict[str, float]:
        self.version = load_state(folder)["version"]
        return {"adam_step": float(self.version)}


class Sync:
    async def push(self, version: int) -> None:
        self.pushed = version

    async def landed(self) -> list:
        return []


def _run_in(out: Path) -> RLRun:
    run = RLRun(load_config(None, [f"train.out_dir={out}", "train.checkpoint_keep=0"]), prep=None)
    run.learner, run.sync = Learner(), Sync()
    run.buffer, run.producer, run.pool, run.stream = Part({}), Part({}), Part({}), Part({})
    return run


def _write_run(out: Path, steps: list[int]) -> None:
    store = CheckpointStore(out)
    for step in steps:
        def fill(folder: Path, step: int = step) -> None:
            learner = Learner()
            learner.version = step
            learner.save_checkpoint(str(folder / "learner"))
            save_run_state(folder, _state(step))
        store.write(step, fill)
    (out / "metrics.jsonl").write_text("".join(json.dumps({"step": s}) + "\n" for s in range(max(steps))))


def _snapshot(root: Path) -> dict[str, str]:
    """Every file and folder under `root`: its bytes' digest (a folder: "dir")."""
    return {str(p.relative_to(root)): "dir" if p.is_dir() else hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*"))}


def test_a_branch_resume_leaves_the_source_run_byte_for_byte(tmp_path):
    a, b = tmp_path / "A", tmp_path / "B"
    _write_run(a, [100, 200])
    before = _snapshot(a)
    source = resolve_resume(str(a / "checkpoints" / "step_100"), b)  # start-up's check reads only
    run = _run_in(b)
    asyncio.run(run.load_checkpoint(source))
    assert run.step == 100 and run.learner.version == 100 and run.sync.pushed == 100
    assert [g.group_id for g in run.buffer.state["ready"]] == [400]
    assert run.buffer.state["ready"][0] == _group(400)  # the Group and its Episode back, field for field

    # B trains on and checkpoints into its own folder
    run.producer.state["in_flight"], run.buffer.state["in_flight"] = [], 0
    for step in (120, 140):
        run.step, run.learner.version = step, step
        assert asyncio.run(run.save_checkpoint(step, 1.0)) == b / "checkpoints" / f"step_{step}"
    assert _snapshot(a) == before  # not a byte of A changed, nothing added, nothing removed
    assert [p.name for p in CheckpointStore(a).complete()] == ["step_100", "step_200"]
    assert resolve_resume("auto", a) == a / "checkpoints" / "step_200"
    assert resolve_resume("auto", b) == b / "checkpoints" / "step_140"
    assert not list((b / "checkpoints").glob("abandoned-*"))  # B had nothing newer than 100


def test_a_rollback_within_a_run_moves_the_later_checkpoints_aside(tmp_path, caplog):
    a, b = tmp_path / "A", tmp_path / "B"
    _write_run(a, [100, 200])
    _write_run(b, [120, 140, 300])  # B: an earlier branch of its own that went further
    before_a, before_140 = _snapshot(a), _snapshot(b / "checkpoints" / "step_140")

    run = _run_in(b)
    with caplog.at_level("WARNING"):
        asyncio.run(run.load_checkpoint(resolve_resume(str(b / "checkpoints" / "step_120"), b)))
    assert run.step == 120
    aside = next((b / "checkpoints").glob("abandoned-*"))
    assert sorted(p.name for p in aside.iterdir()) == ["metrics.jsonl", "step_140", "step_300"]
    assert _snapshot(aside / "step_140") == before_140  # moved whole, not rewritten
    assert "step_140, step_300" in caplog.text and str(aside) in caplog.text
    assert resolve_resume("auto", b) == b / "checkpoints" / "step_120"  # `auto` never jumps forward
    assert load_run_state(resolve_resume("auto", b)).step == 120

    # a branch from A into B: B's own checkpoints newer than 100 move aside too; A is only read
    run = _run_in(b)
    asyncio.run(run.load_checkpoint(a / "checkpoints" / "step_100"))
    assert [p.name for p in CheckpointStore(b).complete()] == []
    assert len(list((b / "checkpoints").glob("abandoned-*"))) == 2
    assert _snapshot(a) == before_a
