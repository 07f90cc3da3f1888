"""`cluster.interface`: where a Ray run's groups listen when its nodes are several machines. The
actors' gloo/NCCL interface comes from the job's runtime environment (agentrl.run.cluster.network_env), the
learner ranks' rendezvous and the weight hub bind the interface's address (agentrl.learner.ray_ranks)."""

from __future__ import annotations

import os

import pytest

from agentrl.weights import collective
from agentrl.run.cluster import ClusterError, network_env
from agentrl.config import ClusterConfig, load_config


def test_a_named_interface_is_where_every_actor_s_gloo_and_nccl_listen():
    cfg = ClusterConfig(backend="ray", address="auto", interface="lo")
    assert network_env(cfg) == {"GLOO_SOCKET_IFNAME": "lo", "NCCL_SOCKET_IFNAME": "lo"}


def test_a_ray_of_our_own_on_loopback_keeps_nccl_on_loopback_and_a_joined_one_leaves_nccl_its_choice():
    """A local Ray bound to 127.0.0.1 has every node on this machine; a cluster joined by address with
    no interface named may span machines, where NCCL's own choice of interface can reach them (lo
    would not), so nothing is set."""
    assert network_env(ClusterConfig(backend="ray")) == {"GLOO_SOCKET_IFNAME": "lo", "NCCL_SOCKET_IFNAME": "lo"}
    assert network_env(ClusterConfig(backend="ray", address="auto")) == {}
    assert network_env(ClusterConfig(backend="ray", bind_host="0.0.0.0")) == {}


def test_an_interface_this_node_lacks_is_a_start_up_error_naming_the_ones_it_has():
    with pytest.raises(ClusterError, match=r"cluster.interface: network interface 'eth9x' does not exist on "
                                           r"this node \(it has: .*\blo\b"):
        network_env(ClusterConfig(backend="ray", address="auto", interface="eth9x"))


def test_the_interface_key_is_validated_where_the_config_is_loaded(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("cluster:\n  interface: 'eth0; rm -rf /'\n")
    with pytest.raises(Exception, match="cluster.interface"):
        load_config(str(path))


def test_the_hub_and_the_rendezvous_bind_the_named_interface_s_address(monkeypatch):
    """ray_ranks.node_address: the interface's address when one is named (without asking Ray), so rank
    0's store and the weight groups listen there and nowhere else; the hub's groups are then not local
    (peers on other nodes) and name the interface for gloo and NCCL."""
    from agentrl.learner import ray_ranks

    assert ray_ranks.node_address("lo") == "127.0.0.1"
    hub = ray_ranks.LearnerRank(0, 1, 1)
    monkeypatch.setattr(ray_ranks, "node_address", lambda interface: "127.0.0.1" if interface else "192.0.2.7")
    hub.open_hub(30.0, 1 << 20, "lo")
    assert (hub.hub.host, hub.hub.network) == ("127.0.0.1", collective.Network(local=True, interface="lo"))
    hub.open_hub(30.0, 1 << 20, "")
    assert (hub.hub.host, hub.hub.network) == ("192.0.2.7", collective.Network(local=False, interface=""))


def test_ray_s_token_file_is_made_private_and_a_readable_one_narrowed(tmp_path, monkeypatch, caplog):
    """agentrl.run.cluster.keep_token_private, before a local Ray starts: the token Ray would write 0644 is
    written 0600 (Ray then reads it, as its own); one this user left readable by others becomes 0600."""
    from agentrl.run.cluster import keep_token_private

    monkeypatch.delenv("RAY_AUTH_MODE", raising=False)
    monkeypatch.delenv("RAY_AUTH_TOKEN", raising=False)
    token = tmp_path / "ray" / "auth_token"
    keep_token_private(token)
    assert token.stat().st_mode & 0o777 == 0o600 and len(token.read_text()) == 64
    first = token.read_text()
    keep_token_private(token)
    assert token.read_text() == first  # an existing token is kept: a running cluster may use it
    token.chmod(0o644)
    with caplog.at_level("WARNING", logger="agentrl.run.cluster"):
        keep_token_private(token)
    assert token.stat().st_mode & 0o777 == 0o600 and "readable by you only" in caplog.text
    monkeypatch.setenv("RAY_AUTH_MODE", "disabled")  # no token auth: nothing made
    keep_token_private(tmp_path / "none")
    assert not (tmp_path / "none").exists()


def test_a_token_path_that_is_a_symbolic_link_is_refused_and_its_target_left_alone(tmp_path, monkeypatch):
    """keep_token_private changes the mode of the token file itself, never of a file a link there points at
    (say another program's config, readable on purpose); a dangling link is refused too, and nothing is made
    where it points."""
    from agentrl.run.cluster import keep_token_private

    monkeypatch.delenv("RAY_AUTH_MODE", raising=False)
    monkeypatch.delenv("RAY_AUTH_TOKEN", raising=False)
    target = tmp_path / "shared.conf"
    target.write_text("public\n")
    target.chmod(0o644)
    token = tmp_path / "ray" / "auth_token"
    token.parent.mkdir()
    token.symlink_to(target)
    with pytest.raises(ClusterError, match=rf"^{token} is a symbolic link \(to {target}\); agentrl does not follow "
                                           r"it to change a file's mode"):
        keep_token_private(token)
    assert target.stat().st_mode & 0o777 == 0o644 and target.read_text() == "public\n"
    token.unlink()
    token.symlink_to(tmp_path / "nowhere")
    with pytest.raises(ClusterError, match="is a symbolic link"):
        keep_token_private(token)
    assert not (tmp_path / "nowhere").exists()


def test_nccl_stays_on_loopback_in_a_local_process_and_a_ray_actor_keeps_what_its_start_chose(monkeypatch):
    """keep_gloo_on_loopback (a one-process learner, the vLLM plugin): NCCL on lo where every peer is on
    this node; in a run's Ray actor (AGENTRL_RAY_ACTOR, set by agentrl.run.cluster.connect) NCCL is left to the
    runtime environment network_env chose, since its weight groups may reach other nodes."""
    monkeypatch.setenv("GLOO_SOCKET_IFNAME", "before")  # restored after the test
    monkeypatch.delenv("NCCL_SOCKET_IFNAME", raising=False)
    monkeypatch.delenv(collective.RAY_ACTOR, raising=False)
    collective.keep_gloo_on_loopback()
    assert (os.environ["GLOO_SOCKET_IFNAME"], os.environ["NCCL_SOCKET_IFNAME"]) == ("lo", "lo")
    monkeypatch.delenv("NCCL_SOCKET_IFNAME")
    monkeypatch.setenv(collective.RAY_ACTOR, "1")
    collective.keep_gloo_on_loopback()
    assert os.environ["GLOO_SOCKET_IFNAME"] == "lo" and "NCCL_SOCKET_IFNAME" not in os.environ
