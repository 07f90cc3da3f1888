"""The agent process in bubblewrap, with network only to its own session.

Inside: fresh user, pid, network, ipc and uts namespaces (`--unshare-all`): no network but a loopback
of its own; a read-only view of the host's root, a fresh /tmp, a fresh /proc of its own processes, the
host's HOME hidden under an empty tmpfs (but for the trainer's own Python and the folder the run started
in, read-only, when they live there or in /tmp: another program installed under HOME is not visible, install it elsewhere), and the episode's working directory the one writable host
folder (HOME points there). Its first process is sandbox_forward.py, listening on 127.0.0.1:PORT and
piping each connection to a unix socket bound in from the host; `OPENAI_BASE_URL` and
`ANTHROPIC_BASE_URL` name that port.

Outside: `SessionProxy` serves that socket and forwards a request to the run's endpoint only when its
path is under the episode's own session (/sessions/<sid>/); any other path is a 403, so the program
can reach neither another episode's ledger nor the endpoint's out-of-session routes.

bwrap runs with --die-with-parent and its pid namespace dies with its first process, so the group kill
of process_agent.child reaches everything the program started, setsid or not.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path
from urllib.parse import urlsplit

from aiohttp import ClientSession, ClientTimeout, web

from agentrl.config import ConfigError

FORWARDER = Path(__file__).with_name("sandbox_forward.py")
PORT = 8080  # the sandbox's own loopback: nothing else listens there
# Request headers the proxy does not pass on: its own connection's, and Host (the endpoint checks
# Host against its own names, agentrl.utils.local_only; the upstream request sets its own).
HOP_HEADERS = {"host", "connection", "keep-alive", "proxy-connection", "transfer-encoding", "upgrade", "te",
               "trailer", "content-length"}


def bwrap_path() -> str:
    """The bwrap executable; ConfigError saying how to install it when there is none."""
    tool = shutil.which("bwrap")
    if tool is None:
        raise ConfigError("env.kwargs.sandbox: bubblewrap (bwrap) is not on PATH; install it "
                          "(`apt-get install bubblewrap`, or ./scripts/install.sh sandbox) or set sandbox: false")
    return tool


def sandbox_argv(argv: list[str], episode: Path, socket_path: Path, home: str | None) -> list[str]:
    """`argv` wrapped in bwrap and the forwarder; the episode folder (working directory and socket)
    is the only writable host folder, bound at its own path."""
    args = [bwrap_path(), "--unshare-all", "--die-with-parent", "--ro-bind", "/", "/", "--dev", "/dev",
            "--proc", "/proc", "--tmpfs", "/tmp"]
    hidden = [Path("/tmp")]
    if home and Path(home).resolve() not in (Path("/"), episode) and Path(home).is_dir():
        hidden.append(Path(home).resolve())
        args += ["--tmpfs", str(hidden[-1])]
    # ... but the trainer's interpreter (pyenv, a venv) and the folder the run started in (the program's
    # files, `{run_cwd}`) stay visible, read-only, where they live under a hidden folder (a clone in /tmp)
    for folder in sorted({Path(p).resolve() for p in (sys.prefix, sys.base_prefix, os.getcwd())}):
        if any(folder.is_relative_to(h) and folder != h for h in hidden):
            args += ["--ro-bind", str(folder), str(folder)]
    args += ["--bind", str(episode), str(episode), "--chdir", str(episode / "work")]
    return [*args, sys.executable, "-I", "-S", str(FORWARDER), str(PORT), str(socket_path), "--", *argv]


def sandbox_urls(base_url: str) -> tuple[str, str, str]:
    """(the session's base URL as seen inside the sandbox, the endpoint's origin outside, the session's
    path prefix /sessions/<sid>/ that the proxy lets through)."""
    parts = urlsplit(base_url)
    path = parts.path.rstrip("/")
    prefix = path[:-len("v1")] if path.endswith("/v1") else path + "/"
    return f"http://127.0.0.1:{PORT}{path}", f"{parts.scheme}://{parts.netloc}", prefix


class SessionProxy:
    """An HTTP server on `socket_path` forwarding requests under `prefix` (the episode's
    /sessions/<sid>/) to `origin`, streaming the response (server-sent events pass through as they come)."""

    def __init__(self, socket_path: Path, origin: str, prefix: str, timeout_s: float) -> None:
        self.socket_path, self.origin, self.prefix = socket_path, origin, prefix
        self.timeout = ClientTimeout(total=None, sock_read=timeout_s)
        self._runner: web.AppRunner | None = None
        self._http: ClientSession | None = None

    async def __aenter__(self) -> "SessionProxy":
        app = web.Application(client_max_size=64 << 20)
        app.router.add_route("*", "/{tail:.*}", self._forward)
        self._runner = web.AppRunner(app, access_log=None, handle_signals=False)
        await self._runner.setup()
        await web.UnixSite(self._runner, str(self.socket_path)).start()
        os.chmod(self.socket_path, 0o600)
        self._http = ClientSession(self.origin, timeout=self.timeout, auto_decompress=False)
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._http is not None:
            await self._http.close()
        if self._runner is not None:
            await self._runner.cleanup()

    async def _forward(self, request: web.Request) -> web.StreamResponse:
        if not request.path.startswith(self.prefix) or ".." in request.path.split("/"):
            return web.json_response({"error": {"message": f"this sandbox reaches only {self.prefix}",
                                                "type": "permission_error"}}, status=403)
        headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP_HEADERS}
        body = await request.read()
        assert self._http is not None
        async with self._http.request(request.method, request.rel_url, headers=headers, data=body) as upstream:
            response = web.StreamResponse(status=upstream.status, reason=upstream.reason, headers={
                k: v for k, v in upstream.headers.items() if k.lower() not in HOP_HEADERS})
            await response.prepare(request)
            async for chunk in upstream.content.iter_any():
                await response.write(chunk)
            await response.write_eof()
            return response

