"""Checkpoints: the index-addressable task stream, atomic writes (a real SIGKILL half-way through one),
the buffer's and producer's accounting across a snapshot, and the learner's exact restore with real
DeepSpeed (the resumed learner takes the same next step as the one that never stopped)."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest
import torch

from agentrl.run.checkpoint import (CheckpointError, CheckpointStore, RunState, load_run_state,
                                resolve_resume, save_run_state)
from agentrl.data import TaskStream, task_stream
from agentrl.types import Episode, Group

ROOT = Path(__file__).resolve().parents[1]


# -- the task stream ---------------------------------------------------------------------------------

def test_task_stream_position_is_the_whole_state():
    tasks = [{"id": i} for i in range(7)]
    stream = TaskStream(tasks, seed=3)
    first = [stream[p]["id"] for p in range(21)]
    assert [t["id"] for _, t in zip(range(21), task_stream(tasks, 3))] == first
    for epoch in range(3):  # each epoch is a permutation of all tasks
        assert sorted(first[7 * epoch: 7 * epoch + 7]) == list(range(7))
    assert first[:7] != first[7:14]  # reshuffled every epoch
    fresh = TaskStream(tasks, seed=3)  # a resumed run: any position, in any order, gives the same task
    assert [fresh[p]["id"] for p in (15, 2, 20, 8)] == [first[15], first[2], first[20], first[8]]
    assert [TaskStream(tasks, seed=4)[p]["id"] for p in range(7)] != first[:7]


# -- atomic writes -----------------------------------------------------------------------------------

def _state(step: int) -> RunState:
    return RunState(step=step, learner_version=step, elapsed_s=1.0, components={
        "producer": {"cursor": 4 * step, "in_flight": [4 * step], "counters": {}},
        "buffer": {"ready": [], "counters": {"issued": 0}, "in_flight": 1}})


def _fill(step: int):
    def fill(folder: Path) -> None:
        from agentrl.learner.state import save_state

        (folder / "learner").mkdir()
        (folder / "learner" / "weights.bin").write_bytes(bytes([step]) * 1000)
        save_state({"version": step}, folder / "learner")
        save_run_state(folder, _state(step))
    return fill


WRITER = """
import sys
from collections import defaultdict
from pathlib import Path
sys.path.insert(0, {root!r}); sys.path.insert(0, {tests!r})
from agentrl.run.checkpoint import CheckpointStore
from test_checkpoint import _fill
store = CheckpointStore({out!r})
for step in (2, 4):
    store.write(step, _fill(step))
