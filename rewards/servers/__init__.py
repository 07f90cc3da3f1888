"""Reference servers (a verifier, a tool server) and what they share: `serve` runs an aiohttp app on
a port for as long as a block runs; `run_server` is the command-line runner (argparse with --host and
--port, uvloop, SIGINT/SIGTERM to stop) that each server's `main` calls with its own app and options;
`read_json` and the `errors` middleware answer a client's bad body with a 400 and a failure of the
server's own with a 500 that names an error id (logged with the traceback), never the exception."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import signal
from typing import Any, AsyncIterator, Awaitable, Callable

from aiohttp import web

from agentrl.utils.http_common import BadRequestBody, internal_error, loads_request

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
                shutdown_timeout: float = 1.0) -> AsyncIterator[str]:
    """Run `app` on host:port (0 = an ephemeral port) and yield its base URL, e.g. "http://127.0.0.1:39211".

    `shutdown_timeout` bounds how long cleanup waits for handlers still running.
    """
    runner = web.AppRunner(app, shutdown_timeout=shutdown_timeout, access_log=None)
    await runner.setup()
    try:
        site = web.TCPSite(runner, host, port)
        await site.start()
        bound_host, bound_port = runner.addresses[0][:2]
        yield f"http://{bound_host}:{bound_port}"
    finally:
        await runner.cleanup()


async def _serve_until_signalled(app: web.Application, host: str, port: int, label: str) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    async with serve(app, host, port) as url:
        print(f"{label} listening on {url}", flush=True)  # the bound port, also when --port 0
        await stop.wait()


def run_server(argv: list[str] | None, description: str, default_port: int, label: str,
               make_app: Callable[[argparse.Namespace], web.Application],
               add_arguments: Callable[[argparse.ArgumentParser], None] = lambda parser: None) -> None:
    """Parse --host, --port and the server's own options (`add_arguments`), build the app from them and
    serve it on uvloop (asyncio when uvloop is missing) until SIGINT or SIGTERM."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=default_port, help="0 picks a free port (printed at start)")
    add_arguments(parser)
    args = parser.parse_args(argv)
    try:
        import uvloop

        run = uvloop.run
    except ImportError:
        run = asyncio.run
    run(_serve_until_signalled(make_app(args), args.host, args.port, label))
