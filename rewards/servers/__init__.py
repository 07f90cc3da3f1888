"""Reference servers for remote rewards, and a helper to run any aiohttp app on loopback."""

from __future__ import annotations

import contextlib
from typing import AsyncIterator

from aiohttp import web


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
