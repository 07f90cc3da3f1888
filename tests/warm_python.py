"""`python -m agentrl.<command>` for the tests, forked from a warm interpreter instead of started cold.

Every command the end-to-end tests run imports torch, transformers, DeepSpeed and vLLM first: about 12
core-seconds on this machine before it does anything, for each of the suite's ~50 runs, on 2 cores. A
pytest worker keeps a server process (started at its first command) that has imported them once; a
command is a fork of it that sets the command's argv, environment, working directory and standard
streams and runs the module as `python -m` would. What the tests see is a process as
`subprocess.Popen` gives one: its own pid (signals, kill -9, its child processes), exit status,
stdout and stderr.

A fork differs from a fresh interpreter only in what was read while the server imported: environment
variables that the libraries read at import (libgomp's OpenMP settings, Hugging Face's paths, vLLM's
logging). So a server serves the commands of one import-time environment (`import_time`: everything
but the variables read at run time, `RUNTIME_VARIABLES`), and a command with another one gets a server
of its own, up to `MAX_SERVERS` a worker (`WARM_PYTHON_LOG=FILE` lists the servers started and the
commands started cold). Commands are `python -m` of this repository's own modules (`MODULES`); the doc
test forks its train and stage commands here too, and run.sh's stages (below), and runs the rest (those
whose stdout it checks, servers) under bash, cold.

A command that starts a local engine also starts multiprocessing's fork server for the engine cores
(agentrl.rollout.core_process), which is a fresh interpreter importing torch and vLLM again (about 17
core-seconds here, more than the command's own imports). In a forked command that server is a fork of
the command instead (`fork_server_by_fork`): the same process tree (the command's child, the engine
cores below it), file descriptors, preload and protocol, without the imports.

A script's own commands (examples/pipeline/run.sh runs its stages as `"$PYTHON" -m agentrl.sft ...`) fork
too when the test runs it with `script_python`'s variables: $PYTHON is then this file in `--exec` mode, a
client (standard library only, a few milliseconds) that has the server run `-m agentrl.*`, hands it its
own stdin, stdout and stderr, passes on the signals it gets and exits as the command did; anything else
(`-c`, a script file, stdin, a module kept cold) it hands to the real interpreter by exec.

    python tests/warm_python.py SOCKET MODULES      # the server (the client below starts it)
    python -S tests/warm_python.py --exec ARGS...   # $PYTHON in a script (see `script_python`)
    WARM_PYTHON=0 pytest ...                        # every command started cold, as before
"""

from __future__ import annotations

import atexit
import contextlib
import gc
import hashlib
import json
import multiprocessing.util
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
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MODULES = ("agentrl.",)  # the commands the server runs: `python -m agentrl.<command>`
# Read when a command runs, not when the server imported: a command may set them to its own values. (The
# torch.distributed ones are what an in-process learner test leaves in the worker's environment.)
RUNTIME_VARIABLES = ("PYTHONPATH", "CI", "AGENTRL_", "PYTEST_", "VLLM_", "RAY_", "OPENAI_", "MASTER_ADDR",
                     "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "TORCH_NCCL_")
IMPORT_TIME_VLLM = ("VLLM_LOGGING", "VLLM_CONFIGURE_LOGGING")  # but vLLM configures its logger at import,
CLI_DEFAULTS = {"VLLM_LOGGING_LEVEL": "ERROR", "VLLM_LOGGING_STREAM": "ext://sys.stderr"}  # to what the CLIs set
MAX_SERVERS = 2  # per pytest worker: each holds the imported libraries (about 1.5 GB)
# The commands' imports; the server adds what their engine cores' fork server preloads
# (core_process.PRELOAD: under `fork_server_by_fork` it imports nothing more, and prints nothing there).
PRELOAD = ("torch", "transformers", "deepspeed", "vllm", "vllm.v1.engine.async_llm", "ray", "agentrl.train",
           "agentrl.learner", "agentrl.rollout.engine", "transformers.models.qwen2.modeling_qwen2")


def preload() -> tuple[str, ...]:
    """What a server imports before its first command (a test of the server itself may import less)."""
    from agentrl.rollout import core_process  # standard library imports only

    return (*PRELOAD, *core_process.PRELOAD)


HEADER = struct.Struct("!Q")  # the request's length; the command's stdin, stdout, stderr ride along with it


# ---------------------------------------------------------------------------------------------- server


def serve(path: str, modules: list[str]) -> dict:
    """Import `modules`, then accept commands until stdin closes (the pytest worker exited). Returns, in a
    forked child only, the request that child is to run."""
    # sys.path less what this script's directory and PYTHONPATH added: the installation's own entries.
    own = {str(Path(__file__).parent), *os.environ.get("PYTHONPATH", "").split(os.pathsep)}
    base_path = [p for p in sys.path if p not in own]
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(16)
    from agentrl.utils.stdio import route_library_output

    route_library_output()  # as every agentrl command does before it imports DeepSpeed
    for name in modules:  # after bind: a first command waits in the backlog
        __import__(name)
    # setproctitle (vLLM names its engine cores with it) finds room for a title in the argv and environ
    # strings only while the C environment is where the interpreter put it; a command replaces the
    # environment, and its engine cores are forks of it (`fork_server_by_fork`). Set up here, first.
    import setproctitle

    setproctitle.getproctitle()
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
    multiprocessing.util.spawnv_passfds = fork_server_by_fork(multiprocessing.util.spawnv_passfds)
    runpy.run_module(module, run_name="__main__", alter_sys=True)


FORK_SERVER_MAIN = "from multiprocessing.forkserver import main; "  # the code forkserver.ensure_running spawns
RESET_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2)


