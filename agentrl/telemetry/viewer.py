"""The run viewer's server (`python -m agentrl.view RUN_DIR`): a static page shipped in this package
(agentrl/telemetry/viewer_static/: no CDN, no font, nothing fetched from elsewhere) and a JSON API over the
run folder's files (agentrl.telemetry.viewer_files), re-read as they grow on every request.

  GET /api/run                      the run's name, its summary (config apart) and config, the files found,
                                    the rows skipped per file (bad_rows: not JSON objects, or fields of other types)
  GET /api/metrics?since=N          metrics.jsonl records from the N-th on
  GET /api/episodes?source=train|eval&status=ok,timeout&reward_min=&reward_max=&turns_min=&...&q=&offset=&limit=
  GET /api/episodes?...&groups=equal|dropped  only episodes of groups with equal rewards / that the run dropped
  GET /api/episode?source=train|eval&i=N    one whole record, with per-token staleness added
  GET /api/group?source=train|eval&i=N      episode N's group: its samples side by side (agentrl.telemetry.viewer_groups)
  GET /api/compare[?task=ID]        the held-out tasks of the first and the last eval; one task's two episodes
  GET /api/runs                     run against run: the config keys that differ, the held-out tasks all answered
  GET /api/runs/task?task=ID        that task's episodes in each run, at its first and its last eval
Every /api/ call but the last two takes run=K: the K-th run folder shown (0, the first, by default).

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

from agentrl.telemetry.viewer_files import GROUP_KINDS, RANGES, RunFiles, eval_ends, page
from agentrl.telemetry.viewer_groups import group_view
from agentrl.telemetry.viewer_runs import config_diff, run_config, shared_tasks, task_answers
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
    query["groups"] = params.get("groups", "")
    if query["groups"] and query["groups"] not in GROUP_KINDS:
        raise QueryError(f"groups={query['groups']!r} is not one of {', '.join(GROUP_KINDS)}")
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


class Viewer:
    """The aiohttp application over one run folder, or over two beside each other (run against run: every
    API call takes `run=K`, the K-th folder, 0 by default)."""

    def __init__(self, run_dir: str | Path, *others: str | Path) -> None:
        self.runs = [RunFiles(d) for d in (run_dir, *others)]
        self.files = self.runs[0]
        self.app = web.Application(middlewares=[bad_query])
        self.app.add_routes([
            web.get("/", self.index), web.get("/static/{name}", self.static),
            web.get("/api/run", self.run), web.get("/api/metrics", self.metrics),
            web.get("/api/episodes", self.episodes), web.get("/api/episode", self.episode),
            web.get("/api/compare", self.compare), web.get("/api/group", self.group),
            web.get("/api/runs", self.pair), web.get("/api/runs/task", self.pair_task)])
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
        for files in self.runs:
            files.refresh()
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

    def names(self) -> list[str]:
        """The run folders' names, as the page's legend shows them: the paths given where two names are alike."""
        names = [f.root.resolve().name for f in self.runs]
        return names if len(set(names)) == len(names) else [str(f.root) for f in self.runs]

    def _files(self, request: web.Request) -> RunFiles:
        """The run a request names (`run=K`), its files read up to now."""
        k = _count(request.query, "run", 0)
        if k >= len(self.runs):
            raise QueryError(f"run={k} is not one of the {len(self.runs)} run folders shown")
        self.runs[k].refresh()
        return self.runs[k]

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
        files = self._files(request)
        summary = files.summary() or {}
        config = summary.pop("config", None) or files.config()  # a running run: run_config.json
        found = [n for n in ("metrics.jsonl", "summary.json", "run_config.json", "rollouts.jsonl", "eval_episodes.jsonl",
                             "curves.png")
                 if (files.root / n).is_file()]
        return web.json_response({"name": files.root.resolve().name, "summary": summary or None,
                                  "config": config, "files": found, "steps": len(files.metrics),
                                  "episodes": len(files.train.rows), "eval_episodes": len(files.evals.rows),
                                  "eval_scores": files.eval_scores(summary),
                                  "bad_rows": files.bad_rows(),
                                  "runs": self.names()})

    async def metrics(self, request: web.Request) -> web.Response:
        files = self._files(request)
        since = _count(request.query, "since", 0)
        return web.json_response({"total": len(files.metrics), "rows": files.metrics[since:]})

    async def episodes(self, request: web.Request) -> web.Response:
        files = self._files(request)
        index = files.index(request.query.get("source", "train"))
        if index is None:
            raise web.HTTPNotFound(text="source must be train or eval")
        query, offset, limit = parse_query(request.query)
        return web.json_response({**page(index.rows, query, offset, limit), "bad_rows": index.bad_rows})

    async def episode(self, request: web.Request) -> web.Response:
        files = self._files(request)  # refreshed: spans of a file rewritten since (a resumed run) point at other bytes
        index = files.index(request.query.get("source", "train"))
        i = _count(request.query, "i", -1)
        record = index.record(i) if index is not None else None
        if record is None:
            raise web.HTTPNotFound(text="no such episode")
        return web.json_response(with_tokens(record))

    async def group(self, request: web.Request) -> web.Response:
        files = self._files(request)
        index = files.index(request.query.get("source", "train"))
        i = _count(request.query, "i", -1)
        got = group_view(index.rows, index.members, i, index.record) if index is not None else None
        if got is None:
            raise web.HTTPNotFound(text="no such episode")
        got["episodes"] = [with_tokens(r) for r in got["episodes"]]
        return web.json_response(got)

    async def compare(self, request: web.Request) -> web.Response:
        files = self._files(request)
        first, last = eval_ends(files)
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
        return web.json_response({"before": with_tokens(files.evals.record(i)),
                                  "after": with_tokens(files.evals.record(j))})

    async def pair(self, request: web.Request) -> web.Response:
        """Run against run: the config keys that differ, and the held-out tasks every run answered."""
        for files in self.runs:
            files.refresh()
        return web.json_response({"names": self.names(),
                                  "config_diff": config_diff([run_config(f) for f in self.runs]),
                                  "tasks": shared_tasks(self.runs)})

    async def pair_task(self, request: web.Request) -> web.Response:
        """One held-out task as each run answered it at its first and its last eval."""
        for files in self.runs:
            files.refresh()
        got = task_answers(self.runs, request.query.get("task", ""))
        if got is None:
            raise web.HTTPNotFound(text="task not answered by every run")
        return web.json_response({"runs": [{k: None if r is None else with_tokens(r) for k, r in two.items()}
                                           for two in got]})
