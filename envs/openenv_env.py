"""Train on an OpenEnv environment server (openenv-core: typed reset/step over HTTP + WebSocket).

    env:
      import_path: envs.openenv_env:OpenEnvEnv
      kwargs: {url: "http://127.0.0.1:8000"}             # a running OpenEnv server; or instead
      # kwargs: {app: "tests.fixtures.openenv_guess:app"}  # an installed server app, started here

With `app:` the adapter runs the app under uvicorn on loopback and a free port, once per process, from the
run's start (`prestart`), shared by every episode and stopped at exit or when this process dies
(`envs.openenv_server`): it answers only requests carrying the bearer token drawn for it, which every
request of this adapter (GET /schema, the WebSocket) sends.
Each episode is one OpenEnv WebSocket session (the server gives each its own environment instance),
opened by `reset` and closed by `close`: the server must allow `rollout.max_concurrency` sessions
(`create_app(..., max_concurrent_envs=)`).

Tasks: `reset(task)` sends the task's keys but "id" (or only `reset_keys`) as OpenEnv reset arguments, so
`{"id": "train-3", "seed": 17}` becomes `reset(seed=17)`; the server passes on only the arguments its
environment's `reset` accepts. `make_tasks` draws `{"id", "seed"}` tasks (plus `data.task_kwargs`).

Observations become one user message: the field `observation_field` if set, else the first non-empty
string among the fields prompt / text / message / content, else the whole observation as JSON.

Actions, from the action schema the server publishes at GET /schema (read once per URL):
  * text: an action whose only field (besides OpenEnv's `metadata`) is a string, e.g. `message: str`,
    gets the model's reply verbatim in it (`action_field: name` picks the field and skips the schema;
    `action_format: text` picks the one string field of a larger action, the others keep their defaults);
  * json: any other action class (or `action_format: json`): the reply must hold a JSON object of its
    fields (`{"guess": 7}`; code fences and text around it are fine); a system message says so unless
    `system_prompt` is set or `describe_action` is off.
A reply that is not such an object, or that the server rejects as invalid (VALIDATION_ERROR), is the
model's mistake: it gets the reason as the next observation, reward 0, and the episode goes on.

The server's reward (None = 0) is the step reward and its `done` ends the episode. A server failure is
not the model's: connection refused, the server gone mid-episode, a 5xx, an error in the environment's
own code, or no reply within `timeout_s` raises `OpenEnvError`, so the episode ends with status
env_error, counted and never scored 0.
"""

from __future__ import annotations

import json
import math
import random
from typing import Any, Literal

import httpx

from agentrl.env import Action, Env, Message, StepResult
from agentrl.utils.hosts import is_loopback
from agentrl.utils.extras import needs
from envs.openenv_server import Restarts, ServerStartError, ensure_server, running, start_or_reuse, token_for

with needs("envs.openenv_env", "openenv-core", "envs", "openenv", "websockets"):
    from openenv.core.client_types import StepResult as OpenEnvResult
    from openenv.core.generic_client import GenericEnvClient
    from websockets.asyncio.client import connect as ws_connect
    from websockets.exceptions import ConnectionClosed

TEXT_FIELDS = ("prompt", "text", "message", "content")
_SCHEMAS: dict[str, dict[str, Any]] = {}  # action schema per server URL: one GET /schema per process


class OpenEnvError(RuntimeError):
    """The OpenEnv server failed (not the model): the episode ends with env_error."""


class _ServerReply(Exception):
    """An error message the server sent on the WebSocket, with its OpenEnv code."""

    def __init__(self, data: Any) -> None:
        data = data if isinstance(data, dict) else {}
        self.code = str(data.get("code", "UNKNOWN"))[:100]
        self.message = str(data.get("message", "unknown error"))[:1000]
        self.data = data
        super().__init__(f"{self.message} (code {self.code})")


class _OutOfProtocol(ValueError):
    """A server reply that is no OpenEnv message: the server's failure, not the model's."""


