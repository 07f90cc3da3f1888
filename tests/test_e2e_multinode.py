"""Ray on this machine, as a user would meet it: the local Ray a run starts (no `cluster.address`) listens on
loopback only with Ray's token authentication on, and the one-machine Ray command of docs/scale-out.md runs.

Several nodes (`ray.cluster_utils.Cluster`: a head and three worker raylets on this host), an engine
node and then the learner's node removed mid-run and a resume on what remains, are in
`bench/_node_faults.py` (the fault table's node rows), not here: on 2 cores beside the rest of the suite
that run took 24 minutes in CI."""

from __future__ import annotations

import ipaddress
import os
import socket
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from test_e2e_cluster import finish, launch, wait_for_step

pytestmark = pytest.mark.e2e


def listening(root: psutil.Process) -> list[tuple[str, str, int]]:
    """(process, address, port) of every TCP socket that `root` and its descendants listen on."""
    found = []
    for proc in [root, *root.children(recursive=True)]:
        try:
            name = " ".join(proc.cmdline())[:80]
            found += [(name, c.laddr.ip, c.laddr.port) for c in proc.net_connections(kind="tcp")
                      if c.status == psutil.CONN_LISTEN]
        except (psutil.NoSuchProcess, psutil.ZombieProcess):
            continue
    return found


def is_loopback(address: str) -> bool:
    ip = ipaddress.ip_address(address.split("%")[0])
    mapped = getattr(ip, "ipv4_mapped", None)  # ::ffff:127.0.0.1: a dual-stack socket bound to loopback
    return (mapped or ip).is_loopback


def outward_address() -> str | None:
    """This machine's address on its way out (what Ray would have bound), None when it has none."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect(("192.0.2.1", 9))  # no packet is sent: a UDP connect only picks the route
            address = s.getsockname()[0]
        except OSError:
            return None
    return None if ipaddress.ip_address(address).is_loopback else address


def refused(address: str, port: int) -> bool:
    try:
        socket.create_connection((address, port), timeout=2).close()
    except OSError:
        return True
    return False


@pytest.fixture
def auth_env():
    """`ray.init` turns token authentication on for this process (RAY_AUTH_MODE=token in os.environ): put
    the environment back afterwards, so the next test sees what the user set."""
    before = os.environ.get("RAY_AUTH_MODE")
    yield
    if before is None:
        os.environ.pop("RAY_AUTH_MODE", None)
    else:
        os.environ["RAY_AUTH_MODE"] = before


def test_a_local_ray_listens_on_loopback_only_with_token_auth(auth_env):
    """agentrl.run.cluster.connect with no address: every socket the Ray processes (GCS, raylet, object
    manager, agents, workers, this driver's core worker) listen on is a loopback one, the machine's
    outward address reaches none of them, actors see 127.0.0.1 as their node's address, and a client
    without Ray's token is turned away."""
    import ray

    from agentrl.run.cluster import connect, disconnect, token_auth_on
    from agentrl.config import ClusterConfig

    connect(ClusterConfig(backend="ray", engines=1))
    try:
        probe = ray.remote(num_cpus=0)(lambda: ray.util.get_node_ip_address())
        assert ray.get(probe.remote()) == "127.0.0.1"  # a worker (its gRPC server is up too)
        sockets = listening(psutil.Process())
        ray_sockets = [s for s in sockets if "ray" in s[0] or s[0].startswith(sys.executable)]
        assert len(ray_sockets) >= 5, sockets  # GCS, raylet (2), agents, workers: the check saw them
        assert [s for s in sockets if not is_loopback(s[1])] == []
        outward = outward_address()
        if outward is not None:  # a machine with no other address has nothing more to show
            assert [s for s in sockets if not refused(outward, s[2])] == []
        assert token_auth_on()
        gcs = ray.get_runtime_context().gcs_address
        assert gcs_answer(gcs, "0" * 32) == "AuthenticationError"  # a stranger with a token of their own
        token = os.environ.get("RAY_AUTH_TOKEN") or (Path.home() / ".ray" / "auth_token").read_text().strip()
        assert gcs_answer(gcs, token).endswith(" keys")  # the same call with the cluster's token is answered
    finally:
        disconnect()


def test_the_readme_one_machine_ray_command(tmp_path, model_dir):
    """docs/scale-out.md, one machine: a local Ray the run starts (no cluster.address), 2 engine actors
    and 2 learner ranks, at a tiny size. While it trains, nothing of it (driver, Ray, engines, learner
    ranks, weight groups) listens on an address other than loopback."""
    proc, out = launch(tmp_path, model_dir, "--config", "examples/agents/guess_number.yaml",
                       "cluster.backend=ray", "cluster.engines=2", "cluster.learner_ranks=2",
                       "train.steps=2", "buffer.batch_size=8", "rollout.n_samples=4")
    wait_for_step(proc, out, 0)  # a step done: every engine, rank and weight group is up
    sockets = listening(psutil.Process(proc.pid))
    summary, records = finish(proc, out)
    print("\n".join(f"{ip}:{port}  {name}" for name, ip, port in sockets))  # the socket list (-s)
    assert len(sockets) >= 8, sockets
    assert [s for s in sockets if not is_loopback(s[1])] == []
    assert len(records) == 2 and summary["fleet"]["engines"] == 2 and summary["fleet"]["engines_healthy"] == 2
    assert summary["fleet"]["weight_transport"] == "collective"


STRANGER = """
import sys
from ray._raylet import GcsClient
try:
    print(len(GcsClient(address=sys.argv[1]).internal_kv_keys(b"", namespace=None, timeout=20)), "keys")
except Exception as exc:
    print(type(exc).__name__)
"""


def gcs_answer(gcs_address: str, token: str) -> str:
    """What a fresh process holding `token` (and no token file: another home) gets from the GCS."""
    env = {**os.environ, "HOME": "/nonexistent-agentrl-test", "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": token,
           "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}  # Ray's switch to keep 127.0.0.1 as given
    env.pop("RAY_AUTH_TOKEN_PATH", None)
    proc = subprocess.run([sys.executable, "-c", STRANGER, gcs_address], env=env, capture_output=True, text=True,
                          timeout=120)
    return proc.stdout.strip()
