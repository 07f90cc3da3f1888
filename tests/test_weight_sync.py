"""EngineWeightSync against an in-memory engine that reads the hand-over file the way the vLLM worker does."""

from __future__ import annotations

import asyncio
import os
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save

from agentrl.weights import handover as weight_sync  # where the hand-over folder is chosen
from agentrl.weights.handover import handover_dir
from agentrl.weights.sync import EngineWeightSync


class FileTarget:
    """Loads each pushed file like WorkerWeightExtension (by path), after an optional delay or failure."""

    def __init__(self, delay_s: float = 0.0, fail_versions: tuple[int, ...] = ()) -> None:
        self.version = 0
        self.loaded: list[tuple[int, dict[str, torch.Tensor], str]] = []
        self.delay_s, self.fail_versions = delay_s, fail_versions

    async def load_weights_file(self, path: str, version: int) -> float:
        await asyncio.sleep(self.delay_s)
        if version in self.fail_versions:
            raise RuntimeError(f"engine refused v{version}")
        self.loaded.append((version, load_file(path), path))
        self.version = version
        return 0.25


def test_pushes_hand_over_files_in_order_and_remove_them(tmp_path):
    weights = {"embed.weight": torch.arange(6, dtype=torch.float32).reshape(2, 3)}
    weights["lm_head.weight"] = weights["embed.weight"]  # tied: the same storage under two names
    target = FileTarget(delay_s=0.01)

    async def run() -> list:
        sync = EngineWeightSync(lambda: weights, target, deadline_s=5, folder=str(tmp_path))
        served = []
        sync.on_pushed = served.append
        for v in (1, 2, 3):
            await sync.push(v)
            weights["embed.weight"].add_(1.0)  # the learner's next step: must not leak into the pushed file
        results = await sync.drain()
        assert served == [1, 2, 3]
        return results

    results = asyncio.run(run())
    assert [r.version for r in results] == [1, 2, 3] and all(r.ok for r in results)
    assert [v for v, _, _ in target.loaded] == [1, 2, 3]
    for v, state, path in target.loaded:
        expected = torch.arange(6, dtype=torch.float32).reshape(2, 3) + (v - 1)
        assert torch.equal(state["embed.weight"], expected) and torch.equal(state["lm_head.weight"], expected)
        assert Path(path).parent == tmp_path
    assert list(tmp_path.iterdir()) == []  # every hand-over file is removed once loaded
    t = torch.zeros(2, 3)
    assert results[0].bytes == len(save({"embed.weight": t, "lm_head.weight": t.clone()}))
    assert all(r.pause_s == 0.25 and r.latency_s >= r.snapshot_s for r in results)


def test_weights_are_sent_in_the_engine_dtype(tmp_path):
    weights = {"w": torch.tensor([1.0, 1.0 + 2 ** -10, -3.5])}
    target = FileTarget()

    async def run() -> None:
        sync = EngineWeightSync(lambda: weights, target, deadline_s=5, dtype=torch.bfloat16, folder=str(tmp_path))
        await sync.push(1)
        (result,) = await sync.drain()
        assert result.ok and result.bytes < 100

    asyncio.run(run())
    (_, state, _), = target.loaded
    assert state["w"].dtype == torch.bfloat16
    assert state["w"].tolist() == [1.0, 1.0, -3.5]  # 1 + 2^-10 rounds to 1 in bfloat16's 8-bit mantissa


def test_failed_and_late_pushes_are_reported_and_later_ones_still_land(tmp_path):
    weights = {"w": torch.zeros(4)}
    target = FileTarget(fail_versions=(1,))

    async def run() -> list:
        sync = EngineWeightSync(lambda: weights, target, deadline_s=5, folder=str(tmp_path))
        await sync.push(1)
        await sync.push(2)
        first = await sync.drain()
        target.delay_s = 1.0
        sync.deadline_s = 0.05
        await sync.push(3)
        return first + await sync.drain()

    results = asyncio.run(run())
    assert [(r.version, r.ok) for r in results] == [(1, False), (2, True), (3, False)]
    assert "engine refused v1" in results[0].error and "deadline 0.05s exceeded" in results[2].error
    assert target.version == 2
    assert list(tmp_path.iterdir()) == []


def test_a_snapshot_that_cannot_be_written_is_a_failed_push(tmp_path):
    target = FileTarget()

    async def run() -> list:
        sync = EngineWeightSync(lambda: {"w": torch.zeros(2)}, target, deadline_s=5,
                                folder=str(tmp_path / "missing"))
        await sync.push(1)
        return await sync.drain()

    (result,) = asyncio.run(run())
    assert not result.ok and "No such file or directory" in result.error and target.loaded == []


def test_handover_uses_shared_memory_only_when_it_has_room(monkeypatch, tmp_path):
    shm = tmp_path / "shm"
    shm.mkdir()
    monkeypatch.setattr(weight_sync, "SHM", shm)
    free = {"n": 10 ** 12}
    monkeypatch.setattr(weight_sync.shutil, "disk_usage", lambda p: type("U", (), {"free": free["n"]})())
    assert handover_dir(None, 10 ** 6) == weight_sync.SHM
    free["n"] = 64 * 2 ** 20  # a container's default 64 MB /dev/shm, too small for a 538 MB model
    assert handover_dir(None, 538 * 10 ** 6) != weight_sync.SHM
    assert handover_dir(str(tmp_path), 538 * 10 ** 6) == tmp_path


