"""Connecting to Ray for `cluster.backend: ray`: start a local Ray, or join a running cluster.

Multi-node: `ray start --head` on one node and `ray start --address=HEAD:6379` on the others, then
`python -m agentrl.train ... cluster.backend=ray cluster.address=auto` on any of them. What the run
asks for is checked against what the cluster has before any actor starts: Ray would otherwise wait
forever for resources that never come.

A local Ray (no `cluster.address`) listens on loopback only, unless `cluster.bind_host` names another
address: its GCS, raylets, object manager, agents and workers serve gRPC on every interface by default.
Ray's token authentication (on by default for a cluster `ray.init` starts) is kept; a run says so
when the environment turned it off.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import math
import os
from pathlib import Path
from typing import Iterator

from agentrl.config import ClusterConfig

log = logging.getLogger(__name__)


class ClusterError(RuntimeError):
    """The cluster cannot be reached, or cannot hold what the run asks for."""


def keep_token_private(path: Path | None = None) -> None:
    """Ray writes the token a new local cluster makes to ~/.ray/auth_token with the process's umask
    (0644 on most machines): anyone on the machine could read it and run code in the run's Ray. So it
    is made here first, 0600, when Ray would make it (token authentication on, no token yet); one of
    this user's that others can read is narrowed to 0600. A symbolic link there is refused (ClusterError):
    the mode changed would be that of whatever file it points at."""
    if os.environ.get("RAY_AUTH_MODE", "token").lower() != "token" or os.environ.get("RAY_AUTH_TOKEN"):
        return
    path = path or Path.home() / ".ray" / "auth_token"
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except FileNotFoundError:
        return _new_token(path)
    except PermissionError:  # not ours to read, nor to narrow
        return
    except OSError as exc:
        if exc.errno != errno.ELOOP:  # ELOOP: the name is a symbolic link (dangling or not)
            raise
        raise ClusterError(f"{path} is a symbolic link (to {os.readlink(path)}); agentrl does not follow it to "
                           "change a file's mode: put the token file itself there, or remove the link (a new "
                           "token is then made)") from None
    with os.fdopen(fd) as f:  # the mode of the file opened, not of a name another process may swap
        info = os.fstat(f.fileno())
        if info.st_uid == os.getuid() and info.st_mode & 0o077:
            os.fchmod(f.fileno(), 0o600)
            log.warning("%s could be read by other users; it is now readable by you only", path)


def _new_token(path: Path) -> None:
    from ray._private.authentication.authentication_token_generator import generate_new_authentication_token

    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(generate_new_authentication_token())


def needed(cfg: ClusterConfig) -> dict[str, float]:
    want = {"CPU": cfg.engines * cfg.engine_num_cpus + cfg.learner_ranks * cfg.learner_num_cpus,
            "GPU": cfg.engines * cfg.engine_num_gpus + cfg.learner_ranks * cfg.learner_num_gpus}
    for count, custom in ((cfg.engines, cfg.engine_resources), (cfg.learner_ranks, cfg.learner_resources)):
        for name, amount in custom.items():
            want[name] = want.get(name, 0.0) + count * amount
    return want


@contextlib.contextmanager
def _node_ip_as_given() -> Iterator[None]:
    """`ray.init` turns a loopback `_node_ip_address` into the machine's outward address unless Ray's
    single-machine switch (what it uses on macOS and Windows) is off; off for this one call. The Ray
    processes it starts get the address on their command lines, and workers take it from their node."""
    from ray._private import ray_constants

    before = ray_constants.ENABLE_RAY_CLUSTER
    ray_constants.ENABLE_RAY_CLUSTER = False
    try:
        yield
    finally:
        ray_constants.ENABLE_RAY_CLUSTER = before


def start_local(cpus: int, runtime_env: dict, bind_host: str, custom: dict[str, float]) -> None:
    """A new Ray of our own on this machine, listening on `bind_host` (loopback by default); its one
    node offers the `custom` resources the run's actors ask for."""
    import ray

    from agentrl.weights.collective import is_loopback

    loopback = is_loopback(bind_host)
    keep_token_private()
    with _node_ip_as_given() if loopback else contextlib.nullcontext():
        # address="local": a new Ray of our own, even when `ray start` left a cluster running here
        ray.init(address="local", num_cpus=cpus, resources=custom or None, include_dashboard=False,
                 runtime_env=runtime_env, logging_level=logging.WARNING,
                 _node_ip_address="127.0.0.1" if loopback else bind_host)
    if not token_auth_on():
        log.warning("Ray token authentication is off (RAY_AUTH_MODE=%s): any process that reaches %s can run "
                    "code in this run's Ray; unset RAY_AUTH_MODE to turn it back on",
                    os.environ.get("RAY_AUTH_MODE"), bind_host)
    log.info("started a local Ray with %d CPUs on %s", cpus, ray.util.get_node_ip_address())


