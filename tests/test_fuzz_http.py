"""Property-based fuzzing (hypothesis) of every HTTP surface, each served for real on loopback: the
OpenAI endpoint over the scripted in-memory engine (chat completions, text completions, Responses,
sessions, streaming, raw malformed HTTP), the reference tool server and verifier, and the OpenEnv
adapter's parsing of what a (fuzzed) OpenEnv server answers.

Every generated request is a client's (or, for OpenEnv, a server's) mistake or a valid request; the
claims: never a 5xx, never a traceback or Python exception text in a body, the server never stops
answering, its sessions and memory stay bounded, and a good request is still answered afterwards.
The servers run on an event loop in a thread of their own, so each example is a plain blocking request.
The module prints a table of requests tried per surface, 5xx answers and crashes at its end.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import socket
import threading
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable, Iterator

import httpx
import pytest
from aiohttp import web
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from agentrl.data.chat import ChatFormat
from agentrl.env import Action
from agentrl.rollout.openai_server import OpenAIServer
from agentrl.rollout.session import Limits
from agentrl.rollout.tools import get_tool_format
from envs import openenv_env
from envs.openenv_env import OpenEnvEnv, OpenEnvError
from rewards.servers import serve
from rewards.servers import tools as tool_server
from rewards.servers import verifier
from tests.fake_engine import ScriptedEngine
from tests.test_serve_limits import rss_bytes, server_config

# Leaked internals: a traceback, a source location, or an exception's class name with its message.
LEAK = re.compile(r"Traceback \(most recent call last\)|File \"/|\b[A-Z]\w*(Error|Exception): ")
MAX_SESSIONS = 8


def fuzz(n: int):
    return settings(max_examples=n, deadline=None, derandomize=True, database=None, print_blob=False,
                    suppress_health_check=list(HealthCheck))


# ---------------------------------------------------------------- the tally printed at the end


@dataclass
class Tally:
    tried: int = 0
    server_errors: int = 0  # 5xx answers
    crashes: int = 0  # no connection, or the server's loop gone
    leaks: int = 0  # bodies with traceback / exception text
    statuses: Counter = field(default_factory=Counter)


TALLY: dict[str, Tally] = {}


@pytest.fixture(scope="module", autouse=True)
def fuzz_table(request):
    yield
    lines = [f"{'surface':<28}{'requests':>9}{'5xx':>6}{'crashes':>9}{'leaks':>7}  statuses"]
    for name, t in TALLY.items():
        codes = " ".join(f"{k}:{v}" for k, v in sorted(t.statuses.items(), key=lambda kv: str(kv[0])))
        lines.append(f"{name:<28}{t.tried:>9}{t.server_errors:>6}{t.crashes:>9}{t.leaks:>7}  {codes}")
    total = [sum(getattr(t, k) for t in TALLY.values()) for k in ("tried", "server_errors", "crashes", "leaks")]
    lines.append(f"{'total':<28}{total[0]:>9}{total[1]:>6}{total[2]:>9}{total[3]:>7}")
    text = "\nfuzz counts (tests/test_fuzz_http.py)\n" + "\n".join(lines)
    capture = request.config.pluginmanager.getplugin("capturemanager")
    with capture.global_and_fixture_disabled() if capture else contextlib.nullcontext():
        print(text, flush=True)  # shown by a plain `pytest tests/test_fuzz_http.py`, -s or not
    if os.environ.get("AGENTRL_FUZZ_REPORT"):  # e.g. for a note; under xdist a worker's print is not shown
        with open(os.environ["AGENTRL_FUZZ_REPORT"], "a") as out:
            out.write(text + "\n")


def record(surface: str, status: int | None, body: bytes) -> None:
    """Count one answer (None: no answer at all) and assert the claims on it."""
    t = TALLY.setdefault(surface, Tally())
    t.tried += 1
    t.statuses[status if status is not None else "none"] += 1
    text = body.decode("utf-8", "replace")
    if status is not None and status >= 500:
        t.server_errors += 1
    if LEAK.search(text):
        t.leaks += 1
    assert status is None or status < 500, f"{surface}: HTTP {status}: {text[:500]}"
    assert not LEAK.search(text), f"{surface}: internals in the body: {text[:500]}"


# ---------------------------------------------------------------- servers on a loop of their own


class LoopThread:
    """An event loop running in a daemon thread; `call(coro)` runs a coroutine there and waits."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def call(self, coro: Awaitable[Any], timeout: float = 60.0) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    @property
    def alive(self) -> bool:
        return self.thread.is_alive() and self.loop.is_running()

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


