"""`python -m agentrl.<command>` for the tests, forked from a warm interpreter instead of started cold.

Every command the end-to-end tests run imports torch, transformers, DeepSpeed and vLLM first: about 12
core-seconds on this machine before it does anything, for each of the suite's ~50 runs, on 2 cores. Each
pytest worker keeps one server process (started at its first command) that has imported them once; a
command is a fork of it that sets the command's argv, environment, working directory and standard
streams and runs the module as `python -m` would. What the tests see is a process as
`subprocess.Popen` gives one: its own pid (signals, kill -9, its child processes), exit status,
stdout and stderr.

A fork differs from a fresh interpreter only in what was read while the server imported: environment
variables that the libraries read at import (libgomp's OpenMP settings, Hugging Face's paths). So a
command goes to the server only when its environment differs from the server's in variables that are read
at run time (`RUNTIME_VARIABLES`); any other command is started as a plain subprocess. Commands are
`python -m` of this repository's own modules (`MODULES`); the doc tests run the README's commands as a
user types them and keep real processes.

    python tests/warm_python.py SOCKET      # the server (the client below starts it)
"""

from __future__ import annotations

import atexit
import json
import os
import runpy
import select
import selectors
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MODULES = ("agentrl.",)  # the commands the server runs: `python -m agentrl.<command>`
# Read when a command runs, not when the server imported: a command may set them to its own values.
RUNTIME_VARIABLES = ("PYTHONPATH", "CI", "AGENTRL_", "PYTEST_", "VLLM_", "RAY_")
PRELOAD = ("torch", "transformers", "deepspeed", "vllm", "vllm.v1.engine.async_llm", "ray", "agentrl.train",
           "agentrl.learner", "agentrl.rollout.engine", "transformers.models.qwen2.modeling_qwen2")
HEADER = struct.Struct("!Q")  # the request's length; the command's stdin, stdout, stderr ride along with it


# ---------------------------------------------------------------------------------------------- server


def serve(path: str) -> dict:
    """Accept commands until stdin closes (the pytest worker exited). Returns, in a forked child only, the
    request that child is to run."""
    # sys.path less what this script's directory and PYTHONPATH added: the installation's own entries.
    own = {str(Path(__file__).parent), *os.environ.get("PYTHONPATH", "").split(os.pathsep)}
    base_path = [p for p in sys.path if p not in own]
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(16)
    for name in PRELOAD:  # after bind: a first command waits in the backlog instead of failing to connect
        __import__(name)
    sel = selectors.DefaultSelector()
    sel.register(listener, selectors.EVENT_READ, "accept")
    sel.register(sys.stdin, selectors.EVENT_READ, "parent")
    children: dict[int, tuple[int, socket.socket]] = {}  # pidfd -> (pid, connection)
    while True:
        for key, _ in sel.select():
            if key.data == "parent":
                if not os.read(sys.stdin.fileno(), 4096):
                    for pid, _conn in children.values():
                        _kill(pid)
                    return {}
            elif key.data == "accept":
                conn, _ = listener.accept()
                request, fds = _receive(conn)
                sys.stdout.flush()
                sys.stderr.flush()
                pid = os.fork()
                if pid == 0:
                    sel.close()
                    listener.close()
                    for pidfd, (_pid, other) in children.items():
                        os.close(pidfd)
                        other.close()
                    conn.close()
                    return {**request, "fds": fds, "base_path": base_path}
                for fd in fds:
                    os.close(fd)
                conn.sendall(json.dumps({"pid": pid}).encode() + b"\n")
                pidfd = os.pidfd_open(pid)
                children[pidfd] = (pid, conn)
                sel.register(pidfd, selectors.EVENT_READ, "child")
            else:
                pidfd = key.fd
                pid, conn = children.pop(pidfd)
                sel.unregister(pidfd)
                os.close(pidfd)
                _, status = os.waitpid(pid, 0)
                try:
                    conn.sendall(json.dumps({"returncode": os.waitstatus_to_exitcode(status)}).encode() + b"\n")
                except OSError:
                    pass  # the test that started it is gone
                conn.close()


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _receive(conn: socket.socket) -> tuple[dict, list[int]]:
    head, fds, _flags, _addr = socket.recv_fds(conn, HEADER.size, 3)
    while len(head) < HEADER.size:
        head += conn.recv(HEADER.size - len(head))
    (size,) = HEADER.unpack(head)
    body = b""
    while len(body) < size:
        body += conn.recv(size - len(body))
    return json.loads(body), fds


