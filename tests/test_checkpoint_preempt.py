"""SIGTERM / SIGINT stop a run at its next safe point (`agentrl.run.checkpoint.preempt`): the request, the
second signal that exits at once, and the batch wait a stop gives up only when that loses nothing.
(The whole path on the real CLI: tests/test_e2e_resume.py.)"""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

from agentrl.run.buffer import StalenessBuffer
from agentrl.run.checkpoint.preempt import RunStopped, StopRequest
from test_checkpoint import _episode
from test_checkpoint_branch import _run_in

ROOT = Path(__file__).resolve().parents[1]

TWICE = """
import asyncio, logging, os, signal, sys
sys.path.insert(0, {root!r})
logging.basicConfig(level=logging.INFO)
from agentrl.run.checkpoint.preempt import StopRequest

async def main():
    stop = StopRequest()
    stop.install()
    os.kill(os.getpid(), signal.SIGTERM)
    await asyncio.wait_for(stop.wait(), 10)
    print("requested", stop.name, flush=True)
    os.kill(os.getpid(), signal.SIGINT)  # a second signal: out at once, whatever the run is doing
    await asyncio.sleep(30)
    print("not reached", flush=True)

asyncio.run(main())
"""


def test_a_second_signal_exits_at_once():
    proc = subprocess.run([sys.executable, "-c", TWICE.format(root=str(ROOT))], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 130, proc.stderr  # 128 + SIGINT
    assert proc.stdout == "requested SIGTERM\n"
    assert "SIGTERM received: stopping at the next safe point" in proc.stderr
    assert "second signal (SIGINT) while stopping on SIGTERM: exiting now, without a checkpoint" in proc.stderr


def test_run_stopped_is_the_exit_status_of_the_signal():
    assert RunStopped(15).code == 143 and RunStopped(2).code == 130
    assert isinstance(RunStopped(15), SystemExit) and not isinstance(RunStopped(15), Exception)


def _waiting_run(tmp_path: Path, max_staleness: int):
    run = _run_in(tmp_path)
    run.buffer = StalenessBuffer(batch_size=2, group_size=1, max_staleness=max_staleness)
    run.stop = StopRequest()
    return run


def test_a_stop_gives_up_the_batch_wait_when_it_holds_nothing(tmp_path):
    async def scenario():
        run = _waiting_run(tmp_path, max_staleness=4)
        run.stop.install()  # the test runs in the main thread: real handlers
        waiting = asyncio.create_task(run._batch_or_stop(learner_version=0))
        await asyncio.sleep(0.01)
        assert not waiting.done()
        run.stop._on_signal(15)  # what the loop's SIGTERM handler calls
        assert await asyncio.wait_for(waiting, 5) is None
        assert run.buffer.stats()["groups_in_buffer"] == 0 and len(asyncio.all_tasks()) == 1  # nothing left behind
        run.stop.uninstall()

    asyncio.run(scenario())


def test_a_stop_waits_for_the_batch_once_the_wait_dropped_a_stale_group(tmp_path):
    """A group dropped as stale inside get_batch is named only in the batch it returns: giving up that
    wait would lose its position, so the stop waits for the batch (it is trained, then the run stops)."""
    from agentrl.types import Group

    async def scenario():
        run = _waiting_run(tmp_path, max_staleness=0)
        buffer = run.buffer
        for _ in range(2):
            await buffer.admit()
        buffer.put(Group(0, {}, [_episode(0, version=0)], 0))
        waiting = asyncio.create_task(run._batch_or_stop(learner_version=1))  # group 0 is stale at version 1
        await asyncio.sleep(0.01)
        assert buffer.stats()["groups_dropped_stale"] == 1 and not waiting.done()
        buffer.set_engine_version(1)
        await asyncio.wait_for(buffer.admit(), 5)
        run.stop._on_signal(15)
        await asyncio.sleep(0.01)
        assert not waiting.done()  # still waiting: the drop is held by the pending call
        buffer.put(Group(1, {}, [_episode(1, version=1)], 1))
        buffer.put(Group(2, {}, [_episode(2, version=1)], 1))
        assembly = await asyncio.wait_for(waiting, 5)
        assert [g.group_id for g in assembly.groups] == [1, 2] and assembly.dropped_ids == [0]

    asyncio.run(scenario())