@contextlib.contextmanager
def app_served(app: web.Application) -> Iterator[tuple[str, LoopThread]]:
    """`app` on a loopback port in a LoopThread, via rewards.servers.serve."""
    lt, done = LoopThread(), None

    async def up():
        nonlocal done
        cm = serve(app)
        url = await cm.__aenter__()
        done = cm
        return url

    url = lt.call(up())
    try:
        yield url, lt
    finally:
        lt.call(done.__aexit__(None, None, None))
        lt.close()


def send(http: httpx.Client, surface: str, method: str, url: str, lt: LoopThread, **kw) -> tuple[int | None, bytes]:
    headers = dict(kw.pop("headers", None) or {})
    if "content" in kw and not any(k.lower() == "content-type" for k in headers):
        headers["Content-Type"] = "application/json"  # an untyped body is a 415 before any handler: fuzz the handlers
    try:
        reply = http.request(method, url, headers=headers, **kw)
        status, body = reply.status_code, reply.content
    except (httpx.ConnectError, httpx.RemoteProtocolError, httpx.ReadError) as exc:
        if not lt.alive or isinstance(exc, httpx.ConnectError):
            TALLY.setdefault(surface, Tally()).crashes += 1
            raise AssertionError(f"{surface}: the server stopped answering: {exc}") from exc
        status, body = None, b""  # the server closed a connection it found malformed: no answer is fine
    record(surface, status, body)
    return status, body


# ---------------------------------------------------------------- strategies

EDGE = ["", " ", "\x00", "\ud800", "\udfff x", "<tool_call>{", "</tool_call>", "<|im_end|>", "<|im_start|>",
        "{{ 7*7 }}", "{% for x in y %}", "\u202e\u200b", "😀" * 200, "A" * 20_000, "9" * 5000, "-0", "NaN"]
LEAF = st.one_of(st.none(), st.booleans(), st.integers(-(2**70), 2**70), st.floats(allow_nan=False,
                 allow_infinity=False), st.text(max_size=30), st.sampled_from(EDGE))
JSON = st.recursive(LEAF, lambda c: st.lists(c, max_size=4) | st.dictionaries(st.text(max_size=8), c, max_size=4),
                    max_leaves=10)
TEXT = st.one_of(st.text(max_size=80), st.sampled_from(EDGE))
NUM = st.one_of(st.integers(-5, 5000), st.floats(-3, 3, allow_nan=False), st.sampled_from([2**64, -(2**63), 1e308]),
                LEAF)

PART = st.fixed_dictionaries({"type": st.sampled_from(["text", "input_text", "output_text", "image_url"]) | LEAF,
                              "text": TEXT | LEAF})
CONTENT = st.one_of(TEXT, st.none(), st.lists(PART | JSON, max_size=3), JSON)
CALLS = st.lists(st.fixed_dictionaries({"id": TEXT, "type": st.just("function"), "function": st.fixed_dictionaries(
    {"name": TEXT | LEAF, "arguments": st.one_of(TEXT, st.just('{"expression": "1+1"}'), JSON)})}), max_size=2) | JSON
MESSAGE = st.fixed_dictionaries(
    {"role": st.sampled_from(["system", "developer", "user", "assistant", "tool"]) | LEAF},
    optional={"content": CONTENT, "tool_calls": CALLS, "name": TEXT | LEAF, "tool_call_id": TEXT | LEAF}) | JSON
TOOLS = st.lists(st.fixed_dictionaries({"type": st.just("function") | LEAF, "function": st.fixed_dictionaries(
    {"name": TEXT | LEAF}, optional={"description": TEXT | LEAF, "parameters": JSON}) | JSON}), max_size=2) | JSON
SAMPLING = {"temperature": NUM, "top_p": NUM, "max_tokens": NUM, "max_completion_tokens": NUM, "seed": NUM,
            "n": NUM, "stop": st.one_of(TEXT, st.lists(TEXT, max_size=6), JSON), "stream": st.booleans() | LEAF,
            "model": TEXT | LEAF, "logit_bias": JSON, "best_of": NUM, "response_format": JSON, "user": JSON}