def run_request(request: dict) -> None:
    """In the forked child: become the command, as `python -m MODULE ARGS` in its directory would be."""
    for target, fd in zip((0, 1, 2), request["fds"]):
        os.dup2(fd, target)
        os.close(fd)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    # sys.path as the interpreter builds it for `-m`: the working directory, PYTHONPATH, then the
    # installation's own entries (the server's, less what its own directory and PYTHONPATH added).
    extra = [p for p in request["env"].get("PYTHONPATH", "").split(os.pathsep) if p]
    sys.path[:] = [request["cwd"], *extra, *request["base_path"]]
    module, *args = request["argv"]
    sys.argv = [module, *args]
    # `python -m` executes the module as __main__ and nothing imported it before: drop the server's copy.
    sys.modules.pop(module, None)
    package, _, name = module.rpartition(".")
    if package in sys.modules and hasattr(sys.modules[package], name):
        delattr(sys.modules[package], name)
    runpy.run_module(module, run_name="__main__", alter_sys=True)


# ---------------------------------------------------------------------------------------------- client


class WarmProcess:
    """The part of `subprocess.Popen`'s interface the tests use, for a command the server forked."""

    def __init__(self, conn: socket.socket, cmd: list[str], pipes: dict[str, int], text: bool):
        self.args = cmd
        self._conn = conn
        self._buffer = b""
        self.pid = self._message(None)["pid"]
        self.returncode: int | None = None
        mode = "r" if text else "rb"
        self.stdout = os.fdopen(pipes["stdout"], mode) if "stdout" in pipes else None
        self.stderr = os.fdopen(pipes["stderr"], mode) if "stderr" in pipes else None
        self.stdin = None

    def _message(self, timeout: float | None) -> dict:
        """The server's next line: {"pid": ...} once forked, {"returncode": ...} once the command ended."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while b"\n" not in self._buffer:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and (left <= 0 or not select.select([self._conn], [], [], left)[0]):
                raise subprocess.TimeoutExpired(self.args, timeout)
            chunk = self._conn.recv(4096)
            if not chunk:
                raise RuntimeError("tests/warm_python.py: the server closed the connection before the command ended")
            self._buffer += chunk
        line, self._buffer = self._buffer.split(b"\n", 1)
        return json.loads(line)

    def poll(self) -> int | None:
        if self.returncode is None:
            try:
                self.wait(0)
            except subprocess.TimeoutExpired:
                pass
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            self.returncode = self._message(timeout)["returncode"]
            self._conn.close()
        return self.returncode

    def communicate(self, timeout: float | None = None) -> tuple:
        """Read stdout and stderr to their end, then wait, as `Popen.communicate` does."""
        results: dict[str, object] = {}
        threads = [threading.Thread(target=lambda n=name, f=f: results.__setitem__(n, f.read()), daemon=True)
                   for name, f in (("stdout", self.stdout), ("stderr", self.stderr)) if f is not None]
        for t in threads:
            t.start()
        deadline = None if timeout is None else time.monotonic() + timeout
        for t in threads:
            t.join(None if deadline is None else max(0.0, deadline - time.monotonic()))
            if t.is_alive():
                raise subprocess.TimeoutExpired(self.args, timeout)
        self.wait(None if deadline is None else max(0.0, deadline - time.monotonic()))
        for f in (self.stdout, self.stderr):
            if f is not None:
                f.close()
        return results.get("stdout"), results.get("stderr")

    def send_signal(self, sig: int) -> None:
        if self.returncode is None:
            try:
                os.kill(self.pid, sig)
            except ProcessLookupError:
                pass

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


class _Server:
    """This process's server: started at the first command, ended when this process exits."""

    def __init__(self) -> None:
        self.dir = tempfile.mkdtemp(prefix="warm-python-")
        self.path = os.path.join(self.dir, "socket")
        self.env = {**os.environ, "PYTHONPATH": str(ROOT)}
        self.log = open(os.path.join(self.dir, "server.log"), "wb")
        self.proc = subprocess.Popen([sys.executable, __file__, self.path], cwd=ROOT, env=self.env,
                                     stdin=subprocess.PIPE, stdout=self.log, stderr=subprocess.STDOUT)
        atexit.register(self.close)

    def connect(self) -> socket.socket:
        deadline = time.monotonic() + 120
        while True:
            conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                conn.connect(self.path)
                return conn
            except (FileNotFoundError, ConnectionRefusedError):
                conn.close()
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"tests/warm_python.py: the server did not start; its log: "
                                       f"{Path(self.dir, 'server.log').read_text()[-3000:]}") from None
                time.sleep(0.05)

    def serves(self, env: dict[str, str]) -> bool:
        """Whether a command with this environment runs the same forked from the server as started cold."""
        keys = set(env) | set(self.env)
        return all(env.get(k) == self.env.get(k) for k in keys
                   if not k.startswith(RUNTIME_VARIABLES))

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.stdin.close()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        self.log.close()


