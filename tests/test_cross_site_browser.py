"""A hostile web page against every local server, in a real browser (Debian's chromium, headless, driven by
selenium as in tests/test_viewer.py): `agentrl serve`'s OpenAI endpoint (its real app on a scripted engine),
the sandbox, the tool server, the verifier, the run viewer and an OpenEnv app (behind the ASGI guard that
envs.openenv_server puts around it, with a run's token), each a real server on 127.0.0.1.

The page comes from another origin, http://evil.localtest:PORT (chromium maps that name to 127.0.0.1), and
tries, against each server: a simple POST (text/plain, no-cors: no preflight, the answer unread), a JSON POST
(a preflight no server grants), a WebSocket (which no CORS rule covers) to the OpenEnv app; then DNS
rebinding: the page's script running in a document of origin http://evil.localtest:SERVERPORT (the name
re-pointed at 127.0.0.1), whose same-origin requests carry the foreign Host. Each server records every request
that reached it with its answer, and counts those that reached its handlers: every attempt arrives, is
refused, and no handler runs. A normal client afterwards is answered, so the counters do count."""

from __future__ import annotations

import asyncio
import contextlib
import json
import shutil
import sys
import tempfile
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

import pytest

ROOT = Path(__file__).resolve().parents[1]
HOST = "127.0.0.1"
EVIL = "evil.localtest"  # chromium resolves it to 127.0.0.1 (--host-resolver-rules)
OPENENV_APP = "tests.fixtures.openenv_guess:app"


@dataclass
class Target:
    """One server: where it listens, a request that would act (`path`, `body`) and one that would read (`read`)."""

    name: str
    path: str
    body: Any
    read: str
    url: str = ""
    token: str | None = None
    ws: str | None = None  # a WebSocket route, if it has one
    arrived: list[tuple[str, str, int]] = field(default_factory=list)  # (method, path, status) of every request
    handled: list[str] = field(default_factory=list)  # requests that reached the app's handlers

    @property
    def port(self) -> int:
        return int(self.url.rsplit(":", 1)[1])

    @property
    def auth(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"} if self.token else {}


def _count_aiohttp(app: Any, target: Target) -> None:
    """Record every answer `app` sends (local_only's refusals included) and every request its handlers see."""
    from aiohttp import web

    async def answered(request: web.Request, response: web.StreamResponse) -> None:
        target.arrived.append((request.method, request.path, response.status))

    @web.middleware
    async def handled(request: web.Request, handler: Any) -> web.StreamResponse:  # innermost: just before the handler
        target.handled.append(f"{request.method} {request.path}")
        return await handler(request)

    app.on_response_prepare.append(answered)
    app.middlewares.append(handled)


class _CountASGI:
    """The ASGI twin of `_count_aiohttp`: `outer` records what arrives and its answer, `inner` what got through."""

    def __init__(self, app: Any, target: Target, outer: bool) -> None:
        self.app, self.target, self.outer = app, target, outer

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] not in ("http", "websocket"):
            return await self.app(scope, receive, send)
        method = scope.get("method", "WS")
        if not self.outer:
            self.target.handled.append(f"{method} {scope['path']}")
            return await self.app(scope, receive, send)

        answered = False

        async def recording(message: dict) -> None:
            nonlocal answered
            status = {"http.response.start": message.get("status"), "websocket.http.response.start":
                      message.get("status"), "websocket.accept": 101, "websocket.close": 403}.get(message["type"])
            if status is not None and not answered:  # the first answer only (a close after an accept is not one)
                answered = True
                self.target.arrived.append((method, scope["path"], status))
            await send(message)

        return await self.app(scope, receive, recording)