def fork_server_by_fork(spawnv_passfds):
    """`multiprocessing.util.spawnv_passfds` that starts the fork server as a fork of this process.

    What the spawned server would be and the fork is not, it is made to be: only stdin, stdout, stderr
    and the passed descriptors open (a kept copy of the "alive" pipe's write end would keep the server
    from ever seeing its clients go), default signal handlers with none blocked (the command's would run
    in the server), no wakeup fd. The garbage collector leaves the command's objects alone, so that no
    finalizer of one of them closes a descriptor number the server has reused. Everything else (the
    resource tracker) is spawned as before."""

    def spawn_or_fork(path, args, passfds):
        if len(args) < 2 or args[-2] != "-c" or not args[-1].startswith(FORK_SERVER_MAIN):
            return spawnv_passfds(path, args, passfds)
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid:
            return pid
        code = 1
        try:
            gc.freeze()
            signal.set_wakeup_fd(-1)
            for sig in RESET_SIGNALS:
                signal.signal(sig, signal.SIG_DFL)
            signal.pthread_sigmask(signal.SIG_SETMASK, [])
            keep = {0, 1, 2, *map(int, passfds)}
            for fd in map(int, os.listdir("/proc/self/fd")):
                if fd not in keep:
                    try:
                        os.close(fd)
                    except OSError:
                        pass  # the listing's own descriptor, closed already
            exec(args[-1], {"__name__": "__forkserver__"})
            code = 0
        except SystemExit as exc:  # the server's way out: its clients are gone
            code = exc.code if isinstance(exc.code, int) else 0
        except BaseException:
            import traceback

            traceback.print_exc()
        finally:
            os._exit(code)

    return spawn_or_fork


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
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            if left is not None and not select.select([self._conn], [], [], left)[0]:
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
    """A server for commands with one import-time environment; ends when this process exits."""

    def __init__(self, env: dict[str, str]) -> None:
        self.dir = tempfile.mkdtemp(prefix="warm-python-")
        self.path = os.path.join(self.dir, "socket")
        self.log = open(os.path.join(self.dir, "server.log"), "wb")
        self.running: list[WarmProcess] = []  # its commands not known to have ended
        self.proc = subprocess.Popen([sys.executable, __file__, self.path, ",".join(preload())], cwd=ROOT,
                                     env={**env, "PYTHONPATH": str(ROOT)},
                                     stdin=subprocess.PIPE, stdout=self.log, stderr=subprocess.STDOUT)
        atexit.register(self.close)

    def connect(self) -> socket.socket:
        conn = _connect(self.path, lambda: self.proc.poll() is None)
        if conn is None:
            raise RuntimeError(f"tests/warm_python.py: the server did not start; its log: "
                               f"{Path(self.dir, 'server.log').read_text()[-3000:]}")
        return conn

    def busy(self) -> bool:
        self.running = [p for p in self.running if p.poll() is None]
        return bool(self.running)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.stdin.close()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        self.log.close()


def _connect(path: str, alive, timeout_s: float = 120.0) -> socket.socket | None:
    """A connection to the server listening at `path`, waiting while it imports; None once `alive()` is
    False or `timeout_s` has passed."""
    deadline = time.monotonic() + timeout_s
    while True:
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            conn.connect(path)
            return conn
        except (FileNotFoundError, ConnectionRefusedError):
            conn.close()
            if not alive() or time.monotonic() > deadline:
                return None
            time.sleep(0.05)


