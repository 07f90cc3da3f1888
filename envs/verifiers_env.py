"""A verifiers environment (prime-rl's library, `verifiers==0.4`: `verifiers.v1`) as an AgentEnv.

    env:  {import_path: envs.verifiers_env:VerifiersEnv}
    data: {task_kwargs: {load: my_pkg.envs:load_environment, load_kwargs: {...}}}

`load` names the environment: `module:function` returning a `vf.Env` (called with `load_kwargs`,
plus `split` when the function takes one), or an installed taskset id (`vf.load_environment` on
`config`, an EnvConfig dict; with no `agent` given, the agent plays verifiers' plain chat harness
`null` in the local `subprocess` runtime: verifiers' own default is a remote Prime sandbox).

An episode is the environment's OWN rollout of one task: `env.run_episode(task, ctx)`, its harness
program talking to the episode's session of agentrl's endpoint through verifiers' interception
server, then the task's `@vf.reward`/`@vf.metric` functions (and judges) scoring the trace. The
episode's reward is the sum of its traces' weighted rewards; "success" is reward >= `success_at`;
the per-function scores and metrics go to `Episode.info["env"]` as `vf/<name>`.

verifiers records a failing reward function as an error on the trace and leaves its score None,
which sums as 0: here that ends the episode as env_error, with a message naming the function(s),
never a reward of 0. Any other failure verifiers recorded (the harness program, a tool server, the
model call) ends it the same way; an engine failure is still engine_error (the session saw it).

Tasks are JSON (checkpoints keep them): the taskset row's index and wire data (`TaskData` dumped as
JSON: prompt, answer and the task's own fields), and the `load` spec, so a task file alone names its
environment. `env.kwargs` may set the spec instead (it wins), and `model`, the name sent to the
endpoint.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import inspect
import json
import os
import random
from typing import Any

from agentrl.env import AgentEnv
from agentrl.utils.extras import needs
from envs.verifiers_python import use_this_interpreter

with needs("envs.verifiers_env", "verifiers", "envs", "verifiers", "renderers"):
    import verifiers.v1 as vf

API_KEY_VAR = "AGENTRL_VERIFIERS_API_KEY"  # verifiers' clients read the key from an env var
LOCAL_AGENT = {"harness": {"id": "null"}, "runtime": {"type": "subprocess"}}

_envs: dict[str, vf.Env] = {}  # one vf.Env per spec and split in this process (loading reads data)
_serving: dict[tuple[int, int], tuple[asyncio.Lock, list[Any]]] = {}  # (env, loop) -> (lock, [users, stack])


def _spec(load: str, load_kwargs: dict[str, Any] | None, config: dict[str, Any] | None) -> dict[str, Any]:
    spec: dict[str, Any] = {"load": load}
    if load_kwargs:
        spec["load_kwargs"] = load_kwargs
    if config:
        spec["config"] = config
    return spec


def load_vf_env(spec: dict[str, Any], split: str = "train") -> vf.Env:
    """The vf.Env `spec` names (cached per spec and split); ValueError naming what is wrong."""
    key = json.dumps([spec, split], sort_keys=True)
    if key in _envs:
        return _envs[key]
    load = spec.get("load")
    if not isinstance(load, str) or not load:
        raise ValueError("a verifiers env needs `load`: 'module:function' or an installed taskset id")
    if ":" in load:
        module_name, _, attr = load.partition(":")
        fn = getattr(importlib.import_module(module_name), attr, None)
        if not callable(fn):
            raise ValueError(f"{load!r}: {module_name} has no function {attr!r}")
        kwargs = dict(spec.get("load_kwargs") or {})
        if "split" in inspect.signature(fn).parameters:
            kwargs.setdefault("split", split)
        env = fn(**kwargs)
    else:
        config = dict(spec.get("config") or {})
        config["taskset"] = {**config.get("taskset", {}), "id": load}
        if "agent" in vf.env_config_type(load, config.get("id", "")).model_fields:  # a single-agent env
            config.setdefault("agent", LOCAL_AGENT)
        env = vf.load_environment(vf.resolve_env_config(config))
    if not isinstance(env, vf.Env):
        raise ValueError(f"{load!r} returned {type(env).__name__}, not a verifiers.v1.Env")
    _envs[key] = env
    return env


@contextlib.asynccontextmanager
async def serving(env: vf.Env):  # type: ignore[no-untyped-def]
    """`env.serving()` shared by the episodes in flight: it binds the env's interception server and
    tool servers to the env object, so concurrent episodes must hold one, closed by the last out."""
    key = (id(env), id(asyncio.get_running_loop()))  # a lock and a server belong to one event loop
    lock, state = _serving.setdefault(key, (asyncio.Lock(), [0, None]))
    async with lock:
        if state[0] == 0:
            stack = contextlib.AsyncExitStack()
            await stack.enter_async_context(env.serving())
            state[1] = stack
        state[0] += 1
    try:
        yield
    finally:
        async with lock:
            state[0] -= 1
            if state[0] == 0:
                _serving.pop(key, None)
                await state[1].aclose()


def _failure(episode: vf.Episode) -> str | None:
    """What verifiers recorded as wrong with the episode, or None if it is a scored success."""
    problems = [f"{e.type}: {e.message}" for e in episode.errors]
    for trace in episode.traces:
        problems += [f"{e.type}: {e.message}" for e in trace.errors if f"{e.type}: {e.message}" not in problems]
        unscored = [name for name, r in trace.rewards.items() if r is None]
        if unscored:  # verifiers leaves a raising reward at None, which would sum as 0
            problems.insert(0, f"reward function(s) {unscored} raised or never ran")
    if not episode.traces:
        problems.append("the episode ran no agent")
    if problems or not episode.ok:
        return "; ".join(problems) or "verifiers marked the episode failed"
    return None


class VerifiersEnv(AgentEnv):
    """One task of a verifiers environment, played by its own rollout against this episode's client."""

    def __init__(self, load: str | None = None, load_kwargs: dict[str, Any] | None = None,
                 config: dict[str, Any] | None = None, model: str = "agentrl", success_at: float = 1.0):
        self.spec = _spec(load, load_kwargs, config) if load else None
        self.model = model
        self.success_at = success_at

    @classmethod
    def make_tasks(cls, n: int, seed: int, split: str, load: str = "", load_kwargs: dict[str, Any] | None = None,
                   config: dict[str, Any] | None = None) -> list[dict[str, Any]]:
        """`n` rows of the env's taskset (`split` goes to a load function that takes one), shuffled
        by `seed`, cycling when `n` exceeds the taskset; each a JSON dict naming its env."""
        spec = _spec(load, load_kwargs, config)
        env = load_vf_env(spec, split)
        taskset = env.taskset if env.taskset.bounded else env.taskset.take(max(n, 1))
        rows = [t.data.model_dump(mode="json", exclude_none=True) for t in taskset]
        if not rows:
            raise ValueError(f"the verifiers env {load!r} has no tasks")
        order = list(range(len(rows)))
        random.Random(seed).shuffle(order)
        picked = [order[i % len(order)] for i in range(n)]
        return [{"id": f"{split}-{i}", "index": rows[k]["idx"], "prompt": rows[k].get("prompt"),
                 "data": rows[k], "env": spec} for i, k in enumerate(picked)]

    async def run(self, client: Any, task: dict[str, Any]) -> dict[str, Any]:
        use_this_interpreter()
        spec = self.spec or task.get("env")
        if not spec:
            raise ValueError("the task names no verifiers env and env.kwargs sets no `load`")
        env = load_vf_env(spec)  # the train split's env: a task carries its whole row, whatever its split
        task_cls = type(env.taskset).task_type()
        vf_task = task_cls(task_cls.data_type().model_validate(task["data"]), env.taskset.config.task)
        os.environ[API_KEY_VAR] = client.api_key or "EMPTY"  # the same for every session of a run
        ctx = vf.ModelContext(model=self.model,
                              client=vf.EvalClientConfig(base_url=str(client.base_url), api_key_var=API_KEY_VAR))
        async with serving(env):
            episode = await env.run_episode(vf_task, ctx)
        problem = _failure(episode)
        if problem is not None:
            raise RuntimeError(f"verifiers env {spec['load']!r}: {problem}")
        reward = sum(trace.reward for trace in episode.traces)
        info: dict[str, Any] = {"reward": reward, "success": reward >= self.success_at}
        for trace in episode.traces:
            info.update({f"vf/{k}": r.score for k, r in trace.rewards.items() if r is not None})
            info.update({f"vf/{k}": v for k, v in trace.metrics.items() if v is not None})
            if trace.stop_condition:
                info["vf/stop_condition"] = trace.stop_condition
        return info