def auth_mode_from_env() -> None:
    """Ray reads RAY_AUTH_MODE once, when it is imported; a process that set it later (or the fork of
    one that imported Ray before it was set) would join a cluster without its token and be refused.
    Read it again now, as Ray itself does when `ray.init` turns token authentication on."""
    if os.environ.get("RAY_AUTH_MODE", "").lower() == "token" and not token_auth_on():
        from ray._raylet import Config

        Config.initialize("")


def token_auth_on() -> bool:
    from ray._private.authentication.authentication_utils import is_token_auth_enabled

    return is_token_auth_enabled()


def network_env(cfg: ClusterConfig) -> dict[str, str]:
    """The interface every actor's gloo and NCCL listen on for the groups agentrl does not bind itself
    (DeepSpeed's, vLLM's among an engine's workers). NCCL reads it once per process, for all the
    process's communicators, so it is set where the process starts: `cluster.interface` when given
    (checked on this node first: a typo is a start-up error naming the interfaces there are, not a
    hang at the first collective); lo for a Ray of our own on loopback (every node is this machine);
    else NCCL's own choice, which can reach other nodes."""
    from agentrl.weights.collective import interface_address, is_loopback

    if cfg.interface:
        try:
            interface_address(cfg.interface)
        except ValueError as exc:
            raise ClusterError(f"cluster.interface: {exc}") from None
        return {"GLOO_SOCKET_IFNAME": cfg.interface, "NCCL_SOCKET_IFNAME": cfg.interface}
    if cfg.address is None and is_loopback(cfg.bind_host):
        return {"GLOO_SOCKET_IFNAME": "lo", "NCCL_SOCKET_IFNAME": "lo"}
    return {}


def connect(cfg: ClusterConfig) -> None:
    """ray.init for this run (once per process). A local Ray gets as many logical CPUs as the run
    reserves, at least the machine's: Ray's CPUs are scheduling tokens, not pinned cores."""
    import ray

    from agentrl.weights.collective import RAY_ACTOR

    if ray.is_initialized():
        return
    env = {"env_vars": {"VLLM_LOGGING_LEVEL": os.environ.get("VLLM_LOGGING_LEVEL", "ERROR"),
                        "TOKENIZERS_PARALLELISM": "false", RAY_ACTOR: "1", **network_env(cfg)}}
    want = needed(cfg)
    if cfg.address is None:
        from agentrl.learner.dist import usable_cores

        cpus = max(usable_cores(), math.ceil(want["CPU"]))
        custom = {k: v for k, v in want.items() if k not in ("CPU", "GPU")}
        start_local(cpus, env, cfg.bind_host, custom)
    else:
        auth_mode_from_env()
        try:
            ray.init(address=cfg.address, runtime_env=env, logging_level=logging.WARNING)
        except ConnectionError as exc:
            # Ray logs the refusal (InvalidAuthToken) and raises as if nothing were there: say both. `ray.init`
            # sends a token to an explicit address only under RAY_AUTH_MODE=token; `auto` sends one where a
            # token exists on this machine.
            token = "" if token_auth_on() else (
                ", or the cluster refused this process for want of a token: to an address Ray sends one only with "
                "RAY_AUTH_MODE=token (`auto` does where a token exists here); set RAY_AUTH_MODE=token (the token: "
                "RAY_AUTH_TOKEN, else ~/.ray/auth_token, the head's)")
            raise ClusterError(f"cluster.address={cfg.address!r}: no Ray cluster there ({exc}); start one with "
                               f"`ray start --head`{token}") from None
        if not token_auth_on():  # joined without a token: the cluster asks for none
            log.warning("the Ray cluster at %s runs without token authentication: anyone who reaches it can run "
                        "code in it; docs/scale-out.md (Token authentication) says how to turn it on",
                        cfg.address)
    have = ray.cluster_resources()
    short = [f"{k}: needs {v:g}, the cluster has {have.get(k, 0):g}" for k, v in want.items() if v > have.get(k, 0)]
    if short:
        ray.shutdown()
        raise ClusterError("the Ray cluster cannot hold this run (" + "; ".join(short) + "); lower "
                           "cluster.engine_num_cpus/learner_num_cpus (or _gpus) or add nodes")
    log.info("Ray cluster: %d node(s), %s", len([n for n in ray.nodes() if n["Alive"]]), have)


def disconnect() -> None:
    import ray

    if ray.is_initialized():
        ray.shutdown()