def test_handover_files_are_this_users_alone_in_a_private_folder(monkeypatch, tmp_path):
    """In the shared /dev/shm: a folder of this process's (0700, a random name), each file 0600,
    whatever the umask; the folder goes when the process exits (not when a forked child does)."""
    shm = tmp_path / "shm"
    shm.mkdir(mode=0o1777)
    monkeypatch.setattr(weight_sync, "SHM", shm)
    monkeypatch.setattr(weight_sync, "_private", {})
    old_umask = os.umask(0o000)  # the most permissive: the modes below come from the code, not the umask
    try:
        path = weight_sync.write_handover(b"weights", "w-v1.safetensors")
        target = FileTarget()
        sync = EngineWeightSync(lambda: {"w": torch.ones(3)}, target, deadline_s=5)

        async def push_one() -> None:
            await sync.push(1)
            await sync.landed()  # loaded; the file is kept until the next push lands

        asyncio.run(push_one())
        pushed = Path(target.loaded[0][2])
    finally:
        os.umask(old_umask)
    folder = path.parent
    assert folder.parent == shm and folder.name.startswith(f"agentrl-{os.getuid()}-")
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    assert stat.S_IMODE(path.stat().st_mode) == 0o600 and path.read_bytes() == b"weights"
    assert Path(pushed).parent == folder and stat.S_IMODE(Path(pushed).stat().st_mode) == 0o600
    weight_sync._remove(folder, os.getpid() + 1)  # a forked child's exit: not its folder
    assert folder.is_dir()
    weight_sync._remove(folder, os.getpid())
    assert not folder.exists()


def test_a_planted_file_or_symlink_at_a_handover_name_is_refused_not_followed(tmp_path):
    """A configured folder may be shared: a symlink planted at the name a push will write (or at its
    temporary name) makes the push fail; the file it points at is left as it was."""
    victim = tmp_path / "victim"
    victim.write_text("precious")
    shared = tmp_path / "shared"
    shared.mkdir()
    (shared / "w-v1.safetensors.part").symlink_to(victim)
    with pytest.raises(FileExistsError, match="symlink"):
        weight_sync.write_handover(b"weights", "w-v1.safetensors", preferred=str(shared))
    (shared / "w-v2.safetensors").symlink_to(victim)
    with pytest.raises(FileExistsError, match="already exists"):
        weight_sync.write_handover(b"weights", "w-v2.safetensors", preferred=str(shared))
    assert not (shared / "w-v2.safetensors.part").exists()

    sync = EngineWeightSync(lambda: {"w": torch.ones(3)}, FileTarget(), deadline_s=5, folder=str(shared))
    (shared / f"{sync._tag}-v1.safetensors.part").symlink_to(victim)
    (shared / f"{sync._tag}-v2.safetensors").symlink_to(victim)

    async def run() -> list:
        await sync.push(1)
        await sync.push(2)
        return await sync.drain()

    results = asyncio.run(run())
    assert [r.ok for r in results] == [False, False]
    assert "symlink" in results[0].error and "already exists" in results[1].error
    assert victim.read_text() == "precious"
    assert sorted(p.name for p in shared.iterdir() if not p.is_symlink()) == []


_HOLDER = """
import sys, time
from pathlib import Path
from agentrl.weights import handover
handover.SHM = Path(sys.argv[1])
print(handover.write_handover(b"w" * 4096, "w-v1.safetensors").parent, flush=True)
time.sleep(60)
"""


def test_a_killed_process_s_handover_folder_is_swept_at_the_next_start(tmp_path):
    """kill -9 skips atexit: the snapshot would stay in /dev/shm. The next process to make a private
    folder there removes it (its lock is free), and leaves a live process's folder, a folder without
    a lock file, a young folder and a symlink alone."""
    shm = tmp_path / "shm"
    shm.mkdir(mode=0o1777)
    procs = [subprocess.Popen([sys.executable, "-c", _HOLDER, str(shm)], stdout=subprocess.PIPE, text=True)
             for _ in range(2)]
    dead, alive = (Path(p.stdout.readline().strip()) for p in procs)
    procs[0].kill()
    procs[0].wait()
    unlocked = shm / f"agentrl-{os.getuid()}-nolock"
    unlocked.mkdir()
    (shm / f"agentrl-{os.getuid()}-link").symlink_to(unlocked)
    old = time.time() - 2 * weight_sync.SWEEP_MIN_AGE_S
    for folder in (dead, alive, unlocked):
        os.utime(folder, (old, old))
    try:
        assert (dead / "w-v1.safetensors").stat().st_size == 4096
        assert weight_sync.sweep_stale(shm) == [dead]
        assert not dead.exists() and (alive / "w-v1.safetensors").exists() and unlocked.is_dir()
        procs[1].kill()
        procs[1].wait()
        os.utime(alive, (old, old))
        young = shm / f"agentrl-{os.getuid()}-young"
        young.mkdir()
        (young / weight_sync.LOCK).touch()
        assert weight_sync.sweep_stale(shm) == [alive]  # dead now; `young` may be a maker mid-start
        assert young.is_dir() and (shm / f"agentrl-{os.getuid()}-link").is_symlink()
    finally:
        for p in procs:
            p.kill()
            p.wait()
            p.stdout.close()
