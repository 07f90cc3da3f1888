"""tests/warm_python.py: a command forked from the warm server is the process a cold `python -m` gives."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import warm_python

ROOT = Path(__file__).resolve().parents[1]

PROBE = textwrap.dedent("""
    import json, os, sys, time
    threads = __import__("torch").get_num_threads() if "--threads" in sys.argv else None
    print(json.dumps({"argv": sys.argv[1:], "name": __name__, "cwd": os.getcwd(), "path": sys.path,
                      "var": os.environ.get("AGENTRL_PROBE"), "main": sys.modules["__main__"].__file__,
                      "threads": threads}))
    print("to stderr", file=sys.stderr)
    if "--wait" in sys.argv:
        time.sleep(300)
    sys.exit(int(sys.argv[1]))
""")


def probe_env(tmp_path: Path, monkeypatch) -> dict:
    """A module `agentrl_probe` on PYTHONPATH that the server runs (as it runs `agentrl.*`)."""
    lib = tmp_path / "lib"
    lib.mkdir()
    (lib / "agentrl_probe.py").write_text(PROBE)
    monkeypatch.setattr(warm_python, "MODULES", ("agentrl.", "agentrl_probe"))
    return {**os.environ, "PYTHONPATH": f"{lib}{os.pathsep}{ROOT}", "AGENTRL_PROBE": "set by the test"}


def test_a_forked_command_sees_what_a_cold_one_sees(tmp_path, monkeypatch):
    """Same stdout (argv, __name__, working directory, the whole sys.path, the command's environment,
    the __main__ file), same stderr, same exit status; and it really was forked (a cold start would pass
    too, so the check that it was is the pid's parent: the server, not this process)."""
    env = probe_env(tmp_path, monkeypatch)
    cmd = [sys.executable, "-m", "agentrl_probe", "3", "two words"]
    cold = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    warm = warm_python.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=180)
    assert (warm.returncode, warm.stdout, warm.stderr) == (cold.returncode, cold.stdout, cold.stderr)
    seen = json.loads(warm.stdout)
    assert seen["argv"] == ["3", "two words"] and seen["name"] == "__main__" and seen["var"] == "set by the test"
    assert seen["path"][:2] == [str(tmp_path), str(tmp_path / "lib")]
    proc = warm_python.Popen(cmd, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert isinstance(proc, warm_python.WarmProcess)
    assert parent(proc.pid) == server_pid(env)
    out, err = proc.communicate(timeout=60)
    assert err is None and out == cold.stdout + cold.stderr and proc.returncode == 3


def test_signals_reach_the_command_and_its_status_comes_back(tmp_path, monkeypatch):
    """kill -9 ends it with -9 as Popen reports it; poll() is None while it runs, wait(timeout) raises
    TimeoutExpired as Popen's does."""
    env = probe_env(tmp_path, monkeypatch)
    proc = warm_python.Popen([sys.executable, "-m", "agentrl_probe", "0", "--wait"], cwd=tmp_path, env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    assert isinstance(proc, warm_python.WarmProcess)
    assert json.loads(proc.stdout.readline())["argv"] == ["0", "--wait"]
    assert proc.poll() is None
    try:
        proc.wait(timeout=0.2)
        raise AssertionError("wait returned while the command runs")
    except subprocess.TimeoutExpired:
        pass
    proc.send_signal(signal.SIGKILL)
    deadline = time.monotonic() + 30
    while proc.poll() is None:  # poll alone sees it end, as Popen's does
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert proc.returncode == -signal.SIGKILL and proc.wait(timeout=0) == -signal.SIGKILL


def test_a_command_whose_import_time_environment_differs_gets_a_server_started_with_it(tmp_path, monkeypatch):
    """OMP_NUM_THREADS is read when torch loads libgomp, in the server, before any command: a command
    that sets it is forked from a server started with it, and its torch runs the threads a cold start's
    does. With one server allowed: while its command runs, a command of another environment starts cold;
    once it is idle, it makes room for that environment's server. (Its own servers, closed at the end:
    the worker's stay for the other tests.)"""
    monkeypatch.setattr(warm_python, "_servers", {})
    monkeypatch.setattr(warm_python, "MAX_SERVERS", 1)
    base = probe_env(tmp_path, monkeypatch)
    one, two = {**base, "OMP_NUM_THREADS": "1"}, {**base, "OMP_NUM_THREADS": "2"}
    assert warm_python.import_time(one) != warm_python.import_time(os.environ)
    cmd = [sys.executable, "-m", "agentrl_probe", "0", "--threads"]
    try:
        for env, threads in ((one, 1), (two, 2)):
            cold = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
            if env is two:  # the server of `one` is busy: `two` starts cold
                waiting = warm_python.Popen([*cmd, "--wait"], cwd=tmp_path, env=one, stdout=subprocess.PIPE,
                                            stderr=subprocess.DEVNULL)
                waiting.stdout.readline()
                assert isinstance(warm_python.Popen(cmd, cwd=tmp_path, env=two, stdout=subprocess.DEVNULL),
                                  subprocess.Popen)
                waiting.kill()
                waiting.communicate(timeout=30)
                first = warm_python._servers[warm_python.import_time(one)]
            proc = warm_python.Popen(cmd, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                     text=True)
            assert isinstance(proc, warm_python.WarmProcess) and parent(proc.pid) == server_pid(env)
            out, _ = proc.communicate(timeout=180)
            assert out == cold.stdout and json.loads(out)["threads"] == threads
        assert list(warm_python._servers) == [warm_python.import_time(two)] and first.proc.poll() is not None
    finally:
        for server in warm_python._servers.values():
            server.close()


def parent(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


def server_pid(env: dict) -> int:
    return warm_python._servers[warm_python.import_time(env)].proc.pid
