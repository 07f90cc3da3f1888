"""Start an OpenEnv server app as a subprocess on loopback, once per process, for `envs.openenv_env`.

`env.kwargs.app: "pkg.module:app"` names an installed OpenEnv server (the FastAPI app that
`openenv.core.env_server.create_app` returns). Every episode of a run needs the same server, so the first
`ensure_server(app)` launches `python -m envs.openenv_server pkg.module:app` (this file's `main`: the app
under uvicorn) on 127.0.0.1 and a free port and the others share it; it is stopped at interpreter exit. No
Docker: the app runs in this venv, so a user's env package only has to be importable here.

Answers this run only: `main` wraps the app in agentrl.utils.local_only_asgi (a foreign Host or Origin is a
403, also on the WebSocket handshake, a non-JSON POST a 415), and every launch draws a bearer token of its
own (`secrets.token_urlsafe`), handed to the server in its environment (never argv, never logged) and sent
by this process's clients (`LocalServer.headers`, `token_for(url)`): a request without it is a 401. The
server ends with the process that started it, a kill -9 included: a thread of `main` watches its parent
process id. (Not PR_SET_PDEATHSIG: that fires when the *thread* that forked ends, and `launch` runs in a
short-lived starter thread.)

A server that exited (killed, crashed) is started again by the next `ensure_server`: the episodes that
were talking to it already failed with env_error, and the run goes on. A server that cannot start
(import error, port trouble, no /health within `start_timeout_s`) raises `ServerStartError` with the
tail of its log, so the first failing episode's error says why.

Restarts are bounded (`Restarts`): the n-th restart within `window_s` waits `backoff_s * 2**(n-1)`
(at most 30 s) first, and past `max_restarts` within the window none is tried: `RestartLimitError`
(a ServerStartError) fails every episode that needs the app, naming the count and the last log.
"""

from __future__ import annotations

import argparse
import asyncio
import atexit
import collections
import concurrent.futures
import os
import secrets
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Deque

from agentrl.utils.local_only import TOKEN_ENV

HOST = "127.0.0.1"
PARENT_ENV = "AGENTRL_PARENT_PID"  # the process whose end ends the server (main's parent watch)
_LOG_TAIL = 2000  # characters of the server's log quoted in errors


class ServerStartError(RuntimeError):
    """The OpenEnv app could not be started (or died while starting)."""


class RestartLimitError(ServerStartError):
    """The app exited or failed to start more often than `Restarts.max_restarts` within its window."""


@dataclass(frozen=True)
class Restarts:
    """How often a dead app is started again: at most `max_restarts` within `window_s` seconds, the
    n-th after `backoff_s * 2**(n-1)` seconds (capped at 30 s), so a crashing app cannot spin."""

    max_restarts: int = 3
    window_s: float = 600.0
    backoff_s: float = 1.0

    def delay_s(self, n: int) -> float:
        return 0.0 if n <= 0 else min(30.0, self.backoff_s * 2 ** (n - 1))