# Valid requests (so the fuzz reaches generation, templates and streaming), then each with one field
# replaced by junk, then anything at all.
WORDS = st.text(max_size=60) | st.sampled_from(EDGE[5:])
TURN = st.sampled_from(["user", "system", "assistant", "tool"]).flatmap(lambda role: st.fixed_dictionaries(
    {"role": st.just(role), "content": WORDS}, optional={"name": st.just("calculator")} if role == "tool" else {}))
GOOD_MESSAGES = st.tuples(st.lists(TURN, max_size=4), WORDS).map(
    lambda t: t[0] + [{"role": "user", "content": t[1]}])
GOOD_TOOLS = st.just([{"type": "function", "function": {"name": "calculator", "description": "Arithmetic.",
                                                        "parameters": {"type": "object", "properties": {}}}}])
GOOD_SAMPLING = {"temperature": st.floats(0, 2), "top_p": st.floats(0, 1), "max_tokens": st.integers(1, 64),
                 "seed": st.integers(0, 2**40), "stop": st.lists(st.text(min_size=1, max_size=4), max_size=2)}


def mutated(valid: st.SearchStrategy, fields: dict[str, st.SearchStrategy]) -> st.SearchStrategy:
    """`valid` bodies, a third of them with one field (of `fields`) dropped or replaced by junk."""
    def mutate(body: dict, key: str, junk: Any, drop: bool) -> dict:
        body = dict(body)
        body.pop(key, None) if drop else body.__setitem__(key, junk)
        return body

    one = st.sampled_from(sorted(fields)).flatmap(lambda k: st.tuples(st.just(k), fields[k]))
    broken = st.tuples(valid, one, st.booleans()).map(lambda t: mutate(t[0], t[1][0], t[1][1], t[2]))
    return st.one_of(valid, valid, broken, broken, st.fixed_dictionaries({}, optional=fields) | JSON)


CHAT = mutated(st.fixed_dictionaries({"model": st.just("m"), "messages": GOOD_MESSAGES},
                                     optional={"tools": GOOD_TOOLS, **GOOD_SAMPLING}),
               {"messages": st.lists(MESSAGE, max_size=4) | JSON, "tools": TOOLS, **SAMPLING})
COMPLETION = mutated(st.fixed_dictionaries({"prompt": WORDS.filter(bool) | st.lists(st.integers(0, 200), min_size=1,
                                                                                   max_size=20)},
                                           optional=GOOD_SAMPLING),
                     {"prompt": st.one_of(TEXT, st.lists(st.integers(-3, 70_000), max_size=40),
                                          st.lists(TEXT | JSON, max_size=2), JSON), **SAMPLING})
ITEM = st.one_of(
    st.fixed_dictionaries({"role": st.sampled_from(["user", "system", "developer", "assistant", "tool"]) | LEAF},
                          optional={"type": st.just("message") | LEAF, "content": CONTENT}),
    st.fixed_dictionaries({"type": st.just("function_call")}, optional={"call_id": TEXT | LEAF, "name": TEXT | LEAF,
                                                                        "arguments": TEXT | JSON}),
    st.fixed_dictionaries({"type": st.just("function_call_output")}, optional={"call_id": TEXT | LEAF,
                                                                               "output": CONTENT}),
    JSON)
GOOD_ITEMS = st.lists(st.fixed_dictionaries({"role": st.sampled_from(["user", "assistant", "system"]),
                                             "content": WORDS}), max_size=3).map(
    lambda items: items + [{"role": "user", "content": "Go on."}])
RESPONSES = mutated(
    st.fixed_dictionaries({"model": st.just("m"), "input": WORDS.filter(bool) | GOOD_ITEMS},
                          optional={"instructions": WORDS, "max_output_tokens": st.integers(1, 64),
                                    "temperature": st.floats(0, 2),
                                    "tools": st.just([{"type": "function", "name": "calculator"}])}),
    {"input": st.one_of(TEXT, st.lists(ITEM, max_size=4), JSON), "instructions": TEXT | LEAF,
     "tools": st.lists(st.fixed_dictionaries({"type": st.just("function") | LEAF, "name": TEXT | LEAF},
                                             optional={"parameters": JSON, "strict": LEAF}), max_size=2) | JSON,
     "tool_choice": LEAF, "text": JSON, "max_output_tokens": NUM, "max_tokens": NUM, "temperature": NUM,
     "top_p": NUM, "stream": st.booleans() | LEAF, "previous_response_id": LEAF, "n": NUM, "metadata": JSON,
     "background": LEAF})


