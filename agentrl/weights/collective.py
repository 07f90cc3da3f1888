"""The collective weight path's wire: a torch.distributed group of its own between one learner process
(rank 0, the sender) and one engine's vLLM workers (ranks 1..), and the bucketed broadcast of a weight
snapshot through it (packed by agentrl.weights.buckets). Both ends import these two modules and
nothing else of each other.

Why a group of its own: the learner's DeepSpeed ranks and vLLM's workers each already have a default
group; this one is built from its own TCPStore so it touches neither, and it is rebuilt from scratch
for a restarted engine. Gloo on CPU, NCCL on GPU: the same calls (`ProcessGroup.broadcast`). It
listens on loopback unless its peers are on other nodes, and carries a key of its own that strangers
who reach its ports do not have ("Who can reach it", below).

"""

from __future__ import annotations

import contextlib
import datetime
import hashlib
import hmac
import os
import secrets
import socket
import threading
from dataclasses import dataclass, field
from typing import Any, Iterator

import torch

from agentrl.utils.hosts import is_loopback  # noqa: F401  (callers use collective.is_loopback)
from agentrl.weights.buckets import Bucket, TensorMeta, unpack

# -- the group ---------------------------------------------------------------------------------
# Who can reach it, and what a stranger who does can do. The group's rendezvous is a TCPStore on rank
# 0, and gloo (or NCCL's bootstrap) listens on every rank for its peers. None of them authenticates
# anything, and torch's store even answers `list_keys` to anyone who connects. So:
#   1. Nothing listens beyond where the peers are: on 127.0.0.1 when every peer is on this node (the
#      local backend, always), else on the configured interface's address (`Network`). torch's store
#      binds the wildcard address whatever host it is given; handed a socket already bound to the
#      address (`master_listen_fd`), it listens on that one (`listen`). gloo binds what its device is
#      created with; NCCL bootstraps over NCCL_SOCKET_IFNAME.
#   2. Every group has a secret key (32 random bytes, `Access.key`), made by the sender and handed to
#      the receivers with the rest of the init info through the control channel that already starts
#      them (vLLM's engine RPC, or Ray's): never through the store, argv, a file or a log (it is kept
#      out of reprs). Every key the group writes lies under a prefix derived from it, so nothing a
#      stranger writes before the group forms is ever read, and every value carries an HMAC of its
#      key and bytes under it (`SealedStore`), so a value a stranger writes over one it listed is
#      refused, never used: a stranger can stop a group from forming (so can anyone who can send it
#      packets), never steer it.
#   3. gloo matches an incoming connection to a peer by a small sequence number that the store's
#      values reveal, so a stranger who races a peer to a listener could take its place. Once the
#      group has formed, every rank sends an HMAC of its rank under the key through the group itself,
#      and every rank checks them all (`_prove`): a group with anyone but its own peers in it fails
#      to join (and is rebuilt at the next push) before a byte of weights goes through it.

LOOPBACK = "127.0.0.1"
RAY_ACTOR = "AGENTRL_RAY_ACTOR"  # set in the environment of a run's Ray actors (agentrl.run.cluster.connect)
_MAC = hashlib.sha256
_MAC_BYTES = _MAC().digest_size


@dataclass(frozen=True)
class Network:
    """Where a group's sockets listen: `local` (every peer on this node) keeps them on 127.0.0.1;
    otherwise `interface` names the network interface the peers reach each other on on every node
    ("" = the address this node is known by: the sender's host for its store, and for gloo each
    rank's address on its route to the sender)."""

    local: bool = True
    interface: str = ""


@dataclass(frozen=True)
class Access:
    """What a rank needs to join a group: where its store listens, the group's key, and its network."""

    host: str
    port: int
    key: bytes = field(repr=False)
    network: Network = Network()

    @classmethod
    def from_info(cls, info: Any) -> "Access":
        """From the sender's init info (a dict, or an object with the same fields)."""
        get = info.get if isinstance(info, dict) else lambda k, d=None: getattr(info, k, d)
        secret = get("secret") or ""
        if not secret:
            raise ValueError("the weight group's init info has no secret: the sender predates this "
                             "version of agentrl or the info was built by hand; rebuild it with SenderHub.open")
        return cls(get("master_address"), int(get("master_port")), bytes.fromhex(secret),
                   Network(bool(get("local", True)), get("interface", "") or ""))


def keep_gloo_on_loopback() -> None:
    """GLOO_SOCKET_IFNAME=lo for this process and those it starts: gloo's default device listens on the
    hostname's address (a LAN one on many machines) in every group made without a device of its own: a
    one-process learner's, vLLM's among one engine's workers, whose peers are all on this node. Groups
    that may span nodes name their device (`_gloo_group`). NCCL reads its interface once per process:
    lo too, unless set, but not in a run's Ray actor, whose groups may span nodes (cluster.network_env)."""
    os.environ["GLOO_SOCKET_IFNAME"] = "lo"
    if not os.environ.get(RAY_ACTOR):
        os.environ.setdefault("NCCL_SOCKET_IFNAME", "lo")


def new_key() -> bytes:
    return secrets.token_bytes(32)