_server: _Server | None = None


def _module(cmd: list[str]) -> str | None:
    if len(cmd) >= 3 and cmd[0] == sys.executable and cmd[1] == "-m" and cmd[2].startswith(MODULES):
        return cmd[2]
    return None


def Popen(cmd: list[str], *, cwd=None, env=None, stdout=None, stderr=None, text: bool = False):  # noqa: N802
    """`subprocess.Popen(cmd, ...)`, forked from the warm server when it can be (see the module's doc)."""
    global _server
    env = dict(os.environ if env is None else env)
    if _module(cmd) is None or os.environ.get("WARM_PYTHON") == "0":
        return subprocess.Popen(cmd, cwd=cwd, env=env, stdout=stdout, stderr=stderr, text=text)
    if _server is None:
        _server = _Server()
    if not _server.serves(env):
        return subprocess.Popen(cmd, cwd=cwd, env=env, stdout=stdout, stderr=stderr, text=text)
    pipes: dict[str, int] = {}
    theirs: list[int] = [os.open(os.devnull, os.O_RDONLY)]
    for name, spec, default in (("stdout", stdout, 1), ("stderr", stderr, 2)):
        if spec == subprocess.PIPE:
            read, write = os.pipe()
            pipes[name] = read
            theirs.append(write)
        elif spec == subprocess.STDOUT:
            theirs.append(os.dup(theirs[1]))
        elif spec == subprocess.DEVNULL:
            theirs.append(os.open(os.devnull, os.O_WRONLY))
        elif spec is None:
            theirs.append(os.dup(default))
        else:
            theirs.append(os.dup(spec if isinstance(spec, int) else spec.fileno()))
    body = json.dumps({"argv": cmd[2:], "env": env, "cwd": str(cwd or os.getcwd())}).encode()
    conn = _server.connect()
    try:
        socket.send_fds(conn, [HEADER.pack(len(body))], theirs)
        conn.sendall(body)
    finally:
        for fd in theirs:
            os.close(fd)
    return WarmProcess(conn, cmd, pipes, text)


def run(cmd: list[str], *, cwd=None, env=None, capture_output: bool = False, text: bool = False,
        timeout: float | None = None, check: bool = False) -> subprocess.CompletedProcess:
    """`subprocess.run(cmd, ...)` through `Popen` above."""
    pipe = subprocess.PIPE if capture_output else None
    proc = Popen(cmd, cwd=cwd, env=env, stdout=pipe, stderr=pipe, text=text)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        raise
    if check and proc.returncode:
        raise subprocess.CalledProcessError(proc.returncode, cmd, out, err)
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


if __name__ == "__main__":
    job = serve(sys.argv[1])
    if job:  # a forked child: this process is now the command
        run_request(job)
