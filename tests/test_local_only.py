"""Local servers answer local programs only (agentrl.utils.local_only): the middleware on its own, then every
server the project starts, as a real process on loopback, against what a hostile web page can send without a
CORS preflight (text/plain or form bodies, its own name as Host after DNS rebinding, its Origin) while a
normal JSON client is still answered. The same attempts from a real page in chromium:
tests/test_cross_site_browser.py."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Iterator

import httpx
import pytest
from aiohttp import web

from agentrl.utils.local_only import allowed_names, host_name, warn_if_exposed
from rewards.servers import serve

ROOT = Path(__file__).resolve().parents[1]
EVIL = {"Origin": "http://evil.example", "Host": "evil.example:8767"}
HOSTILE = [  # (what, headers, body): each refused, and the handler never runs
    ("text/plain POST", {"Content-Type": "text/plain"}, b'{"x": 1}'),
    ("form POST", {"Content-Type": "application/x-www-form-urlencoded"}, b"x=1"),
    ("multipart POST", {"Content-Type": "multipart/form-data; boundary=b"}, b"--b--\r\n"),
    ("untyped body POST", {}, b'{"x": 1}'),  # fetch() with a Blob body: no Content-Type at all
    ("foreign Host", {"Content-Type": "application/json", "Host": "evil.example:8767"}, b'{"x": 1}'),
    ("rebinding Host, no port", {"Content-Type": "application/json", "Host": "evil.example"}, b'{"x": 1}'),
    ("foreign Origin", {"Content-Type": "application/json", "Origin": "http://evil.example"}, b'{"x": 1}'),
    ("null Origin", {"Content-Type": "application/json", "Origin": "null"}, b'{"x": 1}'),
    ("all of it", {"Content-Type": "text/plain", **EVIL}, b'{"x": 1}'),
]


def no_cors(reply: httpx.Response) -> None:
    assert not [h for h in reply.headers if h.lower().startswith("access-control-allow")], reply.headers


# ---------------------------------------------------------------- the middleware


def echo_app(calls: list[str]) -> web.Application:
    async def echo(request: web.Request) -> web.Response:
        calls.append(request.method)
        return web.json_response({"got": (await request.read()).decode()})

    app = web.Application()
    app.router.add_route("*", "/echo", echo)
    return app


@contextlib.contextmanager
def echo_served(**kw) -> Iterator[tuple[str, list[str]]]:
    """A tiny app behind `serve` (so behind local_only) on 127.0.0.1, driven from a thread's loop."""
    calls: list[str] = []
    loop = asyncio.new_event_loop()
    cm = serve(echo_app(calls), **kw)
    url = loop.run_until_complete(cm.__aenter__())
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        yield url, calls
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.run_until_complete(cm.__aexit__(None, None, None))
        loop.close()


@pytest.mark.parametrize("what,headers,body", HOSTILE, ids=[h[0] for h in HOSTILE])
def test_what_a_web_page_can_send_is_refused(what, headers, body):
    with echo_served() as (url, calls):
        reply = httpx.post(url + "/echo", content=body, headers=headers)
    assert reply.status_code in (403, 415), (what, reply.status_code, reply.text)
    assert reply.json()["error"] and calls == [], what
    no_cors(reply)


def test_a_json_client_on_loopback_is_answered():
    with echo_served() as (url, calls):
        port = url.rsplit(":", 1)[1]
        replies = [httpx.post(url + "/echo", json={"x": 1}, headers={"Host": host})
                   for host in ("127.0.0.1", f"127.0.0.1:{port}", "localhost", f"localhost:{port}", f"[::1]:{port}")]
        replies.append(httpx.post(url + "/echo", content=b"{}", headers={"Content-Type": "application/json; charset=utf-8"}))
        replies.append(httpx.post(url + "/echo", content=b"{}", headers={"Content-Type": "Application/JSON"}))
        replies.append(httpx.post(url + "/echo", json={}, headers={"Origin": f"http://127.0.0.1:{port}"}))  # same origin
        replies.append(httpx.post(url + "/echo"))  # no body, no type: POST /sessions, POST /stats/reset
        replies.append(httpx.delete(url + "/echo"))  # browsers preflight DELETE anyway
        replies.append(httpx.get(url + "/echo"))
    assert [r.status_code for r in replies] == [200] * len(replies), [(r.status_code, r.text) for r in replies]
    assert len(calls) == len(replies)
    for reply in replies:
        no_cors(reply)


def test_a_preflight_gets_no_cors_grant():
    with echo_served() as (url, _):
        reply = httpx.options(url + "/echo", headers={"Origin": "http://evil.example",
                                                      "Access-Control-Request-Method": "POST",
                                                      "Access-Control-Request-Headers": "content-type"})
    assert reply.status_code == 403
    no_cors(reply)