@dataclass
class LocalServer:
    app: str
    url: str
    proc: subprocess.Popen
    log_path: Path
    token: str = field(default="", repr=False)

    @property
    def headers(self) -> dict[str, str]:
        """What every request to this server carries: its bearer token."""
        return {"Authorization": f"Bearer {self.token}"} if self.token else {}

    def alive(self) -> bool:
        return self.proc.poll() is None

    def log_tail(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-_LOG_TAIL:]
        except OSError:
            return ""

    def stop(self, grace_s: float = 5.0) -> None:
        """Terminate (then kill) the process and remove its log."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(grace_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log_path.unlink(missing_ok=True)
        _TOKENS.pop(self.url, None)


# One server per app string; a threading lock, not an asyncio one, because episodes may run on more
# than one event loop (eval and train loops, tests) while the process is the unit that owns servers.
_SERVERS: dict[str, LocalServer] = {}
_STARTING: dict[str, concurrent.futures.Future] = {}
_FAILURES: dict[str, Deque[float]] = collections.defaultdict(collections.deque)  # exits and failed starts
_LAST_ERROR: dict[str, str] = {}
_TOKENS: dict[str, str] = {}  # url -> bearer token of each server this process launched and has not stopped
_LOCK = threading.Lock()


def token_for(url: str) -> dict[str, str]:
    """The Authorization header for `url` when this process launched the server there; {} otherwise
    (a server the user started: no token)."""
    token = _TOKENS.get(url.rstrip("/"))
    return {"Authorization": f"Bearer {token}"} if token else {}


def free_port() -> int:
    """A port nobody listens on now (the OS's pick); uvicorn binds it a moment later."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((HOST, 0))
        return sock.getsockname()[1]


def _child_env() -> dict[str, str]:
    # The child must import what this process can: the repo root (cwd) and this process's sys.path,
    # which pytest or a PYTHONPATH may have extended.
    paths = [p or os.getcwd() for p in sys.path if p == "" or Path(p).is_dir()]
    return {**os.environ, "PYTHONPATH": os.pathsep.join([os.getcwd(), *paths]), "ENABLE_WEB_INTERFACE": "false"}


# Loopback never goes through an HTTP proxy, whatever http_proxy says.
_NO_PROXY = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def _healthy(url: str, headers: dict[str, str], timeout_s: float = 1.0) -> bool:
    try:
        with _NO_PROXY.open(urllib.request.Request(f"{url}/health", headers=headers), timeout=timeout_s) as reply:
            return reply.status == 200
    except (urllib.error.URLError, OSError, ValueError):
        return False


def launch(app: str, start_timeout_s: float = 60.0, attempts: int = 3) -> LocalServer:
    """Start `app` under uvicorn (`main`) with a fresh token and wait for GET /health; blocking. Retries a
    port taken in between."""
    if ":" not in app:
        raise ValueError(f"env.kwargs.app {app!r} must look like 'package.module:app' (an OpenEnv server app)")
    last = ""
    for _ in range(attempts):
        port = free_port()
        log = Path(tempfile.mkstemp(prefix="openenv-server-", suffix=".log")[1])
        token = secrets.token_urlsafe(32)
        cmd = [sys.executable, "-m", "envs.openenv_server", app, "--host", HOST, "--port", str(port)]
        env = {**_child_env(), TOKEN_ENV: token, PARENT_ENV: str(os.getpid())}
        with open(log, "wb") as out:
            proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    env=env, start_new_session=True)  # no terminal signals
        server = LocalServer(app, f"http://{HOST}:{port}", proc, log, token)
        deadline = time.monotonic() + start_timeout_s
        while time.monotonic() < deadline:
            if _healthy(server.url, server.headers):
                _TOKENS[server.url] = token
                return server
            if not server.alive():
                break
            time.sleep(0.1)
        else:
            last = server.log_tail()
            server.stop()
            raise ServerStartError(f"OpenEnv app {app!r} did not answer GET {server.url}/health within "
                                   f"{start_timeout_s:.0f} s (env.kwargs.start_timeout_s); its log:\n{last}")
        last = server.log_tail()
        server.stop()  # exited: only its log to remove
        if "address already in use" not in last.lower():
            break
    raise ServerStartError(f"OpenEnv app {app!r} exited while starting (python -m envs.openenv_server {app}); "
                           f"its log:\n{last}")


def _failed(app: str, why: str) -> None:
    """Record an exit or a failed start of `app` (under _LOCK)."""
    _FAILURES[app].append(time.monotonic())
    _LAST_ERROR[app] = why


def _restarts_so_far(app: str, policy: Restarts) -> int:
    """Failures of `app` within the policy's window (under _LOCK); older ones are forgotten."""
    failures, now = _FAILURES[app], time.monotonic()
    while failures and now - failures[0] > policy.window_s:
        failures.popleft()
    return len(failures)