def interface_address(interface: str) -> str:
    """The IPv4 (else IPv6) address of network interface `interface`, for a socket to bind."""
    import psutil

    addrs = psutil.net_if_addrs()
    if interface not in addrs:
        raise ValueError(f"network interface {interface!r} does not exist on this node (it has: "
                         f"{', '.join(sorted(addrs))}); set the interface the nodes reach each other on")
    for family in (socket.AF_INET, socket.AF_INET6):
        for a in addrs[interface]:
            if a.family == family:
                return a.address.split("%")[0]
    raise ValueError(f"network interface {interface!r} has no IP address")


def route_address(peer: str) -> str:
    """This node's address on the route to `peer` (no packet is sent: a UDP socket's connect only
    picks the route)."""
    family, _, _, _, addr = socket.getaddrinfo(peer, 1, type=socket.SOCK_DGRAM)[0]
    with socket.socket(family, socket.SOCK_DGRAM) as s:
        s.connect(addr)
        return s.getsockname()[0]


def bind_address(network: Network, host: str) -> str:
    """The address rank 0's store listens on: loopback for a local group, the configured interface's
    address, else `host` (the address this node is known by)."""
    return LOOPBACK if network.local else interface_address(network.interface) if network.interface else host


def listen(host: str, world: int, timeout_s: float, port: int = 0) -> torch.distributed.TCPStore:
    """Rank 0's store on `port` (0: one the OS picks, `store.port`), listening on `host` only (see above)."""
    family, _, _, _, addr = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.bind(addr[:2] if family == socket.AF_INET else addr)
    except OSError as exc:
        sock.close()
        raise OSError(f"cannot listen for a rendezvous on {host} port {port}: {exc}") from exc
    fd = sock.detach()  # the store owns the descriptor from here: it listens on it, and closes it
    return torch.distributed.TCPStore(host, port, world, True, datetime.timedelta(seconds=timeout_s),
                                      wait_for_workers=False, master_listen_fd=fd)


class SealedStore(torch.distributed.Store):
    """`inner` with every key under a prefix derived from `key`, and every value sealed with an HMAC
    of (key name, value) under it; a value whose seal does not match is refused (PermissionError).
    Counters (`add`) cannot carry a seal: the group reads none that decide what it trusts."""

    def __init__(self, inner: torch.distributed.Store, key: bytes) -> None:
        super().__init__()
        self._inner, self._key = inner, key
        self._prefix = "agentrl-weights/" + hmac.new(key, b"prefix", _MAC).hexdigest()[:32] + "/"

    def _seal(self, name: str, value: bytes) -> bytes:
        return hmac.new(self._key, name.encode() + b"\0" + value, _MAC).digest()

    def set(self, name: str, value) -> None:
        value = value.encode() if isinstance(value, str) else bytes(value)
        self._inner.set(self._prefix + name, self._seal(name, value) + value)

    def get(self, name: str) -> bytes:
        raw = bytes(self._inner.get(self._prefix + name))
        seal, value = raw[:_MAC_BYTES], raw[_MAC_BYTES:]
        if len(raw) < _MAC_BYTES or not hmac.compare_digest(seal, self._seal(name, value)):
            raise PermissionError(f"the group's store holds a value for {name!r} that its ranks did not write "
                                  "(its seal does not match): someone without the group's key wrote it")
        return value

    def compare_set(self, name: str, expected, desired) -> bytes:
        """Sealed both ways: `expected` matches only a value this group wrote."""
        expected = expected.encode() if isinstance(expected, str) else bytes(expected)
        desired = desired.encode() if isinstance(desired, str) else bytes(desired)
        sealed_expected = self._seal(name, expected) + expected if expected else b""
        self._inner.compare_set(self._prefix + name, sealed_expected, self._seal(name, desired) + desired)
        return self.get(name)

    def multi_get(self, names) -> list[bytes]:
        return [self.get(n) for n in names]

    def multi_set(self, names, values) -> None:
        for n, v in zip(names, values):
            self.set(n, v)

    def wait(self, names, timeout=None) -> None:
        names = [self._prefix + n for n in names]
        self._inner.wait(names) if timeout is None else self._inner.wait(names, timeout)

    def check(self, names) -> bool:
        return self._inner.check([self._prefix + n for n in names])

    def add(self, name: str, amount: int) -> int:
        return self._inner.add(self._prefix + name, amount)

    def delete_key(self, name: str) -> bool:
        return self._inner.delete_key(self._prefix + name)

    def num_keys(self) -> int:
        return self._inner.num_keys()

    def set_timeout(self, timeout) -> None:
        self._inner.set_timeout(timeout)


def join(store: torch.distributed.TCPStore | None, rank: int, world: int, timeout_s: float,
         device: torch.device, access: Access) -> "Group":
    """Join the group as `rank` (blocks until all `world` ranks have joined, at most `timeout_s`);
    rank 0 passes its own store, the others None (they connect to `access.host:port`). Every
    collective on it then fails after `timeout_s` instead of waiting for a peer forever."""
    timeout = datetime.timedelta(seconds=timeout_s)
    if store is None:
        store = torch.distributed.TCPStore(access.host, access.port, world, False, timeout)
    sealed = SealedStore(store, access.key)
    if device.type == "cuda":
        group = _nccl_group(sealed, rank, world, timeout, device, access.network)
    else:
        group = _gloo_group(sealed, rank, world, timeout, access.network, access.host)
    _prove(group, rank, world, access.key, device)
    return Group(group, sealed)