class Servers:
    """Every local server on 127.0.0.1, on one event loop in a thread; `tokens` gives each a bearer token
    (the OpenEnv app always has one: a run draws it). Use as a context manager."""

    def __init__(self, tokenizer: Any, tokens: bool = False) -> None:
        self.tokenizer, self.tokens = tokenizer, tokens
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.stack = contextlib.AsyncExitStack()
        self.tmp = Path(tempfile.mkdtemp(prefix="cross-site-"))
        self.targets = [
            Target("serve (OpenAI)", "/v1/chat/completions", {"model": "agentrl", "messages": [
                {"role": "user", "content": "6*7?"}]}, "/v1/models"),
            Target("sandbox", "/call", {"name": "python", "arguments": {"code": "print(6*7)"}}, "/stats"),
            Target("tool server", "/call", {"name": "calculator", "arguments": {"expression": "6*7"}}, "/tools"),
            Target("verifier", "/verify", {"task": {"answer": 42}, "completion": "42"}, "/stats"),
            Target("viewer", "/api/run", {}, "/api/run"),
            Target("OpenEnv app", "/reset", {"seed": 1}, "/schema", ws="/ws"),
        ]

    def __enter__(self) -> "Servers":
        self.thread.start()
        asyncio.run_coroutine_threadsafe(self._start(), self.loop).result(120)
        return self

    def __exit__(self, *exc: Any) -> None:
        asyncio.run_coroutine_threadsafe(self.stack.aclose(), self.loop).result(60)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        shutil.rmtree(self.tmp, ignore_errors=True)

    def __getitem__(self, name: str) -> Target:
        return next(t for t in self.targets if t.name == name)

    async def _start(self) -> None:
        import secrets

        for target in self.targets:
            target.token = secrets.token_urlsafe(16) if self.tokens or target.name == "OpenEnv app" else None
        await self._serve_app()
        await self._rewards_servers()
        await self._viewer()
        await self._openenv()

    async def _serve_app(self) -> None:
        from agentrl.config import ServerConfig
        from agentrl.data.chat import ChatFormat
        from agentrl.rollout.openai_server import OpenAIServer
        from agentrl.rollout.session import Limits
        from agentrl.rollout.tools import get_tool_format
        from fake_engine import ScriptedEngine

        target = self["serve (OpenAI)"]
        engine = ScriptedEngine(self.tokenizer, lambda prompt, i: "42")
        srv = OpenAIServer(ChatFormat(self.tokenizer), ServerConfig(api_key=target.token), get_tool_format("hermes"),
                           Limits(512, 16, 100), engine=engine)
        _count_aiohttp(srv.app, target)
        await srv.start()
        self.stack.push_async_callback(srv.stop)
        target.url = srv.url

    async def _rewards_servers(self) -> None:
        from rewards.servers import serve, tools, verifier
        from rewards.servers.sandbox import SandboxServerConfig, make_app

        for name, app in (("sandbox", make_app(SandboxServerConfig(warm=0))), ("tool server", tools.make_app()),
                          ("verifier", verifier.make_app())):
            target = self[name]
            _count_aiohttp(app, target)
            target.url = await self.stack.enter_async_context(serve(app, HOST, 0, token=target.token))

    async def _viewer(self) -> None:
        from agentrl.telemetry.viewer import Viewer

        run = self.tmp / "run"
        run.mkdir()
        (run / "metrics.jsonl").write_text(json.dumps({"step": 0, "reward_mean": 0.5}) + "\n")
        viewer = Viewer(run)
        _count_aiohttp(viewer.app, self["viewer"])
        self["viewer"].url = await viewer.start(HOST, 0)  # the viewer has no token option
        self["viewer"].token = None
        self.stack.push_async_callback(viewer.stop)

    async def _openenv(self) -> None:
        """The fixture game behind the same guard envs.openenv_server's `main` puts around a launched app."""
        import uvicorn
        from uvicorn.importer import import_from_string

        from agentrl.utils.local_only_asgi import LocalOnlyASGI

        target = self["OpenEnv app"]
        if str(ROOT) not in sys.path:  # the app is tests.fixtures...: importable from the repository's root
            sys.path.insert(0, str(ROOT))
        inner = _CountASGI(import_from_string(OPENENV_APP), target, outer=False)
        app = _CountASGI(LocalOnlyASGI(inner, HOST, token=target.token), target, outer=True)
        server = uvicorn.Server(uvicorn.Config(app, host=HOST, port=0, log_level="warning", lifespan="off"))
        task = asyncio.ensure_future(server.serve())
        while not server.started:
            assert not task.done(), "the OpenEnv app's server did not start"
            await asyncio.sleep(0.05)
        target.url = f"http://{HOST}:{server.servers[0].sockets[0].getsockname()[1]}"

        async def stop() -> None:
            server.should_exit = True
            await task

        self.stack.push_async_callback(stop)


# ---- the page and the browser ----------------------------------------------------------------------------------

PAGE = """<!doctype html><html><body><pre id="out">running</pre><script>
const targets = %s;
async function attempt(t) {
  const r = {}, url = t.url + t.path, body = JSON.stringify(t.body);
  try {  // a simple request: no preflight; the page cannot read the answer, but the server would act on it
    const x = await fetch(url, {method: 'POST', mode: 'no-cors', headers: {'Content-Type': 'text/plain'}, body});
    r.simple = 'sent (' + x.type + ')';
  } catch (e) { r.simple = 'blocked'; }
  try {  // JSON: the browser asks first (OPTIONS), and no server grants it
    const x = await fetch(url, {method: 'POST', headers: {'Content-Type': 'application/json'}, body});
    r.json = 'answered ' + x.status;
  } catch (e) { r.json = 'blocked'; }
  if (t.ws) r.ws = await new Promise(done => {  // no CORS rule covers a WebSocket: only its Origin stops it
    const s = new WebSocket(t.url.replace('http', 'ws') + t.ws);
    s.onopen = () => { s.send(JSON.stringify({type: 'reset', data: {}})); done('open'); };
    s.onerror = () => done('refused');
  });
  return r;
}
(async () => {
  const results = {};
  for (const t of targets) results[t.name] = await attempt(t);
  document.getElementById('out').textContent = JSON.stringify(results);
  document.body.dataset.done = '1';
})();
</script></body></html>"""