def encoded(body: st.SearchStrategy) -> st.SearchStrategy[bytes]:
    """Mostly JSON text of `body`; else raw bytes, or that JSON cut short, nested deep or with NaN in it."""
    as_json = body.map(lambda b: json.dumps(b).encode())
    return st.one_of(
        as_json, as_json, as_json, as_json, as_json, as_json,
        st.binary(max_size=300),
        st.tuples(as_json, st.integers(0, 60)).map(lambda t: t[0][:t[1]]),
        st.integers(50, 5000).map(lambda d: b"[" * d + b"]" * d),
        st.sampled_from([b'{"messages": NaN}', b'{"temperature": Infinity, "messages": []}', b"\xff\xfe{}",
                         b'{"seed": ' + b"9" * 5000 + b"}", b'"\\ud800"', b"null", b"{}" * 1000]))


HEADERS = st.fixed_dictionaries({}, optional={
    "content-type": st.sampled_from(["application/json", "text/plain", "multipart/form-data; boundary=x",
                                     "application/json; charset=latin-1", ""]),
    "authorization": st.sampled_from(["Bearer", "Bearer x", "Basic Zm9vOmJhcg==", "bearer" + "x" * 3000]),
    "accept": st.sampled_from(["*/*", "text/event-stream", "application/xml"]),
    "idempotency-key": st.text(st.characters(min_codepoint=33, max_codepoint=126), max_size=60)})


# ---------------------------------------------------------------- the OpenAI endpoint


@pytest.fixture(scope="module")
def openai_served(tiny_tokenizer):
    fmt = ChatFormat(tiny_tokenizer)
    engine = ScriptedEngine(tiny_tokenizer, lambda prompt, i: "The answer is 4.")
    cfg = server_config(max_sessions=MAX_SESSIONS, session_idle_timeout_s=2.0, session_max_turns=6,
                        session_max_tokens=4096)
    lt = LoopThread()
    server = OpenAIServer(fmt, cfg, get_tool_format("hermes"), Limits(1024, 16, 8), engine=engine)
    lt.call(server.start())
    with httpx.Client(timeout=30.0, trust_env=False) as http:
        yield server, lt, http
    lt.call(server.stop())
    lt.close()


def good_chat(server, http: httpx.Client, base: str | None = None) -> str:
    reply = http.post(f"{base or server.url + '/v1'}/chat/completions",
                      json={"model": "m", "messages": [{"role": "user", "content": "What is 2 + 2?"}]})
    assert reply.status_code == 200, reply.text
    return reply.json()["choices"][0]["message"]["content"]


ENDPOINTS = {"chat": ("/chat/completions", CHAT), "completions": ("/completions", COMPLETION),
             "responses": ("/responses", RESPONSES)}


@pytest.mark.parametrize("kind", list(ENDPOINTS))
def test_openai_endpoint_answers_every_malformed_body_with_a_4xx(openai_served, kind):
    server, lt, http = openai_served
    path, strategy = ENDPOINTS[kind]
    before = rss_bytes()

    @fuzz(200)
    @given(body=encoded(strategy), headers=HEADERS)
    def one(body: bytes, headers: dict[str, str]) -> None:
        headers.pop("authorization", None)  # no api_key here: authentication is fuzzed on its own
        send(http, f"openai {kind}", "POST", f"{server.url}/v1{path}", lt, content=body, headers=headers)

    one()
    assert lt.alive and good_chat(server, http) == "The answer is 4."
    assert rss_bytes() - before < 512 * 2**20