class Group:
    """A process group and the store it was built on, kept alive together: a store written in Python
    (`SealedStore`) loses its Python half, and with it the connection it wraps, once nothing in Python
    refers to it, though the group still holds it (NCCL's monitor reads the store while a group lives).
    Everything else is the process group's."""

    def __init__(self, group: torch.distributed.ProcessGroup, store: torch.distributed.Store) -> None:
        self.group, self.store = group, store

    def __getattr__(self, name: str) -> Any:
        return getattr(self.group, name)


def _gloo_group(store, rank: int, world: int, timeout: datetime.timedelta, network: Network,
                master: str) -> torch.distributed.ProcessGroup:
    """gloo listening on loopback (a local group), on `network.interface`, or else on this node's
    address on the route to rank 0 (`master`): never where GLOO_SOCKET_IFNAME or the hostname happen
    to point (agentrl.learner.dist sets the former to loopback in a one-process learner)."""
    gloo = torch.distributed.ProcessGroupGloo
    if network.local:
        device = gloo.create_device(hostname=LOOPBACK)
    elif network.interface:
        device = gloo.create_device(interface=network.interface)
    else:
        device = gloo.create_device(hostname=route_address(master))
    opts = gloo._Options()
    opts._timeout, opts._devices = timeout, [device]
    return gloo(store, rank, world, opts)


def _token(key: bytes, rank: int) -> bytes:
    return hmac.new(key, f"agentrl weight group rank {rank}".encode(), _MAC).digest()


def _prove(group, rank: int, world: int, key: bytes, device: torch.device) -> None:
    """Every rank's HMAC of its rank under the key, gathered through the group's own connections: a
    peer that is not who it claims (a stranger who took a connection) cannot produce its token."""
    mine = torch.frombuffer(bytearray(_token(key, rank)), dtype=torch.uint8).to(device)
    tokens = [torch.empty_like(mine) for _ in range(world)]
    group.allgather([tokens], [mine]).wait()
    for r, t in enumerate(tokens):
        if not hmac.compare_digest(bytes(t.cpu().tolist()), _token(key, r)):
            raise PermissionError(f"weight group: the peer at rank {r} did not prove the group's key; someone "
                                  "else connected to the group's sockets. The group is dropped unused.")


def _nccl_group(store, rank: int, world: int, timeout: datetime.timedelta, device: torch.device,
                network: Network) -> torch.distributed.ProcessGroup:
    """NCCL connects at the first collective; connect now, so a group that cannot form fails its join
    (and `auto` falls back to files) rather than the first push. Error handling 2 (clean up only): a
    timed-out push aborts this group, where the default would kill the learner's process with it.

    NCCL's bootstrap listens on NCCL_SOCKET_IFNAME (loopback for a local group, else the configured
    interface), read once, when the process's first communicator starts: where NCCL started earlier
    (DeepSpeed's group, vLLM's tensor-parallel group) the process's start decides (cluster.network_env)."""
    if device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    opts = torch.distributed.ProcessGroupNCCL.Options()
    opts._timeout = timeout
    ifname = "=lo" if network.local else (f"={network.interface}" if network.interface else None)
    if ifname:  # kept: NCCL reads it once, at the process's first communicator, and so would later groups
        os.environ.setdefault("NCCL_SOCKET_IFNAME", ifname)
    with _environ({"TORCH_NCCL_ASYNC_ERROR_HANDLING": "2"}):  # read by the constructor
        group = torch.distributed.ProcessGroupNCCL(store, rank, world, opts)
    group.eager_connect_single_device(device)  # outside the lock: a peer that never comes blocks this group only
    return group


_ENVIRON = threading.Lock()  # os.environ is the process's: rank 0 joins several engines' groups at once


@contextlib.contextmanager
def _environ(values: dict[str, str]) -> Iterator[None]:
    """`values` set in os.environ for the block (one such block at a time), the old values back afterwards."""
    with _ENVIRON:
        old = {k: os.environ.get(k) for k in values}
        os.environ.update(values)
        try:
            yield
        finally:
            for k in values:
                os.environ.pop(k, None)
            os.environ.update({k: v for k, v in old.items() if v is not None})


def broadcast(group: torch.distributed.ProcessGroup, buf: torch.Tensor) -> None:
    group.broadcast(buf, 0).wait()


def receive(group: torch.distributed.ProcessGroup, metas: list[TensorMeta], buckets: list[Bucket],
            device: torch.device) -> Iterator[list[tuple[str, torch.Tensor]]]:
    """The receiving side of `send`: one list of (name, tensor) per bucket, as it arrives."""
    for b in buckets:
        buf = torch.empty(b.size, dtype=torch.uint8, device=device)
        broadcast(group, buf)
        yield unpack(buf, metas, b)
