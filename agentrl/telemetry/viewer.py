"""The run viewer's server (`python -m agentrl.view RUN_DIR`): a static page shipped in this package
(agentrl/telemetry/viewer_static/: no CDN, no font, nothing fetched from elsewhere) and a JSON API over the
run folder's files (agentrl.telemetry.viewer_files), re-read as they grow on every request.

  GET /api/run                      the run's name, its summary (config apart) and config, the files found,
                                    the rows skipped per file (bad_rows: not JSON objects, or fields of other types)
  GET /api/metrics?since=N          metrics.jsonl records from the N-th on
  GET /api/episodes?source=train|eval&status=ok,timeout&reward_min=&reward_max=&turns_min=&...&q=&offset=&limit=
  GET /api/episode?source=train|eval&i=N    one whole record, with per-token staleness added
  GET /api/compare[?task=ID]        the held-out tasks of the first and the last eval; one task's two episodes

A number in the query that is not one (`since=abc`, `reward_min=nan`, `limit=-1`) is a 400 naming the parameter.

Loopback unless told otherwise, and a foreign Host or Origin is a 403 (agentrl.utils.local_only); every other
path is a 404 (run files are opened by fixed name only).
"""

from __future__ import annotations

import logging
import math
from pathlib import Path
from typing import Any

from aiohttp import web

from agentrl.telemetry.viewer_files import RANGES, RunFiles, page
from agentrl.utils.local_only import install, is_loopback as _loopback

log = logging.getLogger(__name__)

STATIC = Path(__file__).resolve().parent / "viewer_static"
TYPES = {".html": "text/html", ".js": "text/javascript", ".css": "text/css"}
MAX_PAGE = 500


class QueryError(ValueError):
    """A request parameter that is not what it must be: answered with a 400 naming it."""


def _number(params: Any, key: str) -> float | None:
    """A finite number, or None when the parameter is absent or empty (no bound)."""
    raw = params.get(key, "")
    if raw == "":
        return None
    try:
        value = float(raw)
    except ValueError:
        raise QueryError(f"{key}={raw!r} is not a number") from None
    if not math.isfinite(value):  # nan compares false with everything; inf bounds nothing
        raise QueryError(f"{key}={raw!r} is not a finite number")
    return value


def _count(params: Any, key: str, default: int) -> int:
    """A whole number >= 0 written in ASCII digits (an index, an offset, a page size)."""
    raw = params.get(key, "")
    if raw == "":
        return default
    if not (raw.isascii() and raw.isdigit()):  # "²" and "١" are str.isdigit, and int() refuses "²"
        raise QueryError(f"{key}={raw!r} is not a whole number >= 0")
    return int(raw)


def parse_query(params: Any) -> tuple[dict[str, Any], int, int]:
    """(filters, offset, limit) of an /api/episodes request."""
    query: dict[str, Any] = {f"{k}_{end}": _number(params, f"{k}_{end}") for k in RANGES for end in ("min", "max")}
    query["status"] = {s for s in params.get("status", "").split(",") if s}
    query["q"] = params.get("q", "").strip().lower()
    offset, limit = _count(params, "offset", 0), _count(params, "limit", 50)
    if not 1 <= limit <= MAX_PAGE:
        raise QueryError(f"limit={limit} is not within 1..{MAX_PAGE}")
    return query, offset, limit


@web.middleware
async def bad_query(request: web.Request, handler: Any) -> web.StreamResponse:
    """A QueryError anywhere in a handler is the client's mistake: a 400 naming the parameter."""
    try:
        return await handler(request)
    except QueryError as exc:
        raise web.HTTPBadRequest(text=str(exc)) from None


def with_tokens(record: dict[str, Any]) -> dict[str, Any]:
    """The record and, per token of its ledger, the staleness of a trained one (step - version)."""
    step = record.get("step") if not record.get("eval") else None
    record["staleness"] = [step - v if isinstance(step, int) and m and v >= 0 else None
                           for v, m in zip(record.get("versions") or [], record.get("loss_mask") or [])]
    return record


