"""Who can reach the collective weight path, and what a stranger who does can do (agentrl.weights.collective,
"Who can reach it"): the store listens on the address it is given, not the wildcard torch binds; a
stranger on the port writes keys and the push still lands, reading none of them; a value a stranger
wrote over the group's is refused; a peer that cannot prove the group's key is refused before any
weights move; the key stays out of reprs."""

from __future__ import annotations

import datetime
import threading

import psutil
import pytest
import torch

from agentrl.weights import buckets as wbuckets, collective
from agentrl.weights.push import SenderHub

TIMEOUT = datetime.timedelta(seconds=20)


def listening(pid: int | None = None) -> set[tuple[str, int]]:
    return {(c.laddr.ip, c.laddr.port) for c in psutil.Process(pid).net_connections("inet")
            if c.status == psutil.CONN_LISTEN}


def test_the_store_listens_on_the_address_it_is_given_only():
    before = listening()
    store = collective.listen("127.0.0.1", 2, 5)
    new = listening() - before
    assert new == {("127.0.0.1", store.port)}
    # torch's own default (what the push used before) listens on the wildcard address, whatever host it is given
    plain = torch.distributed.TCPStore("127.0.0.1", 0, 2, True, TIMEOUT, wait_for_workers=False)
    assert {ip for ip, port in listening() if port == plain.port} <= {"0.0.0.0", "::"}
    # an interface by name, for groups whose peers are on other nodes: its address, not the wildcard
    assert collective.bind_address(collective.Network(local=False, interface="lo"), "192.0.2.7") == "127.0.0.1"
    assert collective.bind_address(collective.Network(local=False), "192.0.2.7") == "192.0.2.7"
    with pytest.raises(ValueError, match="'no-such0' does not exist on this node"):
        collective.interface_address("no-such0")


class Recording(torch.distributed.Store):
    """A store that notes every key read through it."""

    def __init__(self, inner) -> None:
        super().__init__()
        self.inner, self.read = inner, []

    def set(self, k, v):
        self.inner.set(k, v)

    def get(self, k):
        self.read.append(k)
        return self.inner.get(k)

    def wait(self, keys, timeout=None):
        self.read.extend(keys)
        self.inner.wait(keys) if timeout is None else self.inner.wait(keys, timeout)

    def add(self, k, n):
        return self.inner.add(k, n)

    def check(self, keys):
        return self.inner.check(keys)


def test_a_stranger_writing_keys_on_the_port_does_not_disturb_a_push():
    """The stranger has the address and port (anyone on the node can list them) but not the key: it
    writes what a gloo rendezvous reads, with and without the old fixed prefix, before the group forms.
    The push lands bit-exactly, and no key the stranger wrote is ever read."""
    hub = SenderHub("127.0.0.1", timeout_s=20, bucket_bytes=1 << 20)
    live = {"w": torch.randn(33, 7), "b": torch.randn(5)}
    info, _ = hub.publish(1, live, None)
    init = hub.open("engine0", 1)
    stranger = torch.distributed.TCPStore("127.0.0.1", init["master_port"], None, False, TIMEOUT,
                                          wait_for_workers=False)
    planted = ["0/0", "0/1", "agentrl-weights/0/0", "agentrl-weights/0/1", "init/", "rank_0"]
    for key in planted:
        stranger.set(key, b"\x00" * 300)  # a gloo address blob would be parsed from these bytes
    metas = [wbuckets.TensorMeta(n, d, tuple(s)) for n, d, s in
             zip(info["names"], info["dtype_names"], info["shapes"])]
    result: dict = {}
    receiver_store = Recording(torch.distributed.TCPStore("127.0.0.1", init["master_port"], 2, False, TIMEOUT))

    def receive() -> None:
        try:
            group = collective.join(receiver_store, 1, 2, 20, torch.device("cpu"), collective.Access.from_info(init))
            buckets = wbuckets.plan_buckets(metas, init["bucket_bytes"])
            result["pairs"] = dict(p for part in collective.receive(group, metas, buckets, torch.device("cpu"))
                                   for p in part)
        except Exception as exc:  # the test reads it
            result["error"] = exc

    t = threading.Thread(target=receive)
    t.start()
    hub.join("engine0")
    # The stranger lists the keys (torch's store answers anyone) and writes junk under new names
    # beside them: still nothing the group reads.
    for key in stranger.list_keys():
        stranger.set(key + "x", b"junk")
    hub.send("engine0", 1)
    t.join(30)
    assert "error" not in result, result
    assert all(torch.equal(result["pairs"][k], v) for k, v in live.items())
    read = set(receiver_store.read)
    assert read and not read & set(planted) and not any(k.endswith("x") for k in read)
    assert all(k.startswith("agentrl-weights/") for k in read)
    hub.close_all()