def import_time(env: dict[str, str]) -> tuple[tuple[str, str], ...]:
    """The part of `env` a server must have had when it imported: everything but `RUNTIME_VARIABLES`,
    with vLLM's logging settings as every agentrl command sets them before it imports vLLM."""
    env = {**CLI_DEFAULTS, **env}
    return tuple(sorted((k, v) for k, v in env.items()
                        if not k.startswith(RUNTIME_VARIABLES) or k.startswith(IMPORT_TIME_VLLM)))


_servers: dict[tuple, _Server] = {}  # least recently used first


def _server_for(env: dict[str, str]) -> _Server | None:
    """The server for `env`'s import-time environment, started now if there is none. At `MAX_SERVERS`
    the least recently used idle one makes room (a worker's environment changes for good once a test
    imports vLLM in the worker itself: vLLM sets LD_PRELOAD and a dozen more); None (start the command
    cold) when every one has a command running."""
    key = import_time(env)
    if key in _servers:
        _servers[key] = _servers.pop(key)
        return _servers[key]
    if len(_servers) >= MAX_SERVERS:
        idle = next((k for k, server in _servers.items() if not server.busy()), None)
        if idle is None:
            _note(f"started cold: {MAX_SERVERS} servers are busy (differing in {_differing(key)})")
            return None
        _servers.pop(idle).close()
    if _servers:
        _note(f"server for an environment differing in {_differing(key)}")
    _servers[key] = _Server(dict(key))
    return _servers[key]


def _differing(key: tuple) -> list[str]:
    first, this = dict(next(iter(_servers))), dict(key)
    return sorted(k for k in first.keys() | this.keys() if first.get(k) != this.get(k))


def _note(line: str) -> None:
    if os.environ.get("WARM_PYTHON_LOG"):
        with open(os.environ["WARM_PYTHON_LOG"], "a") as f:
            f.write(f"{os.getpid()} {line}\n")


def _module(cmd: list[str]) -> str | None:
    if len(cmd) >= 3 and cmd[0] == sys.executable and cmd[1] == "-m" and cmd[2].startswith(MODULES):
        return cmd[2]
    return None


def Popen(cmd: list[str], *, cwd=None, env=None, stdout=None, stderr=None, text: bool = False):  # noqa: N802
    """`subprocess.Popen(cmd, ...)`, forked from the warm server when it can be (see the module's doc)."""
    env = dict(os.environ if env is None else env)
    server = None if _module(cmd) is None or os.environ.get("WARM_PYTHON") == "0" else _server_for(env)
    if server is None:
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
    conn = server.connect()
    try:
        socket.send_fds(conn, [HEADER.pack(len(body))], theirs)
        conn.sendall(body)
    finally:
        for fd in theirs:
            os.close(fd)
    proc = WarmProcess(conn, cmd, pipes, text)
    server.running.append(proc)
    return proc


def run(cmd: list[str], *, cwd=None, env=None, capture_output: bool = False, text: bool = False,
        timeout: float | None = None, check: bool = False) -> subprocess.CompletedProcess:
    """`subprocess.run(cmd, ...)` through `Popen` above."""
    pipe = subprocess.PIPE if capture_output else None
    proc = Popen(cmd, cwd=cwd, env=env, stdout=pipe, stderr=pipe, text=text)
    try:
        out, err = proc.communicate(timeout=timeout)
    except BaseException as exc:  # as subprocess.run: a timeout or an interrupted test (tests/unwind_on_sigterm.py)
        proc.kill()              # ends its command; after a timeout, what it wrote is collected before raising
        if isinstance(exc, subprocess.TimeoutExpired):
            proc.communicate()
        raise
    if check and proc.returncode:
        raise subprocess.CalledProcessError(proc.returncode, cmd, out, err)
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


# ------------------------------------------------------------------------------- $PYTHON of a script

EXEC_VARIABLES = ("WARM_PYTHON_SOCKET", "WARM_PYTHON_KEY", "WARM_PYTHON_REAL", "WARM_PYTHON_MODULES",
                  "WARM_PYTHON_COLD", "WARM_PYTHON_SCRIPT_VARIABLES")
SHELL_VARIABLES = ("SHLVL", "_", "PWD", "OLDPWD")  # what bash sets in what it runs; nothing imports them