def test_allow_host_adds_a_name_and_only_that_name():
    with echo_served(allow_hosts=("box.lan",)) as (url, _):
        mine = httpx.post(url + "/echo", json={}, headers={"Host": "box.lan:8767"})
        other = httpx.post(url + "/echo", json={}, headers={"Host": "evil.example:8767"})
    assert (mine.status_code, other.status_code) == (200, 403)


def test_a_token_is_required_when_set():
    with echo_served(token="s3cret") as (url, _):
        none = httpx.post(url + "/echo", json={})
        wrong = httpx.post(url + "/echo", json={}, headers={"Authorization": "Bearer nope"})
        right = httpx.post(url + "/echo", json={}, headers={"Authorization": "Bearer s3cret"})
    assert [r.status_code for r in (none, wrong, right)] == [401, 401, 200]


def test_the_names_of_each_kind_of_bind():
    assert allowed_names("127.0.0.1") == {"localhost", "127.0.0.1", "::1"}
    assert "10.1.2.3" in allowed_names("10.1.2.3") and "localhost" not in allowed_names("10.1.2.3")
    assert {"localhost", "box.lan"} <= allowed_names("0.0.0.0", ["box.lan:80"])
    assert [host_name(h) for h in ("[::1]:80", "::1", "Localhost:8000", "a.b")] == ["::1", "::1", "localhost", "a.b"]


def test_one_loopback_test_for_the_servers_and_the_weight_collective():
    """agentrl.utils.hosts.is_loopback is the only one: the weight collective (which must not import aiohttp)
    and the servers' rules both use it."""
    import subprocess

    from agentrl.utils import hosts, local_only
    from agentrl.weights import collective

    assert collective.is_loopback is hosts.is_loopback is local_only.is_loopback
    yes = ["localhost", "LocalHost", "127.0.0.1", "127.8.9.10", "::1", "[::1]", " 127.0.0.1 "]
    no = ["0.0.0.0", "::", "10.0.0.1", "evil.localtest", "localhost.evil.example", ""]
    assert [h for h in yes if not hosts.is_loopback(h)] == [] and [h for h in no if hosts.is_loopback(h)] == []
    leaf = subprocess.run([sys.executable, "-c", "import sys, agentrl.utils.local_only, agentrl.utils.local_only_asgi; "
                           "print(sorted(m for m in ('aiohttp', 'torch') if m in sys.modules))"],
                          cwd=ROOT, capture_output=True, text=True, check=True)
    assert leaf.stdout.strip() == "[]", leaf  # the rules, and the ASGI guard an OpenEnv app runs, stay light


def test_a_wildcard_bind_takes_ip_literals_not_foreign_names():
    with echo_served(host="0.0.0.0") as (url, _):
        port = url.rsplit(":", 1)[1]
        base = f"http://127.0.0.1:{port}/echo"
        by_ip = httpx.post(base, json={}, headers={"Host": f"192.168.1.7:{port}"})
        by_name = httpx.post(base, json={}, headers={"Host": f"evil.example:{port}"})
    assert (by_ip.status_code, by_name.status_code) == (200, 403)


def test_a_non_loopback_listen_without_a_token_warns(caplog):
    log = logging.getLogger("test.local_only")
    with caplog.at_level(logging.WARNING):
        warn_if_exposed(log, "0.0.0.0", "sandbox server", "anyone who can reach this port can run code", False)
        warn_if_exposed(log, "0.0.0.0", "sandbox server", "quiet: a token guards it", True)
        warn_if_exposed(log, "127.0.0.1", "sandbox server", "quiet: loopback", False)
    assert len(caplog.records) == 1 and "can run code" in caplog.records[0].getMessage()


# ---------------------------------------------------------------- the real servers, as processes

SERVERS = {  # module -> (label, extra args, a normal JSON request: path, body, expected status)
    "rewards.servers.sandbox": ("sandbox server", ["--warm", "0"],
                                ("/call", {"name": "python", "arguments": {"code": "print(6*7)"}}, 200)),
    "rewards.servers.tools": ("tool server", [], ("/call", {"name": "calculator", "arguments": {"expression": "6*7"}}, 200)),
    "rewards.servers.verifier": ("verifier", [], ("/verify", {"task": {"answer": 42}, "completion": "42"}, 200)),
}