def test_openai_streaming_fails_as_cleanly_as_it_answers(openai_served):
    server, lt, http = openai_served
    streamed = st.sampled_from(list(ENDPOINTS.values())).flatmap(
        lambda e: st.tuples(st.just(e[0]), e[1].filter(lambda b: isinstance(b, dict)).map(
            lambda b: {**b, "stream": True})))

    @fuzz(150)
    @given(case=streamed)
    def one(case: tuple[str, dict]) -> None:
        path, body = case
        status, text = send(http, "openai streaming", "POST", f"{server.url}/v1{path}", lt,
                            content=json.dumps(body).encode())
        if status == 200 and b"data: " in text:  # an error after the stream began is an event, still clean
            assert b"data: [DONE]" in text

    one()
    assert lt.alive and good_chat(server, http) == "The answer is 4."


def test_openai_sessions_stay_bounded_under_fuzz(openai_served):
    server, lt, http = openai_served
    sids: list[str] = []
    op = st.one_of(
        st.tuples(st.just("open"), st.just(b"")),
        st.tuples(st.sampled_from(["get", "delete"]), st.just(b"")),
        st.tuples(st.sampled_from(["chat", "responses", "completions"]), st.just(b"")).flatmap(
            lambda t: st.tuples(st.just(t[0]), encoded(ENDPOINTS[t[0]][1]))))
    sid_choice = st.one_of(st.integers(0, 50), st.sampled_from(["", "x" * 5000, "../..", "%00", "nope", "ü"]))

    @fuzz(250)
    @given(op=op, which=sid_choice)
    def one(op: tuple[str, bytes], which: int | str) -> None:
        kind, body = op
        sid = sids[which % len(sids)] if isinstance(which, int) and sids else str(which)
        base = f"{server.url}/sessions/{httpx.URL(path=sid).raw_path.decode()}"
        if kind == "open":
            status, reply = send(http, "openai sessions", "POST", f"{server.url}/sessions", lt)
            if status == 200:
                sids.append(json.loads(reply)["id"])
        elif kind == "get":
            send(http, "openai sessions", "GET", base, lt)
        elif kind == "delete":
            send(http, "openai sessions", "DELETE", base, lt)
        else:
            send(http, "openai sessions", "POST", f"{base}/v1{ENDPOINTS[kind][0]}", lt, content=body)
        assert len(server.sessions) <= MAX_SESSIONS

    one()
    assert lt.alive and len(server.sessions) <= MAX_SESSIONS
    lt.call(asyncio.sleep(0))
    server.sweep(now=float("inf"))  # as the sweep does once every session has been idle its timeout
    opened = http.post(f"{server.url}/sessions")
    assert not server.sessions or opened.status_code == 200
    assert good_chat(server, http, opened.json()["base_url"]) == "The answer is 4."


RAW_METHODS = st.sampled_from([b"GET", b"POST", b"PUT", b"DELETE", b"PATCH", b"OPTIONS", b"HEAD", b"TRACE",
                               b"G\x00T", b"POST" * 20, b""])
RAW_PATHS = st.one_of(st.sampled_from([b"/v1/chat/completions", b"/v1/models", b"/sessions", b"/sessions/x/v1/models",
                                       b"/v1/responses", b"/../../etc/passwd", b"*", b"/v1/chat/completions?x=\xff",
                                       b"/" + b"a" * 9000, b"/%zz", b"http://evil/v1/models"]),
                      st.binary(max_size=40).map(lambda b: b"/" + b.replace(b" ", b"").replace(b"\r", b"")
                                                 .replace(b"\n", b"")))
RAW_HEADERS = st.lists(st.sampled_from([
    b"Content-Length: 5", b"Content-Length: -1", b"Content-Length: 99999999999999999999", b"Content-Length: abc",
    b"Transfer-Encoding: chunked", b"Transfer-Encoding: gzip, chunked", b"Content-Type: application/json",
    b"Authorization: Bearer \xff\xfe", b"X-Long: " + b"x" * 9000, b"Bad Header: x", b"NoColon",
    b"Host: \x00", b"Connection: upgrade", b"Upgrade: websocket", b"Expect: 100-continue",
    b"Content-Encoding: gzip"]), max_size=4)