"""


def test_a_checkpoint_cut_off_mid_write_is_ignored(tmp_path):
    """A real SIGKILL inside the second write (its files written, not yet renamed): the first
    checkpoint stays the newest; so do a renamed folder without a manifest row and a torn row."""
    out = tmp_path / "run"
    code = WRITER.format(root=str(ROOT), tests=str(ROOT / "tests"), out=str(out))
    env = {**os.environ, "AGENTRL_CRASH_AT": "checkpoint_write:2"}
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == -9, proc.stderr
    ckpts = out / "checkpoints"
    assert (ckpts / ".tmp-step_4" / "learner" / "weights.bin").is_file()  # the cut-off write (killed: no clean-up)
    assert not (ckpts / "step_4").exists()
    store = CheckpointStore(out)
    assert store.latest() == ckpts / "step_2"
    assert resolve_resume("auto", out) == ckpts / "step_2"
    assert load_run_state(ckpts / "step_2").cursor == 8
    with pytest.raises(CheckpointError, match="cut off mid-write"):
        resolve_resume(str(ckpts / ".tmp-step_4"), out)
    with pytest.raises(CheckpointError, match="not a complete checkpoint"):
        resolve_resume(str(tmp_path), out)

    # killed after the rename, before the manifest row: still not a checkpoint
    import shutil

    shutil.copytree(ckpts / "step_2", ckpts / "step_6")
    with (ckpts / "manifest.jsonl").open("a") as f:
        f.write('{"step": 8, "pa')  # a row torn by a kill
    assert store.latest() == ckpts / "step_2"
    with pytest.raises(CheckpointError, match="cut off mid-write"):
        resolve_resume(str(ckpts / "step_6"), out)

    # the next write clears the left-overs and lands after the torn row
    assert store.write(4, _fill(4)) == ckpts / "step_4"
    assert not (ckpts / ".tmp-step_4").exists()
    assert store.latest() == ckpts / "step_4" and load_run_state(store.latest()).step == 4
    assert (ckpts / "step_4" / "learner" / "weights.bin").read_bytes() == bytes([4]) * 1000


def test_keep_prunes_oldest_and_a_rollback_sets_newer_aside(tmp_path, caplog):
    store = CheckpointStore(tmp_path, keep=3)
    for step in (1, 2, 3, 4):
        store.write(step, _fill(step))
    assert [p.name for p in store.complete()] == ["step_2", "step_3", "step_4"]
    assert not (tmp_path / "checkpoints" / "step_1").exists()
    (tmp_path / "metrics.jsonl").write_text('{"step": 0}\n{"step": 1}\n{"step": 2}\n{"step": 3}\n')
    (tmp_path / "eval_episodes.jsonl").write_text('{"step": 0}\n{"step": 4}\n')  # the viewer's before/after
    before = (tmp_path / "checkpoints" / "step_4" / "learner" / "weights.bin").read_bytes()
    with caplog.at_level("WARNING"):
        aside = store.set_aside_after(2)  # a run resumed from step 2 abandons steps 3 and 4
    assert store.latest() == tmp_path / "checkpoints" / "step_2"
    assert aside is not None and aside.parent == tmp_path / "checkpoints" and aside.name.startswith("abandoned-")
    assert sorted(p.name for p in aside.iterdir()) == ["eval_episodes.jsonl", "metrics.jsonl", "step_3", "step_4"]
    assert (aside / "step_4" / "learner" / "weights.bin").read_bytes() == before  # kept, not deleted
    assert "step_3, step_4" in caplog.text and str(aside) in caplog.text
    rows = [json.loads(line) for line in (tmp_path / "checkpoints" / "manifest.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2]  # `auto` can never jump forward to them
    assert not (tmp_path / "checkpoints" / "step_4").exists()
    # the resumed run cuts its metrics back (atomic_write: a new file); the link keeps the old rows
    from agentrl.utils.files import restart_jsonl_at

    restart_jsonl_at(tmp_path / "metrics.jsonl", 2)
    assert (tmp_path / "metrics.jsonl").read_text().count("step") == 2
    assert (aside / "metrics.jsonl").read_text().count("step") == 4
    assert store.set_aside_after(2) is None  # nothing newer: nothing moves
    assert resolve_resume(None, tmp_path) is None
    assert resolve_resume("auto", tmp_path / "elsewhere") is None  # no checkpoint yet: a fresh start


# -- buffer and producer accounting ------------------------------------------------------------------

def _episode(group_id: int, version: int, ok: bool = True) -> Episode:
    ep = Episode(task_id=f"t{group_id}", group_id=group_id, status="ok" if ok else "env_error")
    ep.append([1, 2], generated=False)
    ep.append([3], generated=True, logprobs=[-0.5], versions=[version])
    ep.reward = float(group_id % 2)
    return ep


class FakePool:
    """Groups finish when the test says so (a unit test of the producer alone)."""

    def __init__(self) -> None:
        self.release: defaultdict[int, asyncio.Event] = defaultdict(asyncio.Event)
        self.failing: set[int] = set()

    async def group(self, task, group_id, n, issued_version=0):
        await self.release[group_id].wait()
        ok = group_id not in self.failing
        return Group(group_id, task, [_episode(group_id, issued_version, ok) for _ in range(n)], issued_version)


def test_every_position_is_accounted_for_once_across_a_snapshot():
    """Positions below the cursor are trained, dropped (failed), waiting, or in flight; after a
    restore into fresh components, the in-flight ones are re-issued first and then the stream goes on."""
    from agentrl.run.buffer import StalenessBuffer
    from agentrl.run.checkpoint import capture, restore
    from agentrl.rollout.pool import Producer

    async def scenario():
        pool = FakePool()
        buffer = StalenessBuffer(batch_size=4, group_size=2, max_staleness=1)  # 2 groups a batch, 4 slots
        producer = Producer(buffer, pool, lambda p: {"id": f"task{p}"}, 2)
        task = asyncio.create_task(producer.run())
        await asyncio.sleep(0)
        assert producer.in_flight() == [0, 1, 2, 3]  # admission stops at the capacity
        pool.failing.add(1)
        for p in (0, 1, 2):
            pool.release[p].set()
        await asyncio.sleep(0.01)
        batch = await buffer.get_batch(0)  # groups 0 and 2 (1 failed and gave its slot back)
        assert [g.group_id for g in batch.groups] == [0, 2]
        assert producer.take_outcomes() == {"failed": [1]}
        buffer.set_engine_version(1)
        await asyncio.sleep(0.01)
        pool.release[4].set()
        await asyncio.sleep(0.01)
        state = capture(1, 1, {"buffer": buffer, "producer": producer}, 5.0, {}, 0)
        assert state.cursor == 7 and state.in_flight == [3, 5, 6] and [g.group_id for g in state.ready] == [4]
        trained, dropped = {0, 2}, {1}
        assert sorted(trained | dropped | {g.group_id for g in state.ready} | set(state.in_flight)) == list(range(7))
        counters = buffer.stats()
        await producer.stop()
        task.cancel()

        # the resumed run
        pool2 = FakePool()
        buffer2 = StalenessBuffer(batch_size=4, group_size=2, max_staleness=1, engine_version=1)
        producer2 = Producer(buffer2, pool2, lambda p: {"id": f"task{p}"}, 2)
        restore(state, {"buffer": buffer2, "producer": producer2})  # each component's own state dict
        stats = buffer2.stats()
        assert stats["groups_in_buffer"] == 1 and stats["groups_in_flight"] == 0
        assert stats["groups_admitted"] == counters["groups_admitted"] - 3
        assert stats["groups_admitted"] == (stats["groups_returned"] + stats["groups_in_buffer"]
                                            + stats["groups_in_flight"] + stats["groups_refunded"])
        task2 = asyncio.create_task(producer2.run())
        await asyncio.sleep(0)
        assert producer2.in_flight() == [3, 5, 6]  # (1 + 1 + 1) * 2 = 6 slots: 2 returned, 1 waiting, 3 re-issued
        for p in (3, 5, 6):
            pool2.release[p].set()
        await asyncio.sleep(0.01)
        batch2 = await buffer2.get_batch(1)
        assert [g.group_id for g in batch2.groups] == [4, 3]
        buffer2.set_engine_version(2)
        await asyncio.sleep(0.01)
        assert producer2.in_flight() == [7, 8]  # then the stream goes on from the cursor
        await producer2.stop()
        task2.cancel()

    asyncio.run(scenario())


# -- the learner -------------------------------------------------------------------------------------

def _rl_batch(seed: int):
    from agentrl.types import TrainBatch

    g = torch.Generator().manual_seed(seed)
    eps = []
    for i in range(4):
        ep = Episode(task_id="t", group_id=i // 2)
        ep.append([1] + torch.randint(3, 250, (4,), generator=g).tolist(), generated=False)
        ep.append(torch.randint(3, 250, (3,), generator=g).tolist() + [2], generated=True,
                  logprobs=[-1.0] * 4, versions=[0] * 4)
        ep.reward = float(i % 2) + 0.1 * seed
        eps.append(ep)
    return TrainBatch.from_episodes(eps, None, 0)


@pytest.mark.parametrize("zero_stage", [0, 2])
def test_resumed_learner_takes_the_same_next_step(tmp_path, tiny_model, zero_stage):
    """Two steps, save, build a fresh learner from the base model and load: the Adam moments, step
    count, lr schedule, EMA, adaptive KL coefficient and reward normaliser come back, and the next
    step gives the same loss and bit-identical weights as the learner that never stopped."""
    from agentrl.config import AlgoConfig, LearnerConfig
    from agentrl.learner.rl import Learner
    from agentrl.learner.spec import LearnerSpec
    from agentrl.learner.state import optimizer_digest

    cfg = LearnerConfig(lr=1e-3, micro_batch_size=2, zero_stage=zero_stage, scheduler="linear", warmup_steps=4,
                        ema_decay=0.5)
    algo = AlgoConfig(kl={"type": "loss", "coef": 0.1, "controller": {"type": "adaptive", "target": 0.01, "horizon": 10}},
                      reward_norm=True)

    def build():
        return Learner(LearnerSpec(tiny_model, cfg, algo, 4, total_steps=6))

    a = build()
    for seed in (1, 2):
        a.step(_rl_batch(seed))
    a.save_checkpoint(str(tmp_path / "ckpt"))
    saved = optimizer_digest(a.engine)
    assert saved["adam_step"] == 2 and saved["exp_avg_sq_sum"] > 0
    b = build()
    assert optimizer_digest(b.engine)["adam_step"] == 0
    restored = b.load_checkpoint(str(tmp_path / "ckpt"))
    assert restored == saved  # moments, step count and the learning rate of the next step
    assert b.version == a.version == 2 and b.batches_seen == 2
    assert b.kl_ctl.value == a.kl_ctl.value != 0.1  # the adaptive coefficient moved and came back
    assert b.reward_moments.state_dict() == a.reward_moments.state_dict()
    assert all(torch.equal(b.ema.shadow[k], v) for k, v in a.ema.shadow.items())

    (ma,), (mb,) = a.step(_rl_batch(3)), b.step(_rl_batch(3))
    # the third optimizer step's warmup rate, (2 + 1) / 4 of the peak (a schedule restarted from 0: 1/4)
    assert ma.policy["lr"] == mb.policy["lr"] == pytest.approx(1e-3 * 3 / 4)
    assert mb.loss == ma.loss
    sa, sb = a.state_dict_cpu(), b.state_dict_cpu()
    assert all(torch.equal(sa[k], sb[k]) for k in sa)
    assert all(torch.equal(b.ema.shadow[k], v) for k, v in a.ema.shadow.items())
