"""What the default run's weight push leaves open: the local backend's hub (`LocalHub`, the learner's
side) pushes one snapshot into a receiver in another process (the engine worker's side: the join and
receive `AgentrlWeightTransferEngine` runs, without importing vLLM), and every listening socket of the
process tree, taken while the group stands, is on a loopback address. The init info (with the group's
key) reaches the receiver on its stdin, as it reaches a worker through the engine's RPC: never argv."""

from __future__ import annotations

import datetime
import ipaddress
import json
import os
import subprocess
import sys
import threading

import psutil
import torch

from agentrl.weights.push import LocalHub

RECEIVER = """
import json, sys, torch
from agentrl.weights import buckets as wbuckets, collective
info, metas = json.loads(sys.stdin.readline())
metas = [wbuckets.TensorMeta(n, d, tuple(s)) for n, d, s in metas]
group = collective.join(None, info["rank_offset"], info["world_size"], info["timeout_s"], torch.device("cpu"),
                        collective.Access.from_info(info))
print("joined", flush=True)
buckets = wbuckets.plan_buckets(metas, info["bucket_bytes"])
pairs = [p for part in collective.receive(group, metas, buckets, torch.device("cpu")) for p in part]
print(json.dumps({n: t.tolist() for n, t in pairs}), flush=True)
"""


def listening_sockets(root: psutil.Process) -> list[tuple[int, str, int]]:
    """(pid, address, port) of every listening TCP socket of `root` and its descendants."""
    out = []
    for p in [root, *root.children(recursive=True)]:
        try:
            out += own_sockets(p)
        except psutil.NoSuchProcess:
            pass
    return out


def own_sockets(proc: psutil.Process) -> list[tuple[int, str, int]]:
    """(pid, address, port) of every listening TCP socket of `proc` itself."""
    return [(proc.pid, c.laddr.ip, c.laddr.port) for c in proc.net_connections("inet")
            if c.status == psutil.CONN_LISTEN]


def test_the_default_weight_push_listens_on_loopback_only():
    weights = {"embed": torch.randn(40, 8), "norm": torch.randn(8)}
    hub = LocalHub(lambda: weights, None, timeout_s=60, bucket_bytes=1 << 10)
    handover, _ = hub.publish(1)
    init = hub.hub.open("engine0", 1)
    metas = [[n, d, s] for n, d, s in zip(*(handover.update_info[k] for k in ("names", "dtype_names", "shapes")))]
    child = subprocess.Popen([sys.executable, "-c", RECEIVER], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             text=True)
    try:
        child.stdin.write(json.dumps([init, metas]) + "\n")
        child.stdin.flush()
        hub.hub.join("engine0")  # returns once the receiver has joined too
        assert child.stdout.readline().strip() == "joined"
        # This process and the receiver it started: other children the test worker may still have (an engine
        # core an earlier test left winding down) are not the push's.
        sockets = [s for proc in (psutil.Process(), psutil.Process(child.pid)) for s in own_sockets(proc)]
        pids = {pid for pid, _, _ in sockets}
        sender = threading.Thread(target=hub.hub.send, args=("engine0", 1))
        sender.start()
        got = json.loads(child.stdout.readline())
        sender.join(30)
    finally:
        child.kill()
        child.wait()
        hub.close()
    assert {k: torch.tensor(v) for k, v in got.items()}.keys() == weights.keys()
    assert all(torch.equal(torch.tensor(got[k]), v) for k, v in weights.items())
    # The store and gloo's listener on this side, gloo's listener on the receiver's: all on loopback.
    assert init["master_port"] in {port for _, _, port in sockets}
    assert pids == {psutil.Process().pid, child.pid}
    open_beyond = [s for s in sockets if not ipaddress.ip_address(s[1]).is_loopback]
    assert open_beyond == [], f"listening on a non-loopback address: {open_beyond}"


RANK = """
import os, sys, torch
from agentrl.learner.dist import rank_store
rank = int(os.environ["RANK"])
torch.distributed.init_process_group("gloo", store=rank_store(rank, 2), rank=rank, world_size=2)
t = torch.tensor([rank + 1.0])
torch.distributed.all_reduce(t)
print(float(t), "AGENTRL_RANKS_KEY" in os.environ, flush=True)
sys.stdin.readline()  # stays up while the test lists its sockets
"""


def test_the_learner_ranks_rendezvous_listens_on_master_addr_only_and_is_sealed():
    """Two learner ranks as `agentrl.learner.dist` joins them (MASTER_ADDR on loopback: every rank on
    this node), with the ranks' key in their environment: the group works, every socket of theirs
    listens on loopback (torch's env:// store would listen on every address), the key is gone from
    their environment once read, and the store holds sealed keys only."""
    from agentrl.weights import collective
    from agentrl.learner.dist import free_port

    key = collective.new_key()
    port = free_port()
    ranks = []
    for rank in (0, 1):
        env = {k: v for k, v in os.environ.items() if k != "GLOO_SOCKET_IFNAME"}
        env.update(RANK=str(rank), WORLD_SIZE="2", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                   AGENTRL_RANKS_KEY=key.hex())
        ranks.append(subprocess.Popen([sys.executable, "-c", RANK], env=env, stdin=subprocess.PIPE,
                                      stdout=subprocess.PIPE, text=True))
    try:
        assert [r.stdout.readline().split() for r in ranks] == [["3.0", "False"]] * 2
        sockets = [s for r in ranks for s in listening_sockets(psutil.Process(r.pid))]
        stranger = torch.distributed.TCPStore("127.0.0.1", port, None, False, datetime.timedelta(seconds=10),
                                              wait_for_workers=False)
        keys = stranger.list_keys()
    finally:
        for r in ranks:
            r.kill()
            r.wait()
    assert (ranks[0].pid, "127.0.0.1", port) in sockets
    assert [s for s in sockets if not ipaddress.ip_address(s[1]).is_loopback] == []
    prefix = collective.SealedStore(stranger, key)._prefix
    assert keys and all(prefix in k for k in keys if "/0/" in k or "/1/" in k)