def test_raw_malformed_http_never_gets_a_5xx(openai_served):
    server, lt, http = openai_served
    port = server.port

    @fuzz(200)
    @given(method=RAW_METHODS, path=RAW_PATHS, headers=RAW_HEADERS, body=st.binary(max_size=64),
           version=st.sampled_from([b"HTTP/1.1", b"HTTP/1.0", b"HTTP/2.0", b"HTTP/9", b"FOO"]))
    def one(method: bytes, path: bytes, headers: list[bytes], body: bytes, version: bytes) -> None:
        framed = any(h.lower().startswith((b"content-length", b"transfer-encoding")) for h in headers)
        length = [] if framed else [b"Content-Length: %d" % len(body)]
        head = b"\r\n".join([method + b" " + path + b" " + version, b"Host: 127.0.0.1", *headers, *length,
                             b"Connection: close"])
        data = b""
        try:  # no half-close: aiohttp drops a connection whose client shut its side before the answer
            with socket.create_connection(("127.0.0.1", port), timeout=0.5) as sock:
                sock.sendall(head + b"\r\n\r\n" + body)
                while chunk := sock.recv(65536):
                    data += chunk
        except ConnectionRefusedError:
            TALLY.setdefault("raw http", Tally()).crashes += 1
            raise
        except (ConnectionResetError, TimeoutError, socket.timeout):
            pass  # still waiting for the body its headers announced, or closed on a malformed request
        match = re.match(rb"HTTP/1\.[01] (\d{3})", data)
        record("raw http", int(match.group(1)) if match else None, data)

    one()
    assert lt.alive and good_chat(server, http) == "The answer is 4."


# ---------------------------------------------------------------- the tool server and the verifier


def fuzz_routes(http: httpx.Client, surface: str, url: str, lt, route, body, path: str,
                answer_ok: Callable[[bytes], bool]) -> None:
    """250 fuzzed requests (a route, a body drawn from `body`, headers) to a served app; every 200 on
    `path` must satisfy `answer_ok` (`send` checks the rest: no 5xx, the server alive)."""
    @fuzz(250)
    @given(route=route, body=encoded(body), headers=HEADERS)
    def one(route: tuple[str, str], body: bytes, headers: dict[str, str]) -> None:
        status, reply = send(http, surface, route[0], url + route[1], lt, content=body, headers=headers)
        if status == 200 and route[1] == path:
            assert answer_ok(reply), reply[:200]

    one()


def test_tool_server_answers_bad_calls_with_a_4xx_or_a_tool_error():
    expression = st.one_of(TEXT, st.from_regex(r"[-+*/() 0-9.e]{0,120}", fullmatch=True), LEAF, JSON)
    call = st.fixed_dictionaries({}, optional={
        "name": st.sampled_from(["calculator", "lookup"]) | TEXT | LEAF,
        "arguments": st.fixed_dictionaries({}, optional={"expression": expression, "key": TEXT | LEAF}) | JSON}) | JSON
    route = st.sampled_from([("POST", "/call")] * 6 + [("GET", "/tools"), ("GET", "/call"), ("PUT", "/tools"),
                                                      ("GET", "/stats"), ("POST", "/nope"), ("GET", "/health")])
    with app_served(tool_server.make_app()) as (url, lt), httpx.Client(timeout=30.0, trust_env=False) as http:
        fuzz_routes(http, "tool server", url, lt, route, call, "/call",
                    lambda reply: isinstance(json.loads(reply)["content"], str))
        ok = http.post(f"{url}/call", json={"name": "calculator", "arguments": {"expression": "37 * (89 - 4)"}})
        assert lt.alive and ok.json() == {"content": "3145", "is_error": False}


def test_verifier_answers_unscorable_requests_with_a_400():
    body = st.fixed_dictionaries({}, optional={
        "episode_id": LEAF, "task": st.fixed_dictionaries({}, optional={"answer": NUM | TEXT | JSON}) | JSON,
        "messages": st.lists(MESSAGE, max_size=3) | JSON, "completion": TEXT | LEAF}) | JSON
    route = st.sampled_from([("POST", "/verify")] * 8 + [("GET", "/verify"), ("GET", "/health"), ("POST", "/x")])
    with app_served(verifier.make_app()) as (url, lt), httpx.Client(timeout=30.0, trust_env=False) as http:
        fuzz_routes(http, "verifier", url, lt, route, body, "/verify",
                    lambda reply: json.loads(reply)["reward"] in (0.0, 1.0))
        ok = http.post(f"{url}/verify", json={"task": {"answer": 42}, "messages": [
            {"role": "assistant", "content": "so 42"}]})
        assert lt.alive and ok.json()["reward"] == 1.0


