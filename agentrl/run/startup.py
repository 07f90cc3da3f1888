"""Start-up shared by the CLIs (`agentrl.train`, `agentrl.eval`, `agentrl.replay`): the checks of
everything a user's input can get wrong (config keys, data rows, the env's import path, the model
folder, reward rules), made before vLLM or DeepSpeed start, and the building and stopping of the
engines and learner ranks for the configured backend.
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys
from dataclasses import dataclass
from pathlib import Path

from agentrl.config import Config, ConfigError
from agentrl.data import Task
from agentrl.env import Env
from agentrl.run.checkpoint.placement import RunPlace, place_run

log = logging.getLogger(__name__)


def input_error(exc: ConfigError) -> int:
    """What every CLI does with a user's input error: one line on stderr ("data error: ..." for task
    and text files, "config error: ..." otherwise), and exit code 2."""
    from agentrl.data import DataError

    print(f"{'data error' if isinstance(exc, DataError) else 'config error'}: {exc}", file=sys.stderr)
    return 2


def build_learner(cfg: Config, model_path: str, tokenizer, teacher_path: str | None = None):
    """The RL learner of `cfg` (its `LearnerSpec`), with the LM loss's text batches when it has one;
    `teacher_path`: algo.teacher.model resolved (`agentrl.models.teacher.resolve_teacher`)."""
    from agentrl.data import lm_batches
    from agentrl.learner.rl import Learner
    from agentrl.learner.spec import LearnerSpec

    unsup = None
    if cfg.learner.unsup_coef > 0:
        unsup = lm_batches(cfg.learner.unsup_data, tokenizer, cfg.learner.unsup_batch_size,
                           cfg.engine.max_model_len, cfg.train.seed)
    return Learner(LearnerSpec.from_config(cfg, model_path, teacher_path), unsup)


# Hugging Face's offline switches: the hub client (and vLLM through it), transformers' older one, datasets.
OFFLINE_VARS = ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_DATASETS_OFFLINE")


def stay_offline(allow_download: bool) -> None:
    """Unless the config allows downloads, every Hugging Face load of this run reads the local cache only:
    the offline switches in this process's environment (inherited by vLLM's engine core, its workers and
    a Ray that agentrl starts) and in the hub client if it is already imported (it reads them at import)."""
    if allow_download:
        return
    for var in OFFLINE_VARS:
        os.environ[var] = "1"
    constants = sys.modules.get("huggingface_hub.constants")
    if constants is not None:
        constants.HF_HUB_OFFLINE = True


def check_model(model) -> None:
    """`model` (the `model` section of either config tree): offline unless allowed, its path usable."""
    stay_offline(model.allow_download)
    if model.path:
        check_model_path(model.path, model.allow_download)
    elif getattr(model, "default", None) is not None:  # the RL tree: the warm start's teacher, tried first
        check_teacher(model.default)


def check_teacher(default) -> None:
    """The embedded default's teacher run on a few demo tasks, before any build: its failure (file:line,
    the task) is a config error like an Env's."""
    from agentrl.models.demos import TeacherError, optimal_prob, try_teacher

    try:
        try_teacher(default.task, default.seed, optimal_prob(default.task, default.demo_optimal_prob),
                    default.demo_max_turns)
    except TeacherError as exc:
        raise ConfigError(str(exc)) from None


def check_model_path(path: str, allow_download: bool = False, key: str = "model.path") -> None:
    """A named model (agentrl.models.named), a local Hugging Face folder, or a hub id whose every file the
    loaders read is in the local cache: nothing is downloaded at run time unless `allow_download`. `key`:
    the config key that named it, for the message (the policy's model.path, the teacher's algo.teacher.model)."""
    from agentrl.models.named import ModelNotAvailable, check_available, is_hub_id, is_named

    if is_named(path):
        try:
            return check_available(path)
        except ModelNotAvailable as exc:
            raise ConfigError(f"{key}: {exc}") from None
    folder = Path(path).expanduser()
    if folder.is_dir():
        if not (folder / "config.json").is_file():
            raise ConfigError(f"{key}={path!r}: the folder has no config.json (not a Hugging Face model folder)")
        return
    if folder.exists():
        raise ConfigError(f"{key}={path!r} is a file; pass a Hugging Face model folder")
    if is_hub_id(path):
        return None if allow_download else _check_hub_cache(path, key)
    raise ConfigError(f"{key}={path!r}: no such folder")


