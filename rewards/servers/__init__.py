"""Reference servers (a verifier, a tool server) and what they share: `serve` runs an aiohttp app on
a port for as long as a block runs; `run_server` is the command-line runner (argparse with --host and
--port, uvloop, SIGINT/SIGTERM to stop) that each server's `main` calls with its own app and options;
`read_json` and the `errors` middleware answer a client's bad body with a 400 and a failure of the
server's own with a 500 that names an error id (logged with the traceback), never the exception.
Every app `serve` runs answers local programs only (agentrl.utils.local_only): a foreign Host or Origin is
a 403, a POST that is not application/json a 415, and with a token (--token-file, or the environment
variable AGENTRL_SERVER_TOKEN) a request without `Authorization: Bearer <token>` a 401."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import signal
from pathlib import Path
from typing import Any, AsyncIterator, Awaitable, Callable

from aiohttp import web

from agentrl.utils.http_common import BadRequestBody, internal_error, loads_request
from agentrl.utils.local_only import TOKEN_ENV, install, warn_if_exposed

log = logging.getLogger(__name__)


async def read_json(request: web.Request) -> Any:
    """The request's JSON body; BadRequestBody (answered 400 by `errors`) when it is none."""
    return loads_request(await request.read())


@web.middleware
async def errors(request: web.Request,
                 handler: Callable[[web.Request], Awaitable[web.StreamResponse]]) -> web.StreamResponse:
    try:
        return await handler(request)
    except web.HTTPException:  # aiohttp's own 404 / 405 / 413: plain, internals-free bodies
        raise
    except BadRequestBody as exc:
        return web.json_response({"error": str(exc)}, status=400)
    except Exception as exc:  # a bug of the server: the client gets an id, the log the traceback
        eid = internal_error(log, f"{request.method} {request.path}", exc)
        return web.json_response({"error": f"internal server error (error id {eid}); the server's log has "
                                           "the details"}, status=500)


@contextlib.asynccontextmanager
async def serve(app: web.Application, host: str = "127.0.0.1", port: int = 0,
                shutdown_timeout: float = 1.0, allow_hosts: tuple[str, ...] = (),
                token: str | None = None) -> AsyncIterator[str]:
    """Run `app` on host:port (0 = an ephemeral port) and yield its base URL, e.g. "http://127.0.0.1:39211".

    `shutdown_timeout` bounds how long cleanup waits for handlers still running; `allow_hosts` are Host
    names answered besides the bound address's own, `token` the bearer token every request must carry.
    """
    install(app, host, allow_hosts, token)
    runner = web.AppRunner(app, shutdown_timeout=shutdown_timeout, access_log=None)
    await runner.setup()
    try:
        site = web.TCPSite(runner, host, port)
        await site.start()
        bound_host, bound_port = runner.addresses[0][:2]
        yield f"http://{bound_host}:{bound_port}"
    finally:
        await runner.cleanup()


def _token(args: argparse.Namespace) -> str | None:
    """The bearer token from --token-file, else from $AGENTRL_SERVER_TOKEN; None = no token required."""
    text = Path(args.token_file).expanduser().read_text() if args.token_file else os.environ.get(TOKEN_ENV, "")
    return text.strip() or None


async def _serve_until_signalled(app: web.Application, args: argparse.Namespace, label: str, risk: str) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    token = _token(args)
    warn_if_exposed(log, args.host, label, risk, token is not None)
    async with serve(app, args.host, args.port, allow_hosts=tuple(args.allow_host), token=token) as url:
        print(f"{label} listening on {url}", flush=True)  # the bound port, also when --port 0
        await stop.wait()


def run_server(argv: list[str] | None, description: str, default_port: int, label: str,
               make_app: Callable[[argparse.Namespace], web.Application],
               add_arguments: Callable[[argparse.ArgumentParser], None] = lambda parser: None,
               risk: str = "anyone who can reach this port can call this server") -> None:
    """Parse --host, --port, --allow-host, --token-file and the server's own options (`add_arguments`), build
    the app from them and serve it on uvloop (asyncio when uvloop is missing) until SIGINT or SIGTERM.
    `risk` is what the start-up warning of a non-loopback listen without a token says anyone can do."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=default_port, help="0 picks a free port (printed at start)")
    parser.add_argument("--allow-host", action="append", default=[], metavar="NAME",
                        help="a Host name to answer besides the bound address's own (repeatable)")
    parser.add_argument("--token-file", metavar="PATH", help=f"file holding a bearer token every request must "
                        f"carry (default: ${TOKEN_ENV} if set; none otherwise)")
    add_arguments(parser)
    args = parser.parse_args(argv)
    try:
        import uvloop

        run = uvloop.run
    except ImportError:
        run = asyncio.run
    run(_serve_until_signalled(make_app(args), args, label, risk))