def eval_ends(files: RunFiles) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The episodes of the first and of the last held-out eval the run recorded (by step, then label)."""
    rows = files.evals.rows
    order = {"before": 0, "during": 1, "after": 2}
    keys = sorted({(r["step"] or 0, order.get(r["eval"], 1)) for r in rows})
    if len(keys) < 2:
        return [], []
    at = lambda key: [r for r in rows if ((r["step"] or 0), order.get(r["eval"], 1)) == key]  # noqa: E731
    return at(keys[0]), at(keys[-1])


class Viewer:
    """The aiohttp application over one run folder."""

    def __init__(self, run_dir: str | Path) -> None:
        self.files = RunFiles(run_dir)
        self.app = web.Application(middlewares=[bad_query])
        self.app.add_routes([
            web.get("/", self.index), web.get("/static/{name}", self.static),
            web.get("/api/run", self.run), web.get("/api/metrics", self.metrics),
            web.get("/api/episodes", self.episodes), web.get("/api/episode", self.episode),
            web.get("/api/compare", self.compare)])
        self.runner: web.AppRunner | None = None
        self.url = ""

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> str:
        """Reads the files once, then listens; the URL (port 0: a free port)."""
        # On loopback only requests addressed to loopback: a web page whose name an attacker re-points at
        # 127.0.0.1 (DNS rebinding) sends its own name as Host, and gets a 403, not the run.
        install(self.app, host)
        if not _loopback(host):
            log.warning("the run viewer listens on %s, not loopback: anyone who reaches this address reads the "
                        "run's episodes and config", host)
        self.files.refresh()
        self.runner = web.AppRunner(self.app, access_log=None)
        await self.runner.setup()
        site = web.TCPSite(self.runner, host, port)
        await site.start()
        bound = self.runner.addresses[0]
        shown = f"[{bound[0]}]" if ":" in bound[0] else bound[0]
        self.url = f"http://{shown}:{bound[1]}"
        return self.url

    async def stop(self) -> None:
        if self.runner is not None:
            await self.runner.cleanup()

    async def index(self, request: web.Request) -> web.Response:
        return self._file("index.html")

    async def static(self, request: web.Request) -> web.Response:
        return self._file(request.match_info["name"])

    def _file(self, name: str) -> web.Response:
        shipped = {p.name: p for p in STATIC.iterdir() if p.suffix in TYPES}  # nothing but what the package ships
        if name not in shipped:
            raise web.HTTPNotFound()
        return web.Response(body=shipped[name].read_bytes(), content_type=TYPES[shipped[name].suffix],
                            charset="utf-8", headers={"Cache-Control": "no-cache"})

    async def run(self, request: web.Request) -> web.Response:
        self.files.refresh()
        summary = self.files.summary() or {}
        config = summary.pop("config", None) or self.files.config()  # a running run: run_config.json
        found = [n for n in ("metrics.jsonl", "summary.json", "run_config.json", "rollouts.jsonl", "eval_episodes.jsonl",
                             "curves.png")
                 if (self.files.root / n).is_file()]
        return web.json_response({"name": self.files.root.resolve().name, "summary": summary or None,
                                  "config": config, "files": found, "steps": len(self.files.metrics),
                                  "episodes": len(self.files.train.rows), "eval_episodes": len(self.files.evals.rows),
                                  "bad_rows": self.files.bad_rows()})

    async def metrics(self, request: web.Request) -> web.Response:
        self.files.refresh()
        since = _count(request.query, "since", 0)
        return web.json_response({"total": len(self.files.metrics), "rows": self.files.metrics[since:]})

    async def episodes(self, request: web.Request) -> web.Response:
        self.files.refresh()
        index = self.files.index(request.query.get("source", "train"))
        if index is None:
            raise web.HTTPNotFound(text="source must be train or eval")
        query, offset, limit = parse_query(request.query)
        return web.json_response({**page(index.rows, query, offset, limit), "bad_rows": index.bad_rows})

    async def episode(self, request: web.Request) -> web.Response:
        self.files.refresh()  # spans of a file rewritten since (a resumed run) point at other bytes
        index = self.files.index(request.query.get("source", "train"))
        i = _count(request.query, "i", -1)
        record = index.record(i) if index is not None else None
        if record is None:
            raise web.HTTPNotFound(text="no such episode")
        return web.json_response(with_tokens(record))

    async def compare(self, request: web.Request) -> web.Response:
        self.files.refresh()
        first, last = eval_ends(self.files)
        task = request.query.get("task")
        if task is None:
            in_last = {r["task_id"]: r for r in last}
            pairs = [{"task_id": r["task_id"], "before": r, "after": in_last[r["task_id"]]}
                     for r in first if r["task_id"] in in_last]
            pairs = [{k: ({x: y for x, y in v.items() if not x.startswith("_")} if isinstance(v, dict) else v)
                      for k, v in p.items()} for p in pairs]
            return web.json_response({"tasks": pairs})
        pick = lambda rows: next((r["i"] for r in rows if r["task_id"] == task), None)  # noqa: E731
        i, j = pick(first), pick(last)
        if i is None or j is None:
            raise web.HTTPNotFound(text="task not in both the first and the last eval")
        return web.json_response({"before": with_tokens(self.files.evals.record(i)),
                                  "after": with_tokens(self.files.evals.record(j))})