def check_teacher_model(cfg: Config) -> None:
    """algo.teacher.model (the distillation teacher) checked as model.path is, before any engine starts (its
    tokenizer is compared with the student's later, once that is loaded: agentrl.models.teacher.resolve_teacher)."""
    if cfg.algo.teacher is not None:
        check_model_path(cfg.algo.teacher.model, cfg.model.allow_download, "algo.teacher.model")


def _check_hub_cache(repo_id: str, key: str = "model.path") -> None:
    from huggingface_hub import constants

    from agentrl.models.named import missing_hub_files

    missing, snapshot = missing_hub_files(repo_id)
    if not missing:
        return
    where = snapshot or Path(constants.HF_HUB_CACHE)
    lead = ("no such folder, and no model of that id in the local Hugging Face cache" if snapshot is None else
            f"{' and '.join(missing)} {'is' if len(missing) == 1 else 'are'} not in the local Hugging Face cache")
    raise ConfigError(f"{key}={repo_id!r}: {lead} ({where}); nothing is downloaded unless "
                      f"model.allow_download=true. Fetch it where the hub is reachable with `hf download "
                      f"{repo_id}` into this cache (HF_HOME / HF_HUB_CACHE), pass a local folder, or set "
                      f"model.allow_download=true")


def resolve_model(cfg: Config) -> str:
    from agentrl.models.named import resolve_path

    return resolve_path(cfg.model.path, cfg.model.default)


async def load_model_format(cfg: Config, tokenizer_only: bool = False):
    """(model folder, tokenizer, ChatFormat) of the configured model; a named model is prepared on first
    use. ConfigError when its chat template would not keep the token ledger exact. `tokenizer_only`: of
    the embedded default, a folder with its tokenizer alone when the model is not built yet (seconds)."""
    from agentrl.data.chat import ChatFormat, load_tokenizer

    if tokenizer_only and not cfg.model.path:
        from agentrl.models.default import ensure_default_tokenizer

        model_path = str(await asyncio.to_thread(ensure_default_tokenizer, cfg.model.default))
    else:
        model_path = await asyncio.to_thread(resolve_model, cfg)
    tokenizer = load_tokenizer(model_path)
    try:
        return model_path, tokenizer, ChatFormat(tokenizer)
    except ValueError as exc:
        raise ConfigError(f"model.path: {exc}") from None


@dataclass
class Prepared:
    """What start-up reads from the user's files, checked before any engine starts."""

    env_cls: type[Env]
    train_tasks: list[Task]
    eval_tasks: list[Task]
    resume: Path | None = None  # the checkpoint folder a resumed run continues from
    place: RunPlace | None = None  # where a training run writes (agentrl.run.checkpoint.placement)


