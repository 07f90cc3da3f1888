"""A checkpoint write that fails half-way (a full disk, an injected write error) leaves the previous
checkpoint intact, removes its temporary folder, says why, and the run goes on: the next due
checkpoint tries again."""

from __future__ import annotations

import asyncio
import contextlib
import errno
import hashlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

from agentrl.run.checkpoint import CheckpointStore, CheckpointWriteError, load_run_state, resolve_resume
from test_checkpoint import _fill
from test_checkpoint_branch import _run_in, _write_run

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def _fresh_fault_counts():
    from agentrl.utils import faults
    faults.reset()  # visits counted by an earlier test in this process


def _digest(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def test_an_injected_write_error_keeps_the_previous_checkpoint(tmp_path, monkeypatch):
    monkeypatch.setenv("AGENTRL_FAIL_AT", "checkpoint_io:2")  # the second write fails half-way
    store = CheckpointStore(tmp_path)
    store.write(2, _fill(2))
    before = _digest(tmp_path / "checkpoints")
    with pytest.raises(CheckpointWriteError) as err:
        store.write(4, _fill(4))
    assert str(err.value) == (f"checkpoint {tmp_path / 'checkpoints' / 'step_4'} not written: OSError: [Errno 28] "
                              f"No space left on device (injected by AGENTRL_FAIL_AT); the newest checkpoint is "
                              f"still {tmp_path / 'checkpoints' / 'step_2'}")
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["manifest.jsonl", "step_2"]  # no .tmp
    assert _digest(tmp_path / "checkpoints") == before
    assert resolve_resume("auto", tmp_path) == tmp_path / "checkpoints" / "step_2"
    assert store.write(6, _fill(6)) == tmp_path / "checkpoints" / "step_6"  # the next one goes through
    assert load_run_state(store.latest()).step == 6


@contextlib.contextmanager
def _small_disk(where: Path, size: str):
    """A real tmpfs of `size` at `where` (root: mount); None where mounting is not allowed."""
    where.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)],
                             capture_output=True).returncode == 0
    try:
        yield mounted
    finally:
        if mounted:
            subprocess.run(["umount", str(where)], check=True)


FILL_DISK = """
import resource, signal, sys
sys.path.insert(0, {root!r}); sys.path.insert(0, {tests!r})
from pathlib import Path
from agentrl.run.checkpoint import CheckpointStore, CheckpointWriteError
from test_checkpoint import _fill
store = CheckpointStore({out!r})
store.write(2, _fill(2))
def big(folder: Path) -> None:
    _fill(4)(folder)
    (folder / "learner" / "shard.bin").write_bytes(bytes(4_000_000))  # more than the disk holds
if {limit}:  # no mount allowed: the file-size limit makes the kernel refuse the write instead (EFBIG)
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, ({limit}, {limit}))
try:
    store.write(4, big)
except CheckpointWriteError as exc:
    print(exc)
"""


def test_a_full_disk_keeps_the_previous_checkpoint(tmp_path):
    """A real write error from the kernel: ENOSPC on a 1 MiB tmpfs (as root), else EFBIG under a
    file-size limit."""
    with _small_disk(tmp_path / "disk", "1m") as mounted:
        out = tmp_path / "disk" / "run"
        code = FILL_DISK.format(root=str(ROOT), tests=str(ROOT / "tests"), out=str(out),
                                limit=0 if mounted else 1_000_000)
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
        assert proc.returncode == 0, proc.stderr
        why = os.strerror(errno.ENOSPC if mounted else errno.EFBIG)
        assert f"checkpoint {out / 'checkpoints' / 'step_4'} not written: OSError: [Errno" in proc.stdout
        assert why in proc.stdout and f"the newest checkpoint is still {out / 'checkpoints' / 'step_2'}" in proc.stdout
        assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["manifest.jsonl", "step_2"]
        assert load_run_state(resolve_resume("auto", out)).step == 2
        assert (out / "checkpoints" / "step_2" / "learner" / "weights.bin").read_bytes() == bytes([2]) * 1000


def test_a_run_whose_checkpoint_fails_logs_why_and_goes_on(tmp_path, monkeypatch, caplog):
    a = tmp_path / "A"
    _write_run(a, [2])
    run = _run_in(tmp_path / "B")
    asyncio.run(run.load_checkpoint(a / "checkpoints" / "step_2"))
    run.producer.state["in_flight"], run.buffer.state["in_flight"] = [], 0
    monkeypatch.setenv("AGENTRL_FAIL_AT", "checkpoint_io:1")
    with caplog.at_level("ERROR"):
        assert asyncio.run(run.save_checkpoint(4, 1.0)) is None
    assert "step_4 not written: OSError: [Errno 28] No space left on device" in caplog.text
    assert "training goes on; the next due checkpoint tries again" in caplog.text
    assert run.saved_step == 2 and len(run.checkpoint_failures) == 1
    assert [p.name for p in (tmp_path / "B" / "checkpoints").iterdir()] == []  # no step_4, no .tmp-step_4
    assert asyncio.run(run.save_checkpoint(6, 1.0)) == tmp_path / "B" / "checkpoints" / "step_6"
    assert run.saved_step == 6