REBIND = """const [method, path, body, done] = arguments;
(async () => {  // this document's origin is the rebound name: its requests are same-origin, so readable
  const r = {};
  try {
    const init = method === 'GET' ? {} : {method, headers: {'Content-Type': 'application/json'}, body: JSON.stringify(body)};
    const x = await fetch(path, init);
    r.status = x.status; r.text = (await x.text()).slice(0, 300);
  } catch (e) { r.error = String(e); }
  document.body.textContent = JSON.stringify(r);
  done(r);
})();"""


def chromium():
    """tests/test_viewer.py's chromium, with `evil.localtest` resolving to 127.0.0.1 and no proxy."""
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-proxy-server",
                f"--host-resolver-rules=MAP {EVIL} 127.0.0.1"):
        options.add_argument(arg)
    options.binary_location = shutil.which("chromium") or "/usr/bin/chromium"
    return webdriver.Chrome(service=Service(shutil.which("chromedriver") or "/usr/bin/chromedriver"), options=options)


@contextlib.contextmanager
def evil_site(servers: Servers) -> Iterator[str]:
    """The hostile page on its own aiohttp server (127.0.0.1, another port): its URL under the evil name."""
    from aiohttp import web

    page = PAGE % json.dumps([{"name": t.name, "url": t.url, "path": t.path, "body": t.body, "ws": t.ws}
                              for t in servers.targets])

    async def index(request: web.Request) -> web.Response:
        return web.Response(text=page, content_type="text/html")

    app = web.Application()
    app.router.add_get("/", index)
    runner = web.AppRunner(app, access_log=None)
    asyncio.run_coroutine_threadsafe(runner.setup(), servers.loop).result(30)
    site = web.TCPSite(runner, HOST, 0)
    asyncio.run_coroutine_threadsafe(site.start(), servers.loop).result(30)
    try:
        yield f"http://{EVIL}:{runner.addresses[0][1]}/"
    finally:
        asyncio.run_coroutine_threadsafe(runner.cleanup(), servers.loop).result(30)


def attack(driver: Any, servers: Servers) -> tuple[dict, dict]:
    """The page's own attempts, then the rebinding ones: what the page saw of each."""
    from selenium.webdriver.support.ui import WebDriverWait

    with evil_site(servers) as page_url:
        driver.get(page_url)
        WebDriverWait(driver, 60).until(lambda d: d.execute_script("return document.body.dataset.done === '1'"))
        seen = json.loads(driver.execute_script("return document.getElementById('out').textContent"))
    driver.set_script_timeout(30)
    rebound: dict[str, dict] = {}
    for t in servers.targets:
        driver.get(f"http://{EVIL}:{t.port}/")  # the document itself: the server refuses it, its origin stays
        rebound[t.name] = {"act": driver.execute_async_script(REBIND, "POST", t.path, t.body),
                           "read": driver.execute_async_script(REBIND, "GET", t.read, None)}
    return seen, rebound


@pytest.mark.skipif(not (shutil.which("chromium") or Path("/usr/bin/chromium").exists()),
                    reason="chromium is not installed")
def test_a_hostile_page_reaches_every_server_and_is_refused_everywhere(tiny_tokenizer):
    import httpx

    with Servers(tiny_tokenizer) as servers:
        driver = chromium()
        try:
            seen, rebound = attack(driver, servers)
        finally:
            driver.quit()
        arrived = {t.name: list(t.arrived) for t in servers.targets}
        handled = {t.name: list(t.handled) for t in servers.targets}
        controls = {}
        for t in servers.targets:  # a local program is answered, and counted: the counters work
            method = "GET" if t.name == "viewer" else "POST"
            controls[t.name] = httpx.request(method, t.url + t.path, json=None if method == "GET" else t.body,
                                             headers=t.auth, timeout=60).status_code
        counted = {t.name: len(t.handled) for t in servers.targets}
    for t in servers.targets:
        print(f"{t.name}: page {seen[t.name]}; rebinding {[r['status'] for r in rebound[t.name].values()]}; "
              f"the server answered {arrived[t.name]}; handled {handled[t.name]}")
    for name in seen:
        assert seen[name]["simple"] == "sent (opaque)" and seen[name]["json"] == "blocked", (name, seen[name])
    assert seen["OpenEnv app"]["ws"] == "refused"
    for name, tries in rebound.items():
        for what, got in tries.items():
            assert got.get("status") == 403 and "is not a name of this server" in got["text"], (name, what, got)
    for name, requests in arrived.items():
        path = servers[name].path  # every attempt reached the server: simple + rebound POST, the preflight
        assert [m for m, p, _ in requests if p == path].count("POST") == 2, (name, requests)
        assert [m for m, p, _ in requests if p == path].count("OPTIONS") == 1, (name, requests)
        assert all(status in (401, 403, 415) for _, _, status in requests), (name, requests)  # and was refused
    assert ("WS", "/ws", 403) in arrived["OpenEnv app"]
    assert handled == {t: [] for t in handled}, handled  # nothing executed
    assert controls == dict.fromkeys(controls, 200) and counted == dict.fromkeys(counted, 1), (controls, counted)
