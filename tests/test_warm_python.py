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

import psutil

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

# A command that starts multiprocessing's fork server (as agentrl.rollout.core_process does for the engine
# cores) and a process from it; prints what the process saw and what the server is.
FORK_SERVER_PROBE = textwrap.dedent("""
    import json, multiprocessing, os, sys, time
    from multiprocessing import forkserver

    def report(queue):
        queue.put({"var": os.environ.get("AGENTRL_PROBE"), "name": multiprocessing.current_process().name,
                   "parent": multiprocessing.parent_process().pid})

    if __name__ == "__main__":
        ctx = multiprocessing.get_context("forkserver")
        ctx.set_forkserver_preload(["json"])
        queue = ctx.SimpleQueue()
        child = ctx.Process(target=report, args=(queue,), name="probe-child")
        child.start()
        seen = queue.get()
        seen["parent"] = seen["parent"] == os.getpid()  # its multiprocessing parent is this command
        child.join()
        server = forkserver._forkserver._forkserver_pid
        with open(f"/proc/{server}/stat") as f:
            server_parent = int(f.read().rsplit(")", 1)[1].split()[1])
        with open(f"/proc/{server}/cmdline") as f:
            spawned = "multiprocessing.forkserver" in f.read()
        # The server's descriptors between requests: it closes the one it kept for the child when its
        # SIGCHLD arrives, so read until three reads agree.
        reads = []
        while len(reads) < 3 or reads[-3:] != [reads[-1]] * 3:
            reads.append(sorted(int(fd) for fd in os.listdir(f"/proc/{server}/fd")))
            time.sleep(0.2)
        print(json.dumps({"child": seen, "exitcode": child.exitcode, "server_is_my_child": server_parent == os.getpid(),
                          "server_fds": reads[-1]}))
        print(json.dumps({"server": server, "spawned": spawned}))
""")


def probe_env(tmp_path: Path, monkeypatch) -> dict:
    """A module `agentrl_probe` on PYTHONPATH that the server runs (as it runs `agentrl.*`)."""
    lib = tmp_path / "lib"
    lib.mkdir()
    (lib / "agentrl_probe.py").write_text(PROBE)
    (lib / "agentrl_probe_forks.py").write_text(FORK_SERVER_PROBE)
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


def test_a_forked_commands_fork_server_is_a_fork_of_it_that_serves_as_a_spawned_one(tmp_path, monkeypatch):
    """The fork server a command starts is its child with the same open descriptors as a spawned one (no
    copy of the command's: a kept "alive" pipe end would keep it running forever), its processes see the
    command's environment and their multiprocessing parent, and it ends when the command does. Only the
    warm one is a fork of the command rather than a fresh interpreter (the imports it saves)."""
    env = probe_env(tmp_path, monkeypatch)
    cmd = [sys.executable, "-m", "agentrl_probe_forks"]
    cold = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60)
    warm = warm_python.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=180)
    assert cold.returncode == 0 and warm.returncode == 0, cold.stderr + warm.stderr
    (cold_seen, cold_server), (warm_seen, warm_server) = ([json.loads(line) for line in run.stdout.splitlines()]
                                                          for run in (cold, warm))
    assert warm_seen == cold_seen
    assert warm_seen["child"] == {"var": "set by the test", "name": "probe-child", "parent": True}
    assert warm_seen["exitcode"] == 0 and warm_seen["server_is_my_child"]
    assert cold_server["spawned"] and not warm_server["spawned"]
    deadline = time.monotonic() + 30
    while Path(f"/proc/{warm_server['server']}").exists() and not zombie(warm_server["server"]):
        assert time.monotonic() < deadline, "the fork server outlived its command"
        time.sleep(0.1)


def zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return False


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
    the worker's stay for the other tests. They import torch alone: the threads are libgomp's, set when
    torch loads it, and two full servers cost about 40 core-seconds.)"""
    monkeypatch.setattr(warm_python, "_servers", {})
    monkeypatch.setattr(warm_python, "MAX_SERVERS", 1)
    monkeypatch.setattr(warm_python, "preload", lambda: ("torch",))
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


def test_a_scripts_python_forks_its_agentrl_commands_and_runs_the_rest_as_the_real_interpreter(tmp_path, monkeypatch):
    """A script run with `script_python`'s variables (as the doc test runs examples/pipeline/run.sh) prints
    what it prints with $PYTHON the real interpreter: `-m` commands forked, a module kept cold, `-c` and a
    script on stdin exec'd; its settings (RL_STEPS) do not change the server. A forked command is the
    server's child; a signal to $PYTHON reaches it, and the script sees the status a cold one gives."""
    env = {**probe_env(tmp_path, monkeypatch), "RL_STEPS": "2"}
    script = ('"$PYTHON" -m agentrl_probe 3 "two words"; echo "rc=$?"; "$PYTHON" -m agentrl_probe_cold 0; '
              '"$PYTHON" -c "import sys; print(sys.argv[1:])" a b; "$PYTHON" - x <<< "import sys; print(sys.argv[1:])"')
    (tmp_path / "lib" / "agentrl_probe_cold.py").write_text(PROBE)
    cold = subprocess.run(["bash", "-c", script], cwd=tmp_path, env={**env, "PYTHON": sys.executable},
                          capture_output=True, text=True, timeout=120)
    assert cold.returncode == 0 and "rc=3" in cold.stdout, cold.stderr
    with warm_python.script_python(env, script_variables=("RL_STEPS",), cold=("agentrl_probe_cold",)) as python:
        assert python["PYTHON"] != sys.executable
        server = psutil.Process(server_pid({k: v for k, v in env.items() if k != "RL_STEPS"}))
        warm = subprocess.run(["bash", "-c", script], cwd=tmp_path, env={**env, **python}, capture_output=True,
                              text=True, timeout=180)
        assert (warm.returncode, warm.stdout, warm.stderr) == (cold.returncode, cold.stdout, cold.stderr)
        assert server.children() == []  # each forked command ended
        waiting = subprocess.Popen(["bash", "-c", 'exec "$PYTHON" -m agentrl_probe 0 --wait'], cwd=tmp_path,
                                   env={**env, **python}, stdout=subprocess.PIPE, text=True)
        assert json.loads(waiting.stdout.readline())["argv"] == ["0", "--wait"]
        assert len(server.children()) == 1  # forked: the command runs below the server, not below $PYTHON
        waiting.send_signal(signal.SIGTERM)
        assert waiting.wait(timeout=30) == -signal.SIGTERM  # as `exec python ...` killed by SIGTERM reports
    assert not warm_python._servers[warm_python.import_time(
        {k: v for k, v in env.items() if k != "RL_STEPS"})].busy()
