"""SIGTERM to a test run stops what its tests started (tests/unwind_on_sigterm.py): a real pytest run on two
xdist workers, the way scripts/test.sh runs the suite, whose tests each hold a child process (a module
fixture's, and one inside `subprocess.run`), is sent SIGTERM; both children must be gone once it exits.
Without the plugin both outlive the run (re-parented to init)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

TESTS = Path(__file__).resolve().parent

HOLDERS = '''
import os, subprocess, sys, time
from pathlib import Path

import pytest

OUT = Path(os.environ["UNWIND_OUT"])


def sleeper(name):
    """A child that writes its pid to OUT/<name>.pid, then sleeps."""
    code = "import os, sys, time; open(sys.argv[1], 'w').write(str(os.getpid())); time.sleep(600)"
    return [sys.executable, "-c", code, str(OUT / f"{name}.pid")]


@pytest.fixture(scope="module")
def held():
    child = subprocess.Popen(sleeper("fixture"))
    try:
        yield child
    finally:
        child.kill()
        child.wait()


def test_holds_a_fixture_child(held):
    time.sleep(600)


def test_waits_in_subprocess_run():
    subprocess.run(sleeper("run"))  # kills its child when an exception (KeyboardInterrupt) ends the wait
'''


def _alive(pid: int) -> bool:
    """Whether pid is a live process (a zombie, dead but not yet reaped, counts as gone)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state != "Z"


def _wait_for(what, deadline_s: float, step_s: float = 0.1):
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        if what():
            return True
        time.sleep(step_s)
    return what()


def test_sigterm_to_an_xdist_run_stops_the_processes_its_tests_started(tmp_path: Path) -> None:
    (tmp_path / "test_holders.py").write_text(HOLDERS)
    out = tmp_path / "out"
    out.mkdir()
    env = dict(os.environ, UNWIND_OUT=str(out), PYTHONPATH=os.pathsep.join(
        [str(TESTS), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep))
    env.pop("PYTEST_XDIST_WORKER", None)  # this test may itself run in a worker
    run = subprocess.Popen([sys.executable, "-m", "pytest", "-q", "-n", "2", "-p", "unwind_on_sigterm",
                            "-p", "no:cacheprovider", "test_holders.py"], cwd=tmp_path, env=env,
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    pids: list[int] = []
    try:
        # Both tests are running (each on a worker) once both children have written their pids.
        assert _wait_for(lambda: len(list(out.glob("*.pid"))) == 2, 120), "the two holding tests never started"
        assert _wait_for(lambda: all(p.read_text() for p in out.glob("*.pid")), 10)
        pids = [int(p.read_text()) for p in sorted(out.glob("*.pid"))]
        assert all(_alive(pid) for pid in pids)
        run.send_signal(signal.SIGTERM)
        output, _ = run.communicate(timeout=120)
        assert "KeyboardInterrupt" in output and "SIGTERM" in output, output
        # The run has exited; the workers waited for their children (fixture finally, subprocess.run), so
        # none is left. A short grace covers a child still being reaped as the controller exits.
        assert _wait_for(lambda: not any(_alive(pid) for pid in pids), 10), \
            f"left running after the run ended: {[pid for pid in pids if _alive(pid)]}\n{output}"
    finally:
        if run.poll() is None:
            run.kill()
            run.wait()
        for pid in pids:
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)
