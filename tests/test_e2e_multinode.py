"""Ray on this machine, as a user would meet it: the local Ray a run starts (no `cluster.address`) listens on
loopback only with Ray's token authentication on, and the README's one-machine Ray command runs; then
several nodes (`ray.cluster_utils.Cluster`: a head and three worker raylets on this host, each its own
node), the learner rank on one node and the engines on two others, weights across nodes through the
collective path; an engine node killed mid-run, then the learner's node, and a resume on what remains."""

from __future__ import annotations

import ipaddress
import json
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest

from test_e2e import ROOT
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
    """agentrl.cluster.connect with no address: every socket the Ray processes (GCS, raylet, object
    manager, agents, workers, this driver's core worker) listen on is a loopback one, the machine's
    outward address reaches none of them, actors see 127.0.0.1 as their node's address, and a client
    without Ray's token is turned away."""
    import ray

    from agentrl.cluster import connect, disconnect, token_auth_on
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
    """README "Scale-out on Ray", one machine: a local Ray the run starts (no cluster.address), 2 engine actors
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


# -- several nodes --------------------------------------------------------------------------------------


@pytest.fixture
def cluster(auth_env):
    """A head (the driver's node; one spare CPU) and three worker raylets on this host, each its own Ray
    node: L offers `learner_node`, E1 one `engine_node`, E2 two (room for E1's engine when E1 goes).
    Token authentication on, as a `ray.init` cluster has it."""
    from ray._private.authentication.authentication_token_setup import (enable_token_auth_by_default,
                                                                        ensure_token_if_auth_enabled)
    from ray.cluster_utils import Cluster

    enable_token_auth_by_default()  # RAY_AUTH_MODE=token here and in every process started from here
    ensure_token_if_auth_enabled({}, create_token_if_missing=True)
    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 1})
    nodes = {"L": c.add_node(num_cpus=1, resources={"learner_node": 1}),
             "E1": c.add_node(num_cpus=1, resources={"engine_node": 1}),
             "E2": c.add_node(num_cpus=2, resources={"engine_node": 2})}
    yield c, nodes
    c.shutdown()


class Output:
    """A run's stdout and stderr lines as they come (a thread reads the pipe)."""

    def __init__(self, proc: subprocess.Popen) -> None:
        self.proc, self.lines = proc, []
        self.thread = threading.Thread(target=lambda: self.lines.extend(iter(proc.stdout.readline, "")), daemon=True)
        self.thread.start()

    def wait_for(self, text: str, timeout_s: float = 600) -> str:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            hit = next((line for line in self.lines if text in line), None)
            if hit:
                return hit
            assert self.proc.poll() is None or self.thread.is_alive(), "".join(self.lines)[-6000:]
            time.sleep(0.5)
        raise AssertionError(f"no line with {text!r} within {timeout_s} s:\n" + "".join(self.lines)[-6000:])

    def end(self, timeout_s: float = 600) -> int:
        code = self.proc.wait(timeout=timeout_s)
        self.thread.join(timeout=30)
        return code

    def matching(self, *texts: str) -> list[str]:
        return [line.rstrip() for line in self.lines if any(t in line for t in texts)]


def node_of(title: str, nodes: dict) -> list[str]:
    """The names of the nodes (by their raylet: a worker process's parent) running processes titled `title`."""
    from ray._private import ray_constants

    raylets = {n.all_processes[ray_constants.PROCESS_TYPE_RAYLET][0].process.pid: name for name, n in nodes.items()}
    found = []
    for p in psutil.process_iter():
        try:
            if " ".join(p.cmdline()).startswith(title) and p.ppid() in raylets:
                found.append(raylets[p.ppid()])
        except (psutil.NoSuchProcess, psutil.ZombieProcess):
            continue
    return sorted(found)


MULTINODE = ("--config", "examples/agents/guess_number.yaml", "train.checkpoint_every=1",
             # generation never waits on the learner, so the engine node dies with episodes in flight on it
             "buffer.max_staleness=1000", "buffer.batch_size=16", "rollout.n_samples=4",
             "cluster.backend=ray", "cluster.engines=2", "weight_sync.transport=collective",
             "cluster.engine_resources={engine_node: 1}")


def test_engine_node_then_learner_node_killed_and_a_resume_on_what_remains(tmp_path, model_dir, cluster):
    """Learner rank on L, engines on E1 and E2, weights through the collective path across nodes. E1 is
    killed (SIGKILL, no drain) two steps in: its engine comes back on E2; then L is killed: the run ends
    by itself with a message naming what to do. The same command with train.resume=auto (the learner
    placed anywhere: L is gone) finishes it on the head and E2, every task position trained, dropped or
    pending once. The run is long (1000 steps) so that it is still going when the nodes die, whatever
    the machine's speed; the resume asks for two steps past its checkpoint."""
    c, nodes = cluster
    args = (*MULTINODE, f"cluster.address={c.address}")
    proc, out = launch(tmp_path, model_dir, *args, "train.steps=1000", "cluster.learner_resources={learner_node: 1}")
    try:
        kill_nodes_then_resume(tmp_path, model_dir, c, nodes, Output(proc), out, args)
    finally:
        if proc.poll() is None:  # an assertion failed while it ran: it must not outlive its cluster
            proc.kill()


def kill_nodes_then_resume(tmp_path, model_dir, c, nodes, run: Output, out: Path, args: tuple) -> None:
    """The test's body, once its first run is under way (the test kills that run if this fails)."""
    from agentrl.checkpoint import CheckpointStore, audit

    proc = run.proc
    run.wait_for("through a torch.distributed group each")
    wait_for_step(proc, out, 2)
    assert node_of("ray::LearnerRank", nodes) == ["L"] and node_of("ray::EngineActor", nodes) == ["E1", "E2"]
    c.remove_node(nodes.pop("E1"), allow_graceful=False)
    run.wait_for("restarted in")
    assert node_of("ray::EngineActor", nodes) == ["E2", "E2"]  # E1's engine came back on the survivor
    c.remove_node(nodes.pop("L"), allow_graceful=False)
    code = run.end()
    print("\n".join(run.matching("died", "restarted in", "run failed")))  # the node kills as the run told them
    assert code == 1, "".join(run.lines)[-6000:]
    assert any("LearnerRankDied" in line and "train.resume=auto" in line for line in run.lines)
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert max(r.get("episodes/engine_error", 0) for r in records) > 0  # the episodes on E1's engine, counted

    last = int(CheckpointStore(out).latest().name.split("_")[1])
    resumed, _ = launch(tmp_path, model_dir, *args, f"train.steps={last + 2}", "cluster.learner_resources={}",
                        "train.resume=auto")
    again = Output(resumed)
    assert again.end() == 0, "".join(again.lines)[-6000:]
    print("\n".join(again.matching("resumed from")))
    summary = json.loads((out / "summary.json").read_text())
    assert summary["fleet"]["weight_transport"] == "collective"
    assert summary["fleet"]["engine_versions"] == [last + 2] * 2
    report = audit(out)
    print(report)
    assert report["steps"] == list(range(report["steps"][0], last + 2)) and report["steps"][0] <= 1
    assert report["skipped"] == [] and report["duplicated"] == []