def start_or_reuse(app: str, start_timeout_s: float, policy: Restarts = Restarts()) -> concurrent.futures.Future:
    """The future of the live server for `app`, starting one in a thread if there is none (bounded by `policy`)."""
    future: concurrent.futures.Future = concurrent.futures.Future()
    with _LOCK:
        server = _SERVERS.get(app)
        if server is not None and server.alive():
            future.set_result(server)
            return future
        if app in _STARTING:
            return _STARTING[app]
        if server is not None:  # exited since: say so once, then start a fresh one
            print(f"openenv: server {app} at {server.url} exited with code {server.proc.returncode}",
                  file=sys.stderr)
            _failed(app, f"exited with code {server.proc.returncode}; its log:\n{server.log_tail()}")
            del _SERVERS[app]
            server.stop()
        n = _restarts_so_far(app, policy)
        if n > policy.max_restarts:
            future.set_exception(RestartLimitError(
                f"OpenEnv app {app!r} exited or failed to start {n} times within {policy.window_s:g} s, more than "
                f"the {policy.max_restarts} restarts allowed (env.kwargs.max_restarts, restart_window_s): not "
                f"starting it again. Last failure: {_LAST_ERROR.get(app, '')[-_LOG_TAIL:]}"))
            return future
        _STARTING[app] = future
    delay = policy.delay_s(n)
    if n:
        print(f"openenv: starting {app} again in {delay:g} s (restart {n} of at most {policy.max_restarts} "
              f"within {policy.window_s:g} s)", file=sys.stderr)

    def run() -> None:
        time.sleep(delay)
        try:
            started = launch(app, start_timeout_s)
        except BaseException as exc:  # noqa: BLE001 - handed to every waiter
            with _LOCK:
                _STARTING.pop(app, None)
                _failed(app, str(exc))
            future.set_exception(exc)
            return
        with _LOCK:
            _SERVERS[app] = started
            _STARTING.pop(app, None)
        future.set_result(started)

    threading.Thread(target=run, name=f"openenv-start-{app}", daemon=True).start()
    return future


async def ensure_server(app: str, start_timeout_s: float = 60.0, policy: Restarts = Restarts()) -> LocalServer:
    """The running server for `app` (started on first use, or again after it exited, within `policy`)."""
    # shield: an episode cancelled by its own deadline while waiting must not cancel the start for the others
    return await asyncio.shield(asyncio.wrap_future(start_or_reuse(app, start_timeout_s, policy)))


def running(app: str) -> LocalServer | None:
    """The server started for `app`, if any (tests use it to kill the server)."""
    return _SERVERS.get(app)


@atexit.register
def stop_all() -> None:
    """Stop every server this process started."""
    with _LOCK:
        servers = list(_SERVERS.values())
        _SERVERS.clear()
    for server in servers:
        server.stop()


# ------------------------------------------------------------------ the server process


def watch_parent(parent: int, period_s: float = 0.2) -> threading.Thread:
    """End this process once `parent` is no longer its parent (it died, a kill -9 included, and this one was
    handed to init or a subreaper): SIGTERM to itself (uvicorn's graceful stop), then exit after 5 s."""

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(period_s)
        print(f"openenv server: the process that started it ({parent}) is gone; stopping", file=sys.stderr,
              flush=True)
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5.0)
        os._exit(1)

    thread = threading.Thread(target=watch, name="parent-watch", daemon=True)
    thread.start()
    return thread


def main(argv: list[str] | None = None) -> None:
    """`python -m envs.openenv_server pkg.module:app --port N`: the app behind LocalOnlyASGI under uvicorn; the
    bearer token from $AGENTRL_SERVER_TOKEN (none without it), the parent to outlive not from $AGENTRL_PARENT_PID."""
    parser = argparse.ArgumentParser(description="an OpenEnv server app, answering local programs only")
    parser.add_argument("app", help="package.module:app")
    parser.add_argument("--host", default=HOST)
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--log-level", default="warning")
    args = parser.parse_args(argv)
    token = os.environ.pop(TOKEN_ENV, "") or None  # out of the environment the app's own subprocesses inherit
    parent = os.environ.pop(PARENT_ENV, "")
    if parent:
        watch_parent(int(parent))
    import uvicorn
    from uvicorn.importer import import_from_string

    from agentrl.utils.local_only_asgi import LocalOnlyASGI

    app = LocalOnlyASGI(import_from_string(args.app), args.host, token=token)
    uvicorn.run(app, host=args.host, port=args.port, log_level=args.log_level)


if __name__ == "__main__":
    main()