def test_a_value_a_stranger_writes_over_the_groups_is_refused():
    key = collective.new_key()
    store = collective.listen("127.0.0.1", 2, 5)
    sealed = collective.SealedStore(store, key)
    sealed.set("0/0", b"rank 0's address")
    sealed.set("0/1", b"rank 1's address")
    assert sealed.get("0/0") == b"rank 0's address"
    stranger = torch.distributed.TCPStore("127.0.0.1", store.port, None, False, TIMEOUT, wait_for_workers=False)
    name0, name1 = sorted(stranger.list_keys())
    stranger.set(name0, stranger.get(name1))  # replayed: a sealed value, but of another key
    with pytest.raises(PermissionError, match="'0/0'.*someone without the group's key wrote it"):
        sealed.get("0/0")
    stranger.set(name1, b"\x00" * 64)  # forged
    with pytest.raises(PermissionError, match="'0/1'"):
        sealed.get("0/1")
    # Another group's key reads nothing of this one's
    assert not collective.SealedStore(store, collective.new_key()).check(["0/0"])


def test_a_peer_that_cannot_prove_the_key_is_refused_before_any_weights_move():
    """A stranger who took a peer's connection has no key: the proof round refuses the group on every
    rank (here rank 1 holds the wrong key)."""
    store = torch.distributed.TCPStore("127.0.0.1", 0, 2, True, TIMEOUT, wait_for_workers=False)
    key, wrong = collective.new_key(), collective.new_key()
    errors: dict[int, Exception] = {}

    def rank(r: int) -> None:
        opts = torch.distributed.ProcessGroupGloo._Options()
        opts._timeout, opts._devices = TIMEOUT, [torch.distributed.ProcessGroupGloo.create_device(hostname="127.0.0.1")]
        own = store if r == 0 else torch.distributed.TCPStore("127.0.0.1", store.port, 2, False, TIMEOUT)
        group = torch.distributed.ProcessGroupGloo(torch.distributed.PrefixStore("t", own), r, 2, opts)
        try:
            collective._prove(group, r, 2, key if r == 0 else wrong, torch.device("cpu"))
        except PermissionError as exc:
            errors[r] = exc

    threads = [threading.Thread(target=rank, args=(r,)) for r in (0, 1)]
    [t.start() for t in threads]
    [t.join(30) for t in threads]
    assert set(errors) == {0, 1}
    assert "rank 1 did not prove the group's key" in str(errors[0])
    assert "rank 0 did not prove" in str(errors[1])


def test_the_key_is_handed_over_in_the_init_info_and_kept_out_of_reprs():
    from agentrl.weights.receiver import InitInfo

    hub = SenderHub("127.0.0.1", timeout_s=5, bucket_bytes=1 << 20)
    init = hub.open("engine0", 1)
    assert len(bytes.fromhex(init["secret"])) == 32 and init["local"] is True
    assert init["secret"] != hub.open("engine1", 1)["secret"]  # every group has a key of its own
    access = collective.Access.from_info(init)
    assert init["secret"] not in repr(access) and init["secret"] not in repr(InitInfo(**init))
    with pytest.raises(ValueError, match="init info has no secret"):
        collective.Access.from_info({k: v for k, v in init.items() if k != "secret"})
    hub.close_all()


def test_a_group_for_peers_on_other_nodes_listens_on_the_configured_interface():
    """`Network(local=False)`: the store on the named interface's address (here lo's, the one every
    machine has), gloo on it too; with no interface named, each rank's gloo on its address on the route
    to the sender. Either way the push lands, and nothing listens on the wildcard address."""
    for network in (collective.Network(local=False, interface="lo"), collective.Network(local=False)):
        before = listening()
        hub = SenderHub("127.0.0.1", timeout_s=20, bucket_bytes=1 << 20, network=network)
        info, _ = hub.publish(1, {"w": torch.arange(6.0)}, None)
        init = hub.open("engine0", 1)
        assert (init["local"], init["interface"]) == (False, network.interface)
        metas = wbuckets.metadata({"w": torch.zeros(6)})
        got: dict = {}

        def receive() -> None:
            group = collective.join(None, 1, 2, 20, torch.device("cpu"), collective.Access.from_info(init))
            got["w"] = next(collective.receive(group, metas, wbuckets.plan_buckets(metas, 1 << 20),
                                               torch.device("cpu")))[0][1]

        t = threading.Thread(target=receive)
        t.start()
        hub.join("engine0")
        opened = listening() - before
        hub.send("engine0", 1)
        t.join(30)
        assert torch.equal(got["w"], torch.arange(6.0))
        assert init["master_address"] == "127.0.0.1" and len(opened) == 3  # the store, two gloo listeners
        assert {ip for ip, _ in opened} == {"127.0.0.1"}
        hub.close_all()