class _Client(GenericEnvClient):
    """openenv's dict client, raising errors that keep the server's code (it folds them into RuntimeError)
    and checking every reply's shape, so a reply out of protocol is an OpenEnvError that says so; its
    WebSocket handshake carries `headers` (the bearer token of a server this process started)."""

    def __init__(self, *, headers: dict[str, str], **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.headers = headers

    async def connect(self) -> "_Client":
        if self._ws is None:
            try:  # as openenv's connect, plus the headers; loopback never goes through a proxy
                self._ws = await ws_connect(self._ws_url, open_timeout=self._connect_timeout,
                                            max_size=self._max_message_size, additional_headers=self.headers,
                                            proxy=None if _loopback(self._ws_url) else True)
            except Exception as exc:
                raise ConnectionError(f"Failed to connect to {self._ws_url}: {exc}") from exc
        return self

    async def _send_and_receive(self, message: dict[str, Any]) -> dict[str, Any]:
        await self._send(message)
        response = await self._receive()
        if not isinstance(response, dict):
            raise _OutOfProtocol(f"a reply that is not a JSON object: {str(response)[:200]}")
        if response.get("type") == "error":
            raise _ServerReply(response.get("data"))
        return response

    def _parse_result(self, payload: Any) -> OpenEnvResult[dict[str, Any]]:
        if not isinstance(payload, dict):
            raise _OutOfProtocol(f"'data' is {type(payload).__name__}, not an object")
        reward, done = payload.get("reward"), payload.get("done", False)
        if reward is not None and (isinstance(reward, bool) or not isinstance(reward, (int, float))
                                   or not math.isfinite(reward)):
            raise _OutOfProtocol(f"'reward' must be a finite number or null, got {str(reward)[:80]}")
        if not isinstance(done, bool):
            raise _OutOfProtocol(f"'done' must be true or false, got {str(done)[:80]}")
        return OpenEnvResult(observation=payload.get("observation", {}), reward=reward, done=done)


class OpenEnvEnv(Env):
    def __init__(self, url: str | None = None, app: str | None = None,
                 action_format: Literal["auto", "text", "json"] = "auto", action_field: str | None = None,
                 observation_field: str | None = None, system_prompt: str | None = None,
                 describe_action: bool = True, reset_keys: list[str] | None = None, timeout_s: float = 20.0,
                 connect_timeout_s: float = 10.0, start_timeout_s: float = 60.0,
                 success_reward: float | None = None, max_restarts: int = 3, restart_window_s: float = 600.0,
                 restart_backoff_s: float = 1.0) -> None:
        """`timeout_s` bounds each reply (keep it under rollout.turn_timeout_s, so a stalled server is an
        env_error that says so); `start_timeout_s` bounds starting `app`. `success_reward`: when set, an
        episode whose summed reward reaches it counts as a success (info["success"]). A dead `app` is
        started again at most `max_restarts` times within `restart_window_s`, with exponential backoff
        from `restart_backoff_s`; past that every episode ends with env_error saying so."""
        if (url is None) == (app is None):
            raise ValueError("OpenEnvEnv needs exactly one of env.kwargs.url (a running OpenEnv server) and "
                             "env.kwargs.app ('package.module:app', started by the adapter)")
        if action_format not in ("auto", "text", "json"):
            raise ValueError(f"action_format must be auto, text or json, not {action_format!r}")
        self.url = url.rstrip("/") if url else None
        self.app = app
        self.action_format, self.action_field = action_format, action_field
        self.observation_field, self.system_prompt = observation_field, system_prompt
        self.describe_action, self.reset_keys = describe_action, reset_keys
        self.timeout_s, self.connect_timeout_s, self.start_timeout_s = timeout_s, connect_timeout_s, start_timeout_s
        self.success_reward = success_reward
        self.restarts = Restarts(max_restarts, restart_window_s, restart_backoff_s)
        self.client: _Client | None = None
        self.total = 0.0

    @classmethod
    def prestart(cls, *, url: str | None = None, app: str | None = None, start_timeout_s: float = 60.0,
                 max_restarts: int = 3, restart_window_s: float = 600.0, restart_backoff_s: float = 1.0,
                 **_: Any) -> None:
        """The app's server starts when the run does, beside the engines: started by the first reset
        instead, its start-up (7 s on an idle 2-core machine, over 30 s on a busy one) counted against
        the first episodes' turn deadline, and they timed out."""
        if app and not url:
            start_or_reuse(app, start_timeout_s, Restarts(max_restarts, restart_window_s, restart_backoff_s))

    # ------------------------------------------------------------------ episode

    async def reset(self, task: dict[str, Any]) -> list[Message]:
        try:
            url = self.url or (await ensure_server(self.app, self.start_timeout_s, self.restarts)).url  # type: ignore
        except ServerStartError as exc:  # the app's failure, not the model's: env_error with its reason
            raise OpenEnvError(str(exc)) from exc
        self.base_url, self.total, self.headers = url, 0.0, token_for(url)
        self.mode, self.field, self.fields = await self._action_spec(url)
        keys = self.reset_keys if self.reset_keys is not None else [k for k in task if k != "id"]
        kwargs = {k: task[k] for k in keys if k in task}
        self.client = _Client(base_url=url, connect_timeout_s=self.connect_timeout_s,
                              message_timeout_s=self.timeout_s, headers=self.headers)
        try:
            result = await self.client.reset(**kwargs)
        except Exception as exc:
            raise self._failure("reset", exc) from exc
        messages: list[Message] = []
        system = self.system_prompt
        if system is None and self.mode == "json" and self.describe_action:
            system = "Reply with only a JSON object: " + _shape(self.fields)
        if system:
            messages.append({"role": "system", "content": system})
        messages.append({"role": "user", "content": render(result.observation, self.observation_field)})
        return messages

    async def step(self, action: Action) -> StepResult:
        payload = self._payload(action.text)
        if isinstance(payload, str):  # the model's mistake: say why, let it try again
            return StepResult(payload, 0.0, False, self._info(False, invalid_action=True))
        assert self.client is not None, "step() before reset()"
        try:
            result = await self.client.step(payload)
        except _ServerReply as reply:
            if reply.code != "VALIDATION_ERROR":
                raise self._failure("step", reply) from reply
            return StepResult(f"Invalid action: {_validation_text(reply)}", 0.0, False,
                              self._info(False, invalid_action=True))
        except Exception as exc:
            raise self._failure("step", exc) from exc
        reward = float(result.reward or 0.0)
        self.total += reward
        if result.done:
            return StepResult(None, reward, True, self._info(True))
        return StepResult(render(result.observation, self.observation_field), reward, False, self._info(False))

    async def close(self) -> None:
        if self.client is not None:
            await self.client.close()  # best effort: a dead server's socket closes quietly
            self.client = None

    def _info(self, done: bool, **extra: Any) -> dict[str, Any]:
        info: dict[str, Any] = dict(extra)
        if self.success_reward is not None:
            info["success"] = done and self.total >= self.success_reward
        return info

    # ------------------------------------------------------------------ actions

    def _payload(self, text: str) -> dict[str, Any] | str:
        """The action for the server, or the message telling the model why its reply is not one."""
        if self.mode == "text":
            return {self.field: text}
        obj = extract_json_object(text)
        if obj is None:
            return f"Invalid action: reply with only a JSON object: {_shape(self.fields)}"
        return obj

    async def _action_spec(self, url: str) -> tuple[str, str, dict[str, Any]]:
        """(mode, text field, field schemas) of the server's action class."""
        if self.action_format in ("auto", "text") and self.action_field:
            return "text", self.action_field, {}
        fields = {k: v for k, v in (await self._schema(url))["properties"].items() if k != "metadata"}
        strings = [k for k, v in fields.items() if v.get("type") == "string"]
        if self.action_format == "text" or (self.action_format == "auto" and len(fields) == 1 and strings):
            if len(strings) != 1:
                raise ValueError(f"action_format text needs one string field to fill; the action at {url} has "
                                 f"{sorted(fields)}: set env.kwargs.action_field")
            return "text", strings[0], fields
        return "json", "", fields

    async def _schema(self, url: str) -> dict[str, Any]:
        if url not in _SCHEMAS:
            try:
                async with httpx.AsyncClient(timeout=self.timeout_s, trust_env=not _loopback(url)) as http:
                    reply = await http.get(f"{url}/schema", headers=self.headers)
            except httpx.HTTPError as exc:
                raise self._failure("GET /schema", exc) from exc
            if reply.status_code >= 500:
                raise OpenEnvError(f"OpenEnv server at {url} answered GET /schema with HTTP {reply.status_code}: "
                                   f"{reply.text[:300]}")
            if reply.status_code != 200:
                raise OpenEnvError(f"GET {url}/schema: HTTP {reply.status_code}; is this an OpenEnv server? "
                                   "(set env.kwargs.action_field to skip the schema)")
            _SCHEMAS[url] = _action_schema(url, reply.content)
        return _SCHEMAS[url]

    # ------------------------------------------------------------------ failures

    def _failure(self, what: str, exc: BaseException) -> OpenEnvError:
        """A clear OpenEnvError for a server failure during `what`."""
        where = f"OpenEnv server at {getattr(self, 'base_url', self.url)}"
        if self.app:
            where += f" (app {self.app}{_exit_note(self.app)})"
        if isinstance(exc, _ServerReply):
            hint = ""
            if exc.code == "CAPACITY_REACHED":
                hint = ("; the server allows fewer sessions than agentrl runs episodes at once: raise "
                        "max_concurrent_envs in its create_app(...) or lower rollout.max_concurrency")
            return OpenEnvError(f"{where} failed during {what}: {exc.message} (code {exc.code}){hint}")
        if isinstance(exc, (_OutOfProtocol, json.JSONDecodeError)):
            return OpenEnvError(f"{where} answered {what} out of the OpenEnv protocol: {str(exc)[:300]}")
        if isinstance(exc, TimeoutError):
            return OpenEnvError(f"{where}: no reply to {what} within {self.timeout_s} s (env.kwargs.timeout_s)")
        if isinstance(exc, ConnectionClosed):
            return OpenEnvError(f"{where} closed the connection during {what} (did the server die?): {exc}")
        if isinstance(exc, (ConnectionError, OSError, httpx.HTTPError)):
            return OpenEnvError(f"cannot reach {where} during {what} (is it running? env.kwargs.url): "
                                f"{type(exc).__name__}: {exc}")
        return OpenEnvError(f"{where} failed during {what}: {type(exc).__name__}: {exc}")

    # ------------------------------------------------------------------ tasks

    @classmethod
    def make_tasks(cls, n: int, seed: int, split: str, **reset_kwargs: Any) -> list[dict[str, Any]]:
        """`n` tasks {"id", "seed", **reset_kwargs}: plain JSON (checkpoints hold them); each split draws
        its seeds from its own stream, so eval tasks are never the train stream."""
        rng = random.Random(f"openenv:{split}:{seed}")
        return [{"id": f"{split}-{i}", "seed": rng.randrange(2**31), **reset_kwargs} for i in range(n)]


def render(observation: Any, field: str | None = None) -> str:
    """The text to show the model for an OpenEnv observation (a dict of its fields)."""
    if not isinstance(observation, dict):
        return str(observation)
    if field is not None:
        if field not in observation:
            raise ValueError(f"observation_field {field!r} is not in the observation; "
                             f"its fields: {sorted(observation)}")
        return str(observation[field])
    for name in TEXT_FIELDS:
        value = observation.get(name)
        if isinstance(value, str) and value:
            return value
    return json.dumps(observation, sort_keys=True, default=str)


def extract_json_object(text: str) -> dict[str, Any] | None:
    """The JSON object in a reply: the whole reply, or its outermost {...} (so code fences and a
    sentence around it are fine); None if there is none."""
    for candidate in (text.strip(), text[text.find("{"): text.rfind("}") + 1]):
        try:
            obj = json.loads(candidate)
        except ValueError:
            continue
        if isinstance(obj, dict):
            return obj
    return None


def _shape(fields: dict[str, Any]) -> str:
    """`{"guess": <integer>, ...}` from field schemas, for the system message and error feedback."""
    return "{" + ", ".join(f'"{k}": <{v.get("type", "value")}>' for k, v in fields.items()) + "}"


def _action_schema(url: str, body: bytes) -> dict[str, Any]:
    """The action's JSON schema from a GET /schema body, with `properties` a dict of dicts;
    OpenEnvError when the body is not one."""
    try:
        schema = json.loads(body)
    except ValueError:
        schema = None
    action = schema.get("action", {}) if isinstance(schema, dict) else None
    props = action.get("properties", {}) if isinstance(action, dict) else None
    if not (isinstance(props, dict) and all(isinstance(v, dict) for v in props.values())):
        raise OpenEnvError(f"GET {url}/schema answered {body[:200]!r}, not an OpenEnv schema "
                           "({'action': {'properties': {name: {...}}}}); set env.kwargs.action_field to skip it")
    return {**action, "properties": props}


def _validation_text(reply: _ServerReply) -> str:
    errors = reply.data.get("errors")
    errors = errors if isinstance(errors, list) else []
    parts = [f"{_loc(e.get('loc'))}: {e.get('msg')}" for e in errors if isinstance(e, dict)]
    return "; ".join(parts)[:2000] or reply.message


def _loc(loc: Any) -> str:
    return ".".join(str(x) for x in loc) if isinstance(loc, (list, tuple)) else str(loc or "")


def _loopback(url: str) -> bool:
    return is_loopback(httpx.URL(url).host)


def _exit_note(app: str) -> str:
    server = running(app)
    if server is not None and not server.alive():
        return f", its process exited with code {server.proc.returncode}"
    return ""