def _without(env: dict[str, str], names) -> dict[str, str]:
    return {k: v for k, v in env.items() if k not in names}


def _script_key(env: dict[str, str], script_variables) -> str:
    """The import-time environment of a script's command, as a digest: without bash's own variables and
    those only the script reads (RL_STEPS), which a server started for the test's environment lacks."""
    own = _without(env, (*EXEC_VARIABLES, *SHELL_VARIABLES, *script_variables))
    return hashlib.sha256(json.dumps(import_time(own)).encode()).hexdigest()


class _Holder:
    """Keeps a server counted busy (`_Server.busy`) while a script may still send it commands."""

    def __init__(self) -> None:
        self.done: int | None = None

    def poll(self) -> int | None:
        return self.done


@contextlib.contextmanager
def script_python(env: dict[str, str], script_variables: tuple[str, ...] = (),
                  cold: tuple[str, ...] = ()) -> Iterator[dict[str, str]]:
    """Variables to add to `env` for a script: its `"$PYTHON" -m agentrl.<command>` fork from this
    worker's server, as `Popen` forks a test's own, except the modules in `cold` (those whose stdout is
    what the test checks); `$PYTHON` with anything else runs the real interpreter. `script_variables`: the
    names in `env` only the script reads (its settings), left out of the choice of server. Just
    {"PYTHON": the real interpreter} when commands start cold here (WARM_PYTHON=0, every server busy)."""
    names = (*script_variables, "PYTHON")
    server = None if os.environ.get("WARM_PYTHON") == "0" else _server_for(_without(env, names))
    if server is None:
        yield {"PYTHON": sys.executable}
        return
    holder = _Holder()
    server.running.append(holder)
    shim = Path(server.dir, "python")
    if not shim.exists():
        shim.write_text(f"#!/bin/sh\nexec '{sys.executable}' -S '{__file__}' --exec \"$@\"\n")
        shim.chmod(0o755)
    try:
        yield {"PYTHON": str(shim), "WARM_PYTHON_SOCKET": server.path, "WARM_PYTHON_KEY": _script_key(env, names),
               "WARM_PYTHON_REAL": sys.executable, "WARM_PYTHON_MODULES": ",".join(MODULES),
               "WARM_PYTHON_COLD": ",".join(cold),
               "WARM_PYTHON_SCRIPT_VARIABLES": ",".join(names)}
    finally:
        holder.done = 0


def exec_command(args: list[str]) -> None:
    """$PYTHON ARGS of a script under `script_python`: `-m agentrl.<command>` forked from the server (when
    the script's environment is the one it imported with), everything else exec'd as the real interpreter."""
    env = dict(os.environ)
    real = env["WARM_PYTHON_REAL"]
    module = args[1] if len(args) >= 2 and args[0] == "-m" else None
    ours = (module is not None and module.startswith(tuple(env["WARM_PYTHON_MODULES"].split(",")))
            and module not in env["WARM_PYTHON_COLD"].split(","))
    if ours and _script_key(env, env["WARM_PYTHON_SCRIPT_VARIABLES"].split(",")) != env["WARM_PYTHON_KEY"]:
        _note(f"started cold from a script: {module} (its environment is not the server's)")
        ours = False
    if not ours:
        os.execv(real, [real, *args])
    body = json.dumps({"argv": args[1:], "env": _without(env, EXEC_VARIABLES), "cwd": os.getcwd()}).encode()
    conn = _connect(env["WARM_PYTHON_SOCKET"], lambda: True)  # script_python's caller started it; it may be importing
    if conn is None:
        raise RuntimeError(f"tests/warm_python.py: no server at {env['WARM_PYTHON_SOCKET']}")
    socket.send_fds(conn, [HEADER.pack(len(body))], [0, 1, 2])  # the server dups its own copies
    conn.sendall(body)
    proc = WarmProcess(conn, [real, *args], {}, False)
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT):  # the command gets them, as
        signal.signal(sig, lambda sig, _frame: proc.send_signal(sig))  # the real interpreter would have
    code = proc.wait()
    if code < 0:  # ended by a signal: end by it too, so that bash sees what it would have (128 + N)
        signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
    sys.exit(code & 0xFF)


if __name__ == "__main__":
    if sys.argv[1] == "--exec":
        exec_command(sys.argv[2:])
    job = serve(sys.argv[1], sys.argv[2].split(","))
    if job:  # a forked child: this process is now the command
        run_request(job)