# ---------------------------------------------------------------- the OpenEnv adapter's parsing


class FakeOpenEnv:
    """An OpenEnv-shaped server whose GET /schema and WebSocket replies are set per example."""

    def __init__(self) -> None:
        self.schema: tuple[int, bytes] = (200, b"{}")
        self.replies: list[str] = []
        self.app = web.Application()
        self.app.router.add_get("/schema", self._schema)
        self.app.router.add_get("/ws", self._ws)

    async def _schema(self, request: web.Request) -> web.Response:
        return web.Response(status=self.schema[0], body=self.schema[1])

    async def _ws(self, request: web.Request) -> web.WebSocketResponse:
        ws = web.WebSocketResponse()
        await ws.prepare(request)
        replies = list(self.replies)
        async for msg in ws:
            if json.loads(msg.data).get("type") == "close" or not replies:
                break
            await ws.send_str(replies.pop(0))
        await ws.close()
        return ws


OBSERVATION = st.one_of(st.fixed_dictionaries({}, optional={"prompt": TEXT | LEAF, "text": TEXT | LEAF}), JSON)
RESULT = st.fixed_dictionaries({}, optional={"observation": OBSERVATION, "reward": NUM, "done": st.booleans() | LEAF})
MESSAGE_OUT = st.one_of(
    st.fixed_dictionaries({"type": st.just("observation"), "data": RESULT | JSON}),
    st.fixed_dictionaries({"type": st.just("error"), "data": st.fixed_dictionaries({}, optional={
        "code": st.sampled_from(["VALIDATION_ERROR", "CAPACITY_REACHED"]) | LEAF, "message": TEXT | LEAF,
        "errors": st.lists(st.fixed_dictionaries({}, optional={"loc": JSON, "msg": LEAF}) | JSON, max_size=2) | JSON})
        | JSON}),
    JSON).map(json.dumps) | st.sampled_from(["not json", "", "[1, 2", '{"type": "observation", "data": NaN}'])
SCHEMA = st.one_of(
    st.tuples(st.just(200), st.fixed_dictionaries({"action": st.fixed_dictionaries({}, optional={
        "properties": st.dictionaries(st.sampled_from(["message", "guess", "metadata"]), JSON | st.fixed_dictionaries(
            {"type": st.sampled_from(["string", "integer"]) | LEAF}), max_size=2) | JSON}) | JSON}).map(json.dumps)),
    st.tuples(st.sampled_from([200, 404, 500]), JSON.map(json.dumps)),
    st.tuples(st.just(200), st.sampled_from(["<html>", "", "[]"])))


def test_openenv_adapter_turns_any_server_reply_into_a_result_or_a_clear_error():
    fake = FakeOpenEnv()
    with app_served(fake.app) as (url, lt):
        @fuzz(150)
        @given(schema=SCHEMA, replies=st.lists(MESSAGE_OUT, min_size=1, max_size=3), action=TEXT)
        def one(schema: tuple[int, str], replies: list[str], action: str) -> None:
            fake.schema, fake.replies = (schema[0], schema[1].encode()), replies
            openenv_env._SCHEMAS.clear()
            t = TALLY.setdefault("openenv adapter (replies)", Tally())
            t.tried += 1

            async def episode() -> str:
                env = OpenEnvEnv(url=url, timeout_s=5.0)
                try:
                    messages = await env.reset({"id": "t", "seed": 1})
                    assert all(isinstance(m["content"], str) for m in messages)
                    result = await env.step(Action(action))
                    assert isinstance(result.reward, float) and isinstance(result.done, bool)
                    assert result.observation is None or isinstance(result.observation, str)
                    return "ok"
                except OpenEnvError as exc:  # the server's failure, said plainly
                    assert str(exc) and "OpenEnv" in str(exc)
                    return "OpenEnvError"
                finally:
                    await env.close()

            try:
                t.statuses[asyncio.run(episode())] += 1
            except AssertionError:
                raise
            except Exception as exc:  # anything else is the adapter's bug: it must say what the server did
                t.crashes += 1
                raise AssertionError(f"OpenEnvEnv raised {type(exc).__name__}: {exc}") from exc

        one()
        assert lt.alive