def prepare(cfg: Config) -> Prepared:
    """Raises ConfigError (DataError for task files) naming the key, file or line at fault."""
    from agentrl.env import load_env
    from agentrl.rollout.tools.client import register_tool_servers
    from rewards.sources import check_sources

    stay_offline(cfg.model.allow_download)  # before an env's make_tasks reads a dataset
    register_tool_servers(cfg.tools.servers)
    try:
        env_cls = load_env(cfg.env.import_path)
    except ValueError as exc:
        raise ConfigError(f"env.import_path: {exc}") from None
    train_tasks, eval_tasks = _load_tasks(cfg, env_cls)
    check_model(cfg.model)
    check_teacher_model(cfg)
    try:
        check_sources(cfg.rewards)
    except ValueError as exc:
        raise ConfigError(str(exc)) from None
    from agentrl.run.checkpoint import CheckpointError
    from agentrl.telemetry.trackers import check_available

    check_available(cfg.train.loggers)

    try:
        place = place_run(cfg.train.resume, cfg.train.out_dir)
    except CheckpointError as exc:
        raise ConfigError(str(exc)) from None
    try:  # last: nothing starts for a run whose input is wrong
        env_cls.prestart(**cfg.env.kwargs)
    except TypeError as exc:
        raise ConfigError(f"env.kwargs: {exc}") from None
    return Prepared(env_cls, train_tasks, eval_tasks, place.resume, place)


def _load_tasks(cfg: Config, env_cls: type[Env]) -> tuple[list[Task], list[Task]]:
    from agentrl.data import load_tasks

    try:
        return load_tasks(cfg.data, env_cls)
    except NotImplementedError as exc:  # Env.make_tasks of an env without a generator
        raise ConfigError(f"data.train_path: {exc}") from None
    except ConfigError:  # task files' DataError says its own key
        raise
    except ValueError as exc:  # make_tasks rejecting data.task_kwargs (e.g. envs.rgym's dataset name)
        raise ConfigError(f"data.task_kwargs: {exc}") from None


async def start_workers(cfg: Config, model_path: str, tokenizer, eos_id: int):
    """(fleet, learner, weight sync) for the configured backend."""
    from functools import partial

    from agentrl.weights.push import LocalHub, RayHub
    from agentrl.weights.sync import EngineWeightSync, push_dtype
    from agentrl.models.teacher import resolve_teacher
    from agentrl.rollout.fleet import EngineFleet

    cluster, dtype, ws = cfg.cluster, push_dtype(cfg.engine.dtype), cfg.weight_sync
    # Before any engine starts: a teacher whose tokenizer is not the student's is a start-up error.
    teacher_path = await asyncio.to_thread(resolve_teacher, cfg, model_path, tokenizer)
    build = partial(build_learner, teacher_path=teacher_path)
    if cluster.backend == "local":
        fleet = EngineFleet.local(model_path, cfg.engine, eos_id, cluster)
        # The learner loads in a thread while the engines start: vLLM's start mostly waits on its
        # engine-core process, which runs on the other core.
        building = asyncio.ensure_future(asyncio.to_thread(build, cfg, model_path, tokenizer))
        await asyncio.sleep(0)  # the thread is under way before vLLM's start blocks this loop
        try:
            await fleet.start()
        except BaseException:
            await asyncio.gather(building, return_exceptions=True)  # no learner thread outlives the start
            raise
        try:
            learner = await building
        except BaseException:
            await fleet.shutdown()  # the caller holds no fleet to stop yet
            raise
        snapshot = partial(learner.state_dict_cpu, clone=False)
        hub = LocalHub(snapshot, dtype, ws.deadline_s, ws.bucket_mb << 20)
        publish = await pick_transport(ws.transport, fleet, hub)
        sync = EngineWeightSync(snapshot, fleet, ws.deadline_s, dtype=dtype, folder=ws.handover_dir, publish=publish)
        return fleet, learner, sync
    from agentrl.run.cluster import connect
    from agentrl.learner.ray_ranks import RayLearner

    await asyncio.to_thread(connect, cluster)
    learner = RayLearner(partial(build, cfg, model_path, tokenizer), cluster, cfg.learner.num_threads)
    # Learner ranks first when engines must avoid their nodes; otherwise engines and ranks start together.
    if not cluster.colocate:
        await asyncio.to_thread(learner.start)
    fleet = EngineFleet.ray(model_path, cfg.engine, eos_id, cluster,
                            avoid_nodes=frozenset() if cluster.colocate else learner.node_ids())
    ranks_up = asyncio.to_thread(learner.start) if cluster.colocate else asyncio.sleep(0)
    await asyncio.gather(fleet.start(), ranks_up)
    hub = RayHub(learner, dtype, ws.deadline_s, ws.bucket_mb << 20)
    publish = await pick_transport(ws.transport, fleet, hub) or (lambda v: learner.publish(v, dtype))
    sync = EngineWeightSync(None, fleet, ws.deadline_s, publish=publish)
    return fleet, learner, sync


