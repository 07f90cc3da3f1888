"""envs.openenv_env against REAL OpenEnv servers on loopback (the fixture game tests/fixtures/openenv_guess.py,
served by uvicorn): reset/step/reward/done with hand-written Actions, text and typed (JSON) actions, the
adapter starting `app:` itself (shared, restarted after a kill), and every server failure raising a clear
OpenEnvError, which a rollout records as env_error, never as reward 0. No vLLM: one episode runs through
the real rollout code with a scripted engine."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

import pytest

import openenv.core  # noqa: F401  (the envs extra installs it; missing, this file fails)

from fake_engine import ScriptedEngine

from agentrl.data.chat import ChatFormat
from agentrl.config import RolloutConfig
from agentrl.config.load import load_config
from agentrl.env import Action
from agentrl.rollout.episode import EpisodeSpec, run_episode
from agentrl.run.startup import prepare
from envs import openenv_server
from envs.openenv_env import OpenEnvEnv, OpenEnvError, extract_json_object, render

ROOT = Path(__file__).resolve().parents[1]
TEXT_APP = "tests.fixtures.openenv_guess:app"
TYPED_APP = "tests.fixtures.openenv_guess:typed_app"
LAUNCHED: dict[str, openenv_server.LocalServer] = {}


@pytest.fixture(scope="module")
def url():
    """One text-action server for the module, started the way a user would: uvicorn on a free port."""
    server = openenv_server.launch(TEXT_APP)  # the app under uvicorn on 127.0.0.1, waits for /health
    LAUNCHED[server.url] = server
    yield server.url
    server.stop()


def run(coro):
    return asyncio.run(coro)


async def bisect(env: OpenEnvEnv, low: int = 1, high: int = 15) -> tuple[list, int]:
    """Play the game to the end with hand-written guesses; (step results, the number found)."""
    results, guess = [], 0
    while True:
        guess = (low + high) // 2
        result = await env.step(Action(str(guess)))
        results.append(result)
        if result.done:
            return results, guess
        low, high = (guess + 1, high) if result.observation == "Higher." else (low, guess - 1)


def test_reset_step_reward_done_round_trip_with_a_text_action(url):
    task = OpenEnvEnv.make_tasks(1, 0, "train")[0]

    async def main():
        env = OpenEnvEnv(url=url, success_reward=1.0)
        first = await env.reset(task)
        results, found = await bisect(env)
        await env.close()
        again = OpenEnvEnv(url=url)  # the same task (seed) is the same number
        await again.reset(task)
        wrong = await again.step(Action("a lot"))  # not a number: the game says so, the episode goes on
        _, found_again = await bisect(again, found, found)
        await again.close()
        return first, wrong, results, found, found_again

    first, wrong, results, found, found_again = run(main())
    assert first == [{"role": "user", "content": "Guess my number from 1 to 15."}]
    assert (wrong.observation, wrong.reward, wrong.done) == ("Reply with one number.", 0.0, False)
    assert [r.reward for r in results] == [0.0] * (len(results) - 1) + [1.0]
    assert results[-1].done and results[-1].observation is None and results[-1].info == {"success": True}
    assert all(r.observation in ("Higher.", "Lower.") and r.info == {"success": False} for r in results[:-1])
    assert found == found_again


def test_tasks_are_json_and_their_keys_reach_the_servers_reset(url):
    tasks = OpenEnvEnv.make_tasks(3, 7, "eval", low=20, high=22)
    assert json.loads(json.dumps(tasks)) == tasks and [t["id"] for t in tasks] == ["eval-0", "eval-1", "eval-2"]
    assert OpenEnvEnv.make_tasks(3, 7, "train") != OpenEnvEnv.make_tasks(3, 7, "eval")  # independent streams

    async def main():
        env = OpenEnvEnv(url=url)
        messages = await env.reset({**tasks[0], "answer": "not a reset argument"})  # the server drops it
        results, found = await bisect(env, 20, 22)
        await env.close()
        return messages, results, found

    messages, results, found = run(main())
    assert messages[-1]["content"] == "Guess my number from 20 to 22." and 20 <= found <= 22
    assert results[-1].reward == 1.0


def test_the_app_is_started_once_shared_and_restarted_after_it_is_killed_mid_episode():
    """`app:` with a typed action (guess: int): the model writes JSON; the adapter runs the server itself."""
    task = {"id": "t-0", "seed": 3, "low": 1, "high": 15}

    async def main():
        env, other = OpenEnvEnv(app=TYPED_APP), OpenEnvEnv(app=TYPED_APP)
        first = await env.reset(task)
        await other.reset(task)
        server = openenv_server.running(TYPED_APP)
        no_json = await env.step(Action("seven"))
        bad_type = await env.step(Action('{"guess": "seven"}'))
        fenced = await env.step(Action('Sure:\n```json\n{"guess": 8}\n```'))
        await other.close()
        os.kill(server.proc.pid, signal.SIGKILL)  # the server dies mid-episode
        server.proc.wait()
        with pytest.raises(OpenEnvError) as died:
            await env.step(Action('{"guess": 4}'))
        await env.close()
        fresh = OpenEnvEnv(app=TYPED_APP)  # the next episode starts it again
        await fresh.reset(task)
        restarted = openenv_server.running(TYPED_APP)
        result = await fresh.step(Action('{"guess": 8}'))
        await fresh.close()
        return first, server, no_json, bad_type, fenced, str(died.value), restarted, result

    first, server, no_json, bad_type, fenced, died, restarted, result = run(main())
    assert first == [{"role": "system", "content": 'Reply with only a JSON object: {"guess": <integer>}'},
                     {"role": "user", "content": "Guess my number from 1 to 15."}]
    assert server.url.startswith("http://127.0.0.1:")
    # The model's mistakes are feedback, not failures.
    assert no_json.observation == 'Invalid action: reply with only a JSON object: {"guess": <integer>}'
    assert bad_type.observation.startswith("Invalid action: guess: Input should be a valid integer")
    assert not no_json.done and not bad_type.done and no_json.info == {"invalid_action": True}
    assert fenced.observation in ("Higher.", "Lower.", None)
    assert f"OpenEnv server at {server.url} (app {TYPED_APP}, its process exited with code -9) " \
           "closed the connection during step (did the server die?)" in died
    assert restarted is not server and restarted.alive()
    assert result.observation == fenced.observation  # same seed, same number, on the new server


def test_an_error_in_the_environments_code_and_a_stalled_server_raise(url):
    async def main():
        env = OpenEnvEnv(url=url)
        await env.reset({"id": "t", "seed": 1})
        with pytest.raises(OpenEnvError) as crashed:
            await env.step(Action("!crash"))
        await env.close()
        slow = OpenEnvEnv(url=url, timeout_s=0.3)
        await slow.reset({"id": "t", "seed": 1})
        with pytest.raises(OpenEnvError) as stalled:
            await slow.step(Action("!sleep 1"))
        await slow.close()
        return str(crashed.value), str(stalled.value)

    crashed, stalled = run(main())
    assert crashed == (f"OpenEnv server at {url} failed during step: the game crashed on purpose (!crash) "
                       "(code EXECUTION_ERROR)")
    assert stalled == f"OpenEnv server at {url}: no reply to step within 0.3 s (env.kwargs.timeout_s)"


def test_a_bad_url_a_5xx_and_a_bad_config_say_what_is_wrong():
    port = openenv_server.free_port()  # nobody listens there
    with pytest.raises(OpenEnvError, match=rf"cannot reach OpenEnv server at http://127.0.0.1:{port} during GET "
                                           r"/schema \(is it running\? env.kwargs.url\): ConnectError"):
        run(OpenEnvEnv(url=f"http://127.0.0.1:{port}").reset({"id": "t"}))
    with pytest.raises(OpenEnvError, match=rf"cannot reach OpenEnv server at http://127.0.0.1:{port} during "
                                           r"reset .*ConnectionError: Failed to connect to ws://127.0.0.1"):
        run(OpenEnvEnv(url=f"http://127.0.0.1:{port}", action_field="message").reset({"id": "t"}))

    class Broken(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802
            self.send_response(503)
            self.end_headers()
            self.wfile.write(b"overloaded")

        def log_message(self, *args):
            pass

    http = HTTPServer(("127.0.0.1", 0), Broken)
    threading.Thread(target=http.serve_forever, daemon=True).start()
    try:
        with pytest.raises(OpenEnvError, match=r"answered GET /schema with HTTP 503: overloaded"):
            run(OpenEnvEnv(url=f"http://127.0.0.1:{http.server_port}").reset({"id": "t"}))
    finally:
        http.shutdown()
    with pytest.raises(ValueError, match="exactly one of env.kwargs.url"):
        OpenEnvEnv()
    with pytest.raises(ValueError, match="must look like 'package.module:app'"):
        openenv_server.launch("no_colon")
    with pytest.raises(openenv_server.ServerStartError, match="(?s)exited while starting.*Could not import module"):
        openenv_server.launch("no_such_module_xyz:app")


def test_a_rollout_records_a_failing_server_as_env_error_and_a_found_number_as_reward(url, tiny_tokenizer):
    """The real episode loop (agentrl.rollout.episode) with a scripted model instead of vLLM."""
    spec = EpisodeSpec(OpenEnvEnv, {"url": url}, ChatFormat(tiny_tokenizer), RolloutConfig(max_turns=4), 512)
    task = {"id": "t-5", "seed": 0, "low": 5, "high": 5}

    async def main():
        ok = await run_episode(task, ScriptedEngine(tiny_tokenizer, ["3", "5"]), spec)
        failed = await run_episode(task, ScriptedEngine(tiny_tokenizer, ["!crash"]), spec)
        return ok, failed

    ok, failed = run(main())
    assert (ok.status, ok.reward, len(ok.turns)) == ("ok", 1.0, 2)
    assert [m["content"] for m in ok.messages] == ["Guess my number from 5 to 5.", "3", "Higher.", "5"]
    assert failed.status == "env_error" and failed.reward == 0.0
    assert "OpenEnvError" in failed.error and "code EXECUTION_ERROR" in failed.error


def test_render_and_json_extraction():
    assert render({"prompt": "", "text": "hi"}) == "hi"
    assert render({"board": [1, 2], "score": 3}) == '{"board": [1, 2], "score": 3}'
    assert render({"board": "x", "prompt": "p"}, "board") == "x"
    assert extract_json_object('{"a": 1}') == {"a": 1}
    assert extract_json_object('ok ```json\n{"a": {"b": 2}}\n``` done') == {"a": {"b": 2}}
    assert extract_json_object("[1, 2]") is None and extract_json_object("no") is None


def test_the_example_config_loads_and_names_the_fixture_app():
    cfg = load_config(ROOT / "examples" / "agents" / "openenv.yaml")
    assert cfg.env.import_path == "envs.openenv_env:OpenEnvEnv" and cfg.env.kwargs["app"] == TEXT_APP
    OpenEnvEnv(**cfg.env.kwargs)  # the kwargs are the adapter's


def test_a_run_starts_the_app_when_it_starts_and_the_first_episode_uses_it(tmp_path):
    """`prepare` (what train, eval and check run before they start the engines) calls
    `OpenEnvEnv.prestart`: the example's app comes up with no episode asking for it, and the first reset
    talks to that same server. (Started by the first reset instead, the app's start-up counted against
    the first episodes' 30 s turn deadline: on a busy machine all of them timed out.)"""
    before = openenv_server.running(TEXT_APP)  # an earlier test's, if any: it must be a new one
    if before is not None:
        before.stop()
    cfg = load_config(ROOT / "examples" / "agents" / "openenv.yaml", [f"train.out_dir={tmp_path}"])
    prepare(cfg)
    deadline = time.monotonic() + 120
    while (server := openenv_server.running(TEXT_APP)) in (None, before):
        assert time.monotonic() < deadline, "prepare did not start the app's server"
        time.sleep(0.1)
    assert server.alive()

    async def first_reset():
        env = OpenEnvEnv(**cfg.env.kwargs)
        await env.reset(OpenEnvEnv.make_tasks(1, 0, "eval")[0])
        await env.close()
        return env.base_url

    assert run(first_reset()) == server.url


# ---- the app answers this run only, and ends with it -------------------------------------------------------


def test_the_launched_app_refuses_requests_without_its_token_and_from_web_pages(url):
    """The app's server answers the run's own client (the tests above) and nobody else: no token, a foreign Host
    or Origin, a text/plain POST, a WebSocket a web page opens. The token is in no argv and no log line."""
    import httpx
    from websockets.asyncio.client import connect
    from websockets.exceptions import InvalidStatus

    auth = openenv_server.token_for(url)
    assert auth and auth["Authorization"].startswith("Bearer ") and len(auth["Authorization"]) > 40
    reset = {"seed": 1}
    replies = {
        "no token": httpx.post(f"{url}/reset", json=reset),
        "wrong token": httpx.post(f"{url}/reset", json=reset, headers={"Authorization": "Bearer nope"}),
        "text/plain": httpx.post(f"{url}/reset", content=b'{"seed": 1}', headers={"Content-Type": "text/plain", **auth}),
        "foreign Host": httpx.post(f"{url}/reset", json=reset, headers={"Host": "evil.example", **auth}),
        "foreign Origin": httpx.post(f"{url}/reset", json=reset, headers={"Origin": "http://evil.example", **auth}),
        "health, no token": httpx.get(f"{url}/health"),
        "the run's client": httpx.post(f"{url}/reset", json=reset, headers=auth),
    }

    async def handshake(headers, origin=None):
        try:
            async with connect(url.replace("http", "ws") + "/ws", additional_headers=headers, origin=origin,
                               proxy=None):
                return 101
        except InvalidStatus as exc:
            return exc.response.status_code

    ws = {"ws no token": run(handshake({})),
          "ws foreign Origin": run(handshake(auth, origin="http://evil.example")),
          "ws the run's client": run(handshake(auth))}
    statuses = {k: r.status_code for k, r in replies.items()} | ws
    assert statuses == {"no token": 401, "wrong token": 401, "text/plain": 415, "foreign Host": 403,
                        "foreign Origin": 403, "health, no token": 401, "the run's client": 200,
                        "ws no token": 401, "ws foreign Origin": 403, "ws the run's client": 101}, statuses
    for reply in replies.values():
        assert not [h for h in reply.headers if h.lower().startswith("access-control-allow")]
    token = auth["Authorization"].split()[1]
    for pid in [p for p in os.listdir("/proc") if p.isdigit()]:  # nobody's argv holds it
        try:
            assert token.encode() not in Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            pass
    assert token not in LAUNCHED[url].log_tail() and token not in repr(LAUNCHED[url])


PARENT = """
import sys, time
from envs import openenv_server
server = openenv_server.start_or_reuse(sys.argv[1], 60.0).result()  # launched by a starter thread, as in a run
time.sleep(1.0)  # that thread has ended: the server must not end with it
print(server.proc.pid, server.url, flush=True)
time.sleep(600)
"""


def test_the_app_ends_when_the_process_that_started_it_is_killed():
    """A kill -9 of the trainer runs no atexit: the app's server notices its parent is gone and stops. It
    outlives the thread that started it (a run starts it from one), which PR_SET_PDEATHSIG would not."""
    import httpx

    parent = subprocess.Popen([sys.executable, "-c", PARENT, TEXT_APP], cwd=ROOT, stdout=subprocess.PIPE, text=True,
                              env={**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(ROOT / "tests")])})
    try:
        pid, url = parent.stdout.readline().split()
        pid = int(pid)
        assert httpx.get(f"{url}/health").status_code == 401  # up, and wanting its token
        os.kill(parent.pid, signal.SIGKILL)
        parent.wait()
        killed = time.monotonic()
        deadline = time.monotonic() + 30
        while _running(pid):
            assert time.monotonic() < deadline, f"the app's server {pid} outlived its parent by 30 s"
            time.sleep(0.1)
        print(f"the app's server ended {time.monotonic() - killed:.2f} s after its parent's kill -9")
        with pytest.raises(httpx.ConnectError):
            httpx.get(f"{url}/health")
    finally:
        if parent.poll() is None:
            parent.kill()


def _running(pid: int) -> bool:
    """`pid` exists and is no zombie (a reaper may be slow to collect an orphan's exit)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False