@contextlib.contextmanager
def started(module: str, *args: str, env: dict[str, str] | None = None) -> Iterator[tuple[str, subprocess.Popen]]:
    proc = subprocess.Popen([sys.executable, "-m", module, "--port", "0", *args], cwd=ROOT,
                            env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()  # "<label> listening on http://<host>:<port>"
        assert " listening on http://" in line, proc.stderr.read()[-3000:] if proc.poll() is not None else line
        yield line.split()[-1], proc
    finally:
        proc.terminate()
        proc.wait(timeout=10)


@pytest.mark.parametrize("module", sorted(SERVERS))
def test_each_server_refuses_a_web_page_and_answers_its_client(module):
    label, args, (path, body, ok) = SERVERS[module]
    with started(module, *args) as (url, _):
        text_plain = httpx.post(url + path, content=b'{"name": "python", "arguments": {"code": "print(42)"}}',
                                headers={"Content-Type": "text/plain", **EVIL})
        foreign_host = httpx.post(url + path, json=body, headers={"Host": "evil.example:8767"})
        simple = httpx.post(url + path, json=body, headers={"Content-Type": "text/plain"})
        normal = httpx.post(url + path, json=body, timeout=60)
    statuses = {"text/plain + Origin + Host evil": text_plain.status_code, "foreign Host": foreign_host.status_code,
                "text/plain": simple.status_code, "JSON": normal.status_code}
    print(f"{label}: {statuses}")
    assert statuses == {"text/plain + Origin + Host evil": 403, "foreign Host": 403, "text/plain": 415,
                        "JSON": ok}, (statuses, normal.text)
    assert "42" in normal.text or module.endswith("verifier")
    for reply in (text_plain, foreign_host, simple, normal):
        no_cors(reply)


def test_a_server_on_every_interface_without_a_token_warns_and_with_one_requires_it(tmp_path):
    with started("rewards.servers.tools", "--host", "0.0.0.0") as (url, proc):
        port = url.rsplit(":", 1)[1]
        ok = httpx.post(f"http://127.0.0.1:{port}/call", json={"name": "calculator", "arguments": {"expression": "1+1"}})
        proc.terminate()
        _, err = proc.communicate(timeout=10)
    assert ok.status_code == 200 and "not loopback" in err and "can call its tools" in err, err
    (tmp_path / "token").write_text("t0k3n\n")
    with started("rewards.servers.tools", "--token-file", str(tmp_path / "token")) as (url, _):
        call = {"name": "calculator", "arguments": {"expression": "1+1"}}
        without = httpx.post(url + "/call", json=call)
        with_it = httpx.post(url + "/call", json=call, headers={"Authorization": "Bearer t0k3n"})
    assert (without.status_code, with_it.status_code) == (401, 200)


# ---------------------------------------------------------------- agentrl.serve's endpoint (no vLLM)


def test_the_openai_endpoint_refuses_a_web_page_and_answers_its_client(tiny_tokenizer):
    from agentrl.config import ServerConfig
    from agentrl.data.chat import ChatFormat
    from agentrl.rollout.openai_server import OpenAIServer
    from agentrl.rollout.session import Limits
    from agentrl.rollout.tools import get_tool_format
    from tests.fake_engine import ScriptedEngine

    async def run():
        engine = ScriptedEngine(tiny_tokenizer, lambda prompt, i: "42")
        srv = OpenAIServer(ChatFormat(tiny_tokenizer), ServerConfig(allow_hosts=["box.lan"]), get_tool_format("hermes"),
                           Limits(512, 16, 100), engine=engine)
        await srv.start()
        chat = {"model": "agentrl", "messages": [{"role": "user", "content": "6*7?"}]}
        try:
            async with httpx.AsyncClient(base_url=srv.url, timeout=30) as http:
                return {"text/plain + Origin + Host evil": await http.post("/v1/chat/completions", json=chat,
                                                                           headers={"Content-Type": "text/plain", **EVIL}),
                        "foreign Host": await http.post("/v1/chat/completions", json=chat, headers={"Host": "evil.example"}),
                        "text/plain": await http.post("/v1/chat/completions", json=chat,
                                                      headers={"Content-Type": "text/plain"}),
                        "JSON": await http.post("/v1/chat/completions", json=chat),
                        "JSON, allowed host": await http.post("/v1/chat/completions", json=chat,
                                                              headers={"Host": "box.lan"}),
                        "open a session": await http.post("/sessions")}
        finally:
            await srv.stop()

    replies = asyncio.run(run())
    statuses = {k: r.status_code for k, r in replies.items()}
    print(f"openai endpoint: {statuses}")
    assert statuses == {"text/plain + Origin + Host evil": 403, "foreign Host": 403, "text/plain": 415, "JSON": 200,
                        "JSON, allowed host": 200, "open a session": 200}, {k: r.text for k, r in replies.items()}
    assert replies["JSON"].json()["choices"][0]["message"]["content"] == "42"
    for reply in replies.values():
        no_cors(reply)


def test_serve_passes_allow_host_on_as_server_allow_hosts(monkeypatch):
    import agentrl.serve as serve_cli

    seen = {}

    def load(path, overrides):
        seen["overrides"] = overrides
        raise serve_cli.ConfigError("stop here")

    monkeypatch.setattr(serve_cli, "load_config", load)
    monkeypatch.setattr(serve_cli, "input_error", lambda exc: 2)
    assert serve_cli.main(["--model", "default", "--allow-host", "box.lan", "--allow-host", "gpu1"]) == 2
    assert 'server.allow_hosts=["box.lan", "gpu1"]' in seen["overrides"]