async def start_teacher(cfg: Config, model_path: str, tokenizer, eos_id: int):
    """algo.teacher with placement engine: a `TeacherScorer` on a vLLM engine of its own (engine section's
    settings, the teacher's folder; outside the fleet, so no weight push reaches it); else None."""
    teacher = cfg.algo.teacher
    if teacher is None or teacher.placement != "engine":
        return None
    from agentrl.models.teacher import resolve_teacher
    from agentrl.rollout.engine import Engine
    from agentrl.rollout.teacher import TeacherScorer

    path = await asyncio.to_thread(resolve_teacher, cfg, model_path, tokenizer)
    log.info("teacher %s on a vLLM engine of its own", path)
    return TeacherScorer(Engine.start(path, cfg.engine, eos_id))


async def stop_teacher(scorer) -> None:
    if scorer is not None:
        scorer.shutdown()


async def pick_transport(transport: str, fleet, hub):
    """The collective hub's `publish` once every engine has joined its group, else None (the file path).
    `auto` falls back to files when a group cannot be formed (say, a port the engines' nodes cannot
    reach); `collective` makes that a start-up error."""
    from agentrl.weights.load import join

    if transport == "file":
        return None
    try:
        await asyncio.gather(*(join(m, hub.call) for m in fleet.members))
    except Exception as exc:
        if transport == "collective":
            raise ConfigError(f"weight_sync.transport=collective: an engine could not join the weight group "
                              f"({type(exc).__name__}: {exc}); set weight_sync.transport=file") from exc
        log.warning("weight_sync.transport=auto: the collective weight group could not be formed (%s: %s); "
                    "pushing weights through files", type(exc).__name__, exc)
        hub.close()
        return None
    fleet.closers.append(hub.close)
    fleet.transport = "collective"
    log.info("weights reach the %d engine(s) through a torch.distributed group each (weight_sync.transport=%s)",
             len(fleet.members), transport)
    return hub.publish


async def stop_workers(cfg: Config, fleet, learner) -> None:
    if fleet is not None:
        await fleet.shutdown()
    if cfg.cluster.backend == "ray":
        from agentrl.run.cluster import disconnect

        if learner is not None:
            learner.shutdown()
        disconnect()


async def episode_spec(cfg: Config, env_cls: type[Env], fmt, engine):
    """The run's `EpisodeSpec`, built here once and not changed after; for an AgentEnv with the OpenAI
    endpoint its episodes' sessions live on (`spec.server`) started (`stop_agent_server` stops it).
    `engine` serves the endpoint's requests from outside a session."""
    import dataclasses

    from agentrl.rollout.episode_base import EpisodeSpec

    spec = EpisodeSpec(env_cls, cfg.env.kwargs, fmt, cfg.rollout, cfg.engine.max_model_len)
    if not spec.is_agent:
        return spec
    from agentrl.rollout.agent_episode import make_server

    server = make_server(spec, engine, cfg.server)  # reads the spec's format and limits only
    try:
        await server.start()
    except BaseException:
        await server.stop()  # what did start (its client, a bound socket) is released
        raise
    # An agent may return None only when reward sources other than the env's own score its episodes.
    return dataclasses.replace(spec, server=server,
                               scored_by_sources=any(source.type != "env" for source in cfg.rewards.sources))


async def stop_agent_server(spec) -> None:
    if spec is not None and spec.server is not None:
        await spec.server.stop()
