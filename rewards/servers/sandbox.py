"""Reference code sandbox server: runs the model's Python (or /bin/sh) code, isolated, over HTTP.

Run it with `python -m rewards.servers.sandbox --port 8766` (loopback by default) and point a tool env's
`tool_url` (agentrl.rollout.tools.client.RemoteToolClient) at `http://127.0.0.1:8766`.

    GET  /tools     -> 200 {"tools": [<OpenAI function spec>]}  (`python`, argument {"code": str}; `shell` too
                       with --tools python,shell)
    POST /call      {"name": "python", "arguments": {"code": str}}   ("shell": {"command": str})
                    -> 200 {"content": "<stdout+stderr, truncated>", "is_error": bool}; a timeout, a kill
                       or a nonzero exit is is_error true with a line such as "[timeout after 5.0 s]"
                    -> 404 unknown tool; 400 body not {"name", "arguments"}
    POST /run_code  Sandbox Fusion's API (the `sandbox-fusion` client's RunCodeRequest -> RunCodeResponse),
                    languages "python" and "bash"; fetch_files is refused by name; `memory_limit_MB` (a
                    field of Sandbox Fusion's server the 0.3.7 client lacks: raw JSON) lowers the call's
                    address-space limit (and its total, --call-memory-mb); above --memory-mb it runs at
                    --memory-mb and `message` says so
    GET  /health    -> 200 {"status": "ok", "isolation": "bwrap" | "unshare" | "none",
                            "bound": "cgroup v2" | "cgroup v1" | "watchdog"}
    GET  /stats     -> 200 {"calls", "failed", "timeouts", "memory_limit", "process_limit", "cpu_limit",
                            "in_flight", "max_in_flight", "memory_held_mb", "max_memory_held_mb",
                            "waiting_for_memory"}

A call over its bound as a whole (--call-memory-mb, --processes, --call-cpus: sandbox_bound.py) is ended
and answered like a timeout: /call's content ends with "[memory limit: ...]" (or "process limit",
"CPU limit") and is_error true; /run_code's status is "Failed", its message that line, its run_result
"Error" with return_code -9. Calls together hold at most --server-memory-mb (sandbox_budget.py): a call
whose bound does not fit waits its turn.

Every call runs in a fresh sandbox (sandbox_isolation.py: bubblewrap, else unshare, else a start-up
error naming why; `--isolation none` only when asked for) with the limits of sandbox_run.SandboxLimits,
bounded as a whole by a cgroup where the server can make one, else by a watchdog (one start-up line says which);
`--warm N` sandboxes are kept started ahead of their calls (sandbox_pool.py), each used for one call.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import binascii
import logging
import os
import sys
from collections import Counter
from typing import Any, Literal

from aiohttp import web
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from rewards.servers import errors, read_json, run_server
from rewards.servers import sandbox_bound
from rewards.servers.sandbox_bound import IDLE_SANDBOX_MB, BoundName, Bounds
from rewards.servers.sandbox_budget import MemoryBudget
from rewards.servers.sandbox_cgroup import NoCgroup
from rewards.servers.sandbox_isolation import Isolation, IsolationName, SandboxUnavailable, choose
from rewards.servers.sandbox_pool import WarmPool
from rewards.servers.sandbox_run import RunResult, SandboxLimits, run_sandboxed

log = logging.getLogger(__name__)

TOOL_SPECS: dict[str, dict[str, Any]] = {
    "python": {"type": "function", "function": {
        "name": "python",
        "description": "Run Python 3 code in a fresh sandbox and get back its printed output (stdout and "
                       "stderr). Nothing persists between calls; there is no network. Print what you need.",
        "parameters": {"type": "object", "properties": {"code": {"type": "string"}}, "required": ["code"]}}},
    "shell": {"type": "function", "function": {
        "name": "shell",
        "description": "Run a /bin/sh command in a fresh sandbox and get back its output. No network.",
        "parameters": {"type": "object", "properties": {"command": {"type": "string"}},
                       "required": ["command"]}}},
}
TOOL_ARGUMENT = {"python": "code", "shell": "command"}
LIMIT_STATS = {"memory": "memory_limit", "processes": "process_limit", "cpu": "cpu_limit"}


def default_server_memory_mb() -> int:
    """A third of this machine's memory (8 GiB of a 24 GiB one): the rest is the learner's and the engine's."""
    with open("/proc/meminfo") as f:
        total_kib = next(int(line.split()[1]) for line in f if line.startswith("MemTotal:"))
    return max(1024, total_kib // 1024 // 3)


class SandboxServerConfig(BaseModel):
    """The server's options (each is also a command-line flag)."""

    model_config = ConfigDict(extra="forbid")
    isolation: IsolationName = Field("auto", description="auto = bwrap, else unshare; none = NO isolation")
    python: str = Field("/usr/bin/python3", description="the system python the sandbox runs (not a venv's)")
    sandbox_uid: int = Field(65534, ge=1, description="uid sandboxes run as when the server runs as root")
    max_concurrency: int = Field(default_factory=lambda: 4 * (os.cpu_count() or 1), ge=1, le=1024,
                                 description="sandboxes running at once; more calls wait their turn")
    warm: int = Field(4, ge=0, le=256, description="sandboxes kept started ahead of their calls (0: start "
                                                   "each call's sandbox when it comes)")
    tools: tuple[Literal["python", "shell"], ...] = Field(("python",), min_length=1,
                                                          description="tools GET /tools lists")
    limits: SandboxLimits = Field(default_factory=SandboxLimits)
    bound: BoundName = Field("auto", description="what bounds each call as a whole: auto = a cgroup where one "
                                                 "can be made, else the watchdog")
    server_memory_mb: int = Field(default_factory=default_server_memory_mb, ge=64,
                                  description="memory of all running calls together, MiB (default: a third of "
                                              "the machine's); a call whose bound does not fit waits")

    @model_validator(mode="after")
    def _a_call_fits_the_server(self) -> "SandboxServerConfig":
        if self.limits.call_memory_mb > self.server_memory_mb:
            raise ValueError(f"limits.call_memory_mb {self.limits.call_memory_mb} is over server_memory_mb "
                             f"{self.server_memory_mb}: no call could ever run")
        return self


class RunCodeRequest(BaseModel):
    """Sandbox Fusion's run_code request, as its client package sends it (sandbox_fusion.models)."""

    model_config = ConfigDict(extra="ignore")
    code: str
    language: str
    run_timeout: float = Field(10.0, gt=0)
    compile_timeout: float = 10.0
    stdin: str | None = None
    files: dict[str, str | None] = {}
    fetch_files: list[str] = []
    memory_limit_MB: int = -1  # Sandbox Fusion's default -1 (any value <= 0): the server's own limit


ISOLATION = web.AppKey("isolation", Isolation)
CONFIG = web.AppKey("config", SandboxServerConfig)
SLOTS = web.AppKey("slots", asyncio.Semaphore)
STATS = web.AppKey("stats", Counter)
POOL = web.AppKey("pool", WarmPool)
BOUNDS = web.AppKey("bounds", Bounds)
BUDGET = web.AppKey("budget", MemoryBudget)


async def _run(app: web.Application, mode: Literal["python", "shell"], code: str, merge_stderr: bool = True,
               **kwargs: Any) -> RunResult:
    """One call under the server's limits (`kwargs` may lower wall_s and memory_mb: run_sandboxed), once
    its memory bound fits the server's total and a slot is free."""
    stats, limits = app[STATS], app[CONFIG].limits
    need_mb = limits.lowered(kwargs.get("wall_s"), kwargs.get("memory_mb")).call_memory_mb
    async with app[BUDGET].hold(need_mb), app[SLOTS]:
        stats["in_flight"] += 1
        stats["max_in_flight"] = max(stats["max_in_flight"], stats["in_flight"])
        try:
            result = await run_sandboxed(app[ISOLATION], mode, code, limits, app[BOUNDS], merge_stderr=merge_stderr,
                                         started=app[POOL].take(merge_stderr), **kwargs)
        finally:
            stats["in_flight"] -= 1
    stats["calls"] += 1
    stats["failed"] += not result.ok
    stats["timeouts"] += result.timed_out
    if result.limit is not None:
        stats[LIMIT_STATS[result.limit.kind]] += 1
    return result


async def list_tools(request: web.Request) -> web.Response:
    return web.json_response({"tools": [TOOL_SPECS[name] for name in request.app[CONFIG].tools]})


async def call(request: web.Request) -> web.Response:
    body = await read_json(request)
    if not isinstance(body, dict) or not isinstance(body.get("name"), str) or \
            not isinstance(body.get("arguments", {}), dict):
        return web.json_response({"error": 'body must be {"name": str, "arguments": object}'}, status=400)
    name = body["name"]
    if name not in TOOL_ARGUMENT:
        shown = name if len(name) <= 80 else name[:80] + "..."
        return web.json_response({"error": f"unknown tool {shown!r}; tools: {sorted(TOOL_ARGUMENT)}"}, status=404)
    key = TOOL_ARGUMENT[name]
    code = body.get("arguments", {}).get(key)
    if not isinstance(code, str):
        return web.json_response({"content": f"error: argument {key!r} must be a string", "is_error": True})
    limits = request.app[CONFIG].limits
    result = await _run(request.app, name, code)  # type: ignore[arg-type]
    content = result.stdout.decode(errors="replace")
    failure = result.describe_failure(limits, limits.wall_s)
    if failure:
        content += ("" if not content or content.endswith("\n") else "\n") + f"[{failure}]"
    return web.json_response({"content": content, "is_error": not result.ok})


def _command_result(result: RunResult, wall_s: float, limits: SandboxLimits) -> dict[str, Any]:
    killed = result.output_overflow or result.limit is not None  # by the server, not by a deadline
    status = "TimeLimitExceeded" if result.timed_out else "Error" if killed else "Finished"
    stderr = result.stderr.decode(errors="replace")
    if killed:
        stderr += f"\n[{result.describe_failure(limits, wall_s)}]"
    return {"status": status, "execution_time": round(result.seconds, 4), "cpu_time": None,
            "return_code": -9 if killed else result.exit_code,
            "stdout": result.stdout.decode(errors="replace"), "stderr": stderr}


async def run_code(request: web.Request) -> web.Response:
    try:
        req = RunCodeRequest.model_validate(await read_json(request))
    except ValidationError as exc:
        return web.json_response({"error": f"not a run_code request: {exc.errors()[0]['msg']} at "
                                           f"{'.'.join(map(str, exc.errors()[0]['loc']))}"}, status=400)
    mode = {"python": "python", "python3": "python", "bash": "shell"}.get(req.language)
    why_not = (f"language {req.language!r} is not supported by agentrl's sandbox; it runs python and bash"
               if mode is None else "fetch_files is not supported: the sandbox's tmpfs ends with the call"
               if req.fetch_files else "")
    if why_not:
        return web.json_response({"status": "SandboxError", "message": why_not, "compile_result": None,
                                  "run_result": None, "executor_pod_name": None, "files": {}})
    try:
        files = {name: base64.b64decode(data or "", validate=True) for name, data in req.files.items()}
    except binascii.Error:
        return web.json_response({"error": "files: each value must be base64 (or null for an empty file)"},
                                 status=400)
    limits = request.app[CONFIG].limits
    wall_s = min(req.run_timeout, limits.wall_s)
    memory_mb = min(req.memory_limit_MB, limits.memory_mb) if req.memory_limit_MB > 0 else None
    clamped = (f"memory_limit_MB {req.memory_limit_MB} is above this server's maximum: ran with "
               f"{limits.memory_mb} MiB" if req.memory_limit_MB > limits.memory_mb else "")
    result = await _run(request.app, mode, req.code, wall_s=wall_s,  # type: ignore[arg-type]
                        stdin=(req.stdin or "").encode(), merge_stderr=False, files=files, memory_mb=memory_mb)
    message = "; ".join(filter(None, [result.describe_failure(limits, wall_s), clamped]))
    return web.json_response({"status": "Success" if result.ok else "Failed",
                              "message": message, "compile_result": None,
                              "run_result": _command_result(result, wall_s, limits), "executor_pod_name": None,
                              "files": {}})


async def health(request: web.Request) -> web.Response:
    return web.json_response({"status": "ok", "isolation": request.app[ISOLATION].name,
                              "bound": request.app[BOUNDS].name})


async def stats(request: web.Request) -> web.Response:
    keys = ("calls", "failed", "timeouts", *LIMIT_STATS.values(), "in_flight", "max_in_flight")
    budget = request.app[BUDGET]
    return web.json_response({**{k: request.app[STATS][k] for k in keys}, "memory_held_mb": budget.held_mb,
                              "max_memory_held_mb": budget.max_held_mb, "waiting_for_memory": budget.waiting})


def make_app(config: SandboxServerConfig) -> web.Application:
    """The server's app; SandboxUnavailable (raised here, at start-up) when no isolation asked for works,
    NoCgroup when `bound` is "cgroup" and none can be made here."""
    isolation = choose(config.isolation, config.python, config.sandbox_uid)
    # the server's cgroup: the calls' total, and room for the sandboxes started ahead (both kinds)
    idle_mb = (2 * config.warm + 2) * IDLE_SANDBOX_MB
    bounds = sandbox_bound.choose(config.bound, config.python, (config.server_memory_mb + idle_mb) << 20)
    log.info("%s", sandbox_bound.describe(bounds, config.limits.totals(), config.server_memory_mb))
    if isolation.name == "none":
        log.warning("sandbox isolation is OFF (--isolation none): model code runs as this server's user with "
                    "its files and network")
    app = web.Application(middlewares=[errors], client_max_size=16 << 20)
    app[ISOLATION], app[CONFIG] = isolation, config
    app[SLOTS], app[STATS] = asyncio.Semaphore(config.max_concurrency), Counter()
    app[BOUNDS], app[BUDGET] = bounds, MemoryBudget(config.server_memory_mb)
    app[POOL] = WarmPool(isolation, config.limits, config.warm, bounds)

    async def start_pool(app: web.Application) -> None:
        app[POOL].fill()

    async def stop_pool(app: web.Application) -> None:
        await app[POOL].close()
        app[BOUNDS].close()

    app.on_startup.append(start_pool)
    app.on_cleanup.append(stop_pool)
    app.router.add_get("/tools", list_tools)
    app.router.add_post("/call", call)
    app.router.add_post("/run_code", run_code)
    app.router.add_get("/health", health)
    app.router.add_get("/stats", stats)
    return app


def _add_arguments(parser: argparse.ArgumentParser) -> None:
    defaults, limits = SandboxServerConfig(), SandboxLimits()
    parser.add_argument("--isolation", default="auto", choices=["auto", "bwrap", "unshare", "none"],
                        help="auto: bubblewrap, else unshare; none runs model code WITHOUT isolation")
    parser.add_argument("--python", default=defaults.python, help="the system python the sandbox runs")
    parser.add_argument("--tools", default="python", help="tools GET /tools lists: python or python,shell")
    parser.add_argument("--max-concurrency", type=int, default=defaults.max_concurrency)
    parser.add_argument("--warm", type=int, default=defaults.warm, help="sandboxes started ahead of their calls")
    parser.add_argument("--sandbox-uid", type=int, default=defaults.sandbox_uid,
                        help="uid sandboxes run as when the server runs as root")
    parser.add_argument("--bound", default="auto", choices=["auto", "cgroup", "watchdog"],
                        help="what bounds each call as a whole: auto = a cgroup where one can be made, else the "
                             "watchdog; cgroup = refuse to start without one")
    parser.add_argument("--server-memory-mb", type=int, default=defaults.server_memory_mb,
                        help="memory of all running calls together, MiB (default: a third of this machine's)")
    for name, info in SandboxLimits.model_fields.items():
        flag = "--timeout" if name == "wall_s" else "--" + name.replace("_", "-")
        parser.add_argument(flag, dest=name, type=type(getattr(limits, name)), default=getattr(limits, name),
                            help=info.description)


def _config(args: argparse.Namespace) -> SandboxServerConfig:
    limits = {name: getattr(args, name) for name in SandboxLimits.model_fields}
    return SandboxServerConfig(isolation=args.isolation, python=args.python, tools=tuple(args.tools.split(",")),
                               max_concurrency=args.max_concurrency, sandbox_uid=args.sandbox_uid, warm=args.warm,
                               limits=limits, bound=args.bound, server_memory_mb=args.server_memory_mb)


def _make_app_or_exit(args: argparse.Namespace) -> web.Application:
    try:
        config = _config(args)
        if config.isolation == "none":
            print("WARNING: --isolation none: the sandbox server runs model code WITHOUT isolation, with this "
                  "user's files, environment and network. Use it only on a throwaway machine.",
                  file=sys.stderr, flush=True)
        return make_app(config)
    except ValidationError as exc:
        raise SystemExit(f"sandbox server: bad option: {exc}") from None
    except (SandboxUnavailable, NoCgroup) as exc:
        raise SystemExit(f"sandbox server cannot start: {exc}") from None


def main(argv: list[str] | None = None) -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    run_server(argv, __doc__.splitlines()[0], 8766, "sandbox server", _make_app_or_exit, _add_arguments,
               risk="anyone who can reach this port can run code on this machine")


if __name__ == "__main__":
    main()
