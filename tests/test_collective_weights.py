"""The collective weight path (agentrl.weights.collective, weights/push.py, weights/receiver.py):
the bucket plan against hand-computed offsets, a real gloo group on loopback carrying a snapshot
bit-exactly and never aliasing the live weights, bounded waits for a peer that never comes; and with a
real vLLM engine: an engine core killed mid-push restarted into a new group, a push whose sender
never sends failing at its deadline with the next one landing, logprobs then equal to the learner's.
(SmolLM2's logprobs through both transports: tests/test_e2e.py::test_vllm_logprobs_match_learner_after_push.)"""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import time

import psutil
import pytest
import torch

from agentrl.weights import buckets as wbuckets, collective
from agentrl.weights.push import LocalHub, SenderHub, pack_snapshot


def metas_of(*specs):
    return [wbuckets.TensorMeta(n, d, s) for n, d, s in specs]


def test_bucket_plan_packs_aligned_and_sends_a_large_tensor_alone():
    metas = metas_of(("a", "float32", (3,)), ("b", "float32", (10,)), ("c", "bfloat16", (100,)),
                     ("d", "float32", (7,)))
    # a: 12 bytes at 0; b: 40 bytes at 64 (aligned) -> 104; c: 200 bytes would end at 128+200=328 > 256,
    # so a new bucket; c alone is 200 <= 256; d: 28 bytes at 256 ends at 284 > 256 -> own bucket.
    plan = wbuckets.plan_buckets(metas, 256)
    assert plan == [wbuckets.Bucket(0, 2, (0, 64), 104), wbuckets.Bucket(2, 3, (0,), 200),
                    wbuckets.Bucket(3, 4, (0,), 28)]
    # A tensor larger than the bucket size travels alone.
    assert wbuckets.plan_buckets(metas_of(("x", "float32", (1000,)), ("y", "float32", (1,))), 256) == [
        wbuckets.Bucket(0, 1, (0,), 4000), wbuckets.Bucket(1, 2, (0,), 4)]


def test_pack_then_unpack_gives_the_tensors_back():
    state = {"w": torch.randn(5, 3), "b": torch.randn(3), "h": torch.randn(4).to(torch.bfloat16)}
    metas = wbuckets.metadata(state)
    (bucket,) = wbuckets.plan_buckets(metas, 1 << 20)
    out = dict(wbuckets.unpack(wbuckets.pack(list(state.values()), bucket), metas, bucket))
    for k, v in state.items():
        assert out[k].dtype == v.dtype and torch.equal(out[k], v)


def receive_in_thread(init: dict, metas, result: dict) -> threading.Thread:
    def run() -> None:
        try:
            group = collective.join(None, 1, init["world_size"], init["timeout_s"], torch.device("cpu"),
                                    collective.Access.from_info(init))
            buckets = wbuckets.plan_buckets(metas, init["bucket_bytes"])
            result["pairs"] = [p for part in collective.receive(group, metas, buckets, torch.device("cpu"))
                               for p in part]
        except Exception as exc:  # the test reads it
            result["error"] = exc

    t = threading.Thread(target=run)
    t.start()
    return t


def test_a_snapshot_crosses_a_gloo_group_bit_exactly_and_never_aliases_the_live_weights():
    live = {"embed": torch.randn(64, 16), "norm": torch.randn(16), "big": torch.randn(300, 100)}
    hub = SenderHub("127.0.0.1", timeout_s=30, bucket_bytes=8 << 10)  # 8 KiB: 'big' (120 KB) goes alone
    info, nbytes = hub.publish(1, live, dtype=None)
    assert nbytes == (64 * 16 + 16 + 300 * 100) * 4
    expected = {k: v.clone() for k, v in live.items()}
    for v in live.values():  # the learner's next step changes its weights while the push is under way
        v.add_(1.0)
    init = hub.open("engine0", 1)
    metas = [wbuckets.TensorMeta(n, d, tuple(s)) for n, d, s in zip(info["names"], info["dtype_names"],
                                                                      info["shapes"])]
    result: dict = {}
    t = receive_in_thread(init, metas, result)
    hub.join("engine0")
    hub.send("engine0", 1)
    t.join(30)
    assert "error" not in result
    got = dict(result["pairs"])
    assert got.keys() == expected.keys()
    for k, v in expected.items():
        assert torch.equal(got[k], v), k
    hub.close_all()


def test_snapshot_is_cast_to_the_engine_dtype():
    state = {"w": torch.tensor([1.0, 2.5, -3.0]), "v": torch.tensor([0.1])}
    snap = pack_snapshot(state, torch.bfloat16, 1 << 20)
    assert [m.dtype for m in snap.metas] == ["bfloat16", "bfloat16"] and snap.nbytes == 8
    (bucket,) = wbuckets.plan_buckets(snap.metas, 1 << 20)
    out = dict(wbuckets.unpack(snap.buffers[0], snap.metas, bucket))
    assert torch.equal(out["w"], state["w"].to(torch.bfloat16))


def test_waits_for_a_peer_that_never_comes_are_bounded():
    hub = SenderHub("127.0.0.1", timeout_s=2, bucket_bytes=1 << 20)
    hub.open("engine0", 1)
    t0 = time.monotonic()
    with pytest.raises(Exception):
        hub.join("engine0")  # no receiver ever joins
    assert time.monotonic() - t0 < 30
    # A receiver whose sender joins but never sends: its receive fails after the group's timeout.
    hub.publish(1, {"w": torch.ones(4)}, None)
    init = hub.open("engine1", 1)
    result: dict = {}
    t = receive_in_thread(init, wbuckets.metadata({"w": torch.ones(4)}), result)
    hub.join("engine1")
    t.join(60)
    assert not t.is_alive() and "error" in result
    hub.close_all()


# -- with a real vLLM engine --------------------------------------------------------------------


def fixed_sequence(tok) -> list[int]:
    seq = tok.apply_chat_template([{"role": "user", "content": "Guess my number from 1 to 15."},
                                   {"role": "assistant", "content": "8"}, {"role": "user", "content": "Lower."},
                                   {"role": "assistant", "content": "4"}], tokenize=False)
    return tok.encode(seq, add_special_tokens=False)


async def stepped_learner(model_dir: str, tok, ids: list[int], before: list[float], lr: float):
    """A learner one step away from the engine's weights, and a probe batch of `ids`."""
    from agentrl.config import AlgoConfig, LearnerConfig
    from agentrl.learner.rl import Learner
    from agentrl.learner.spec import LearnerSpec
    from agentrl.types import Episode, TrainBatch

    learner = await asyncio.to_thread(Learner, LearnerSpec(model_dir, LearnerConfig(lr=lr), AlgoConfig(), 2))
    eps = []
    for reward in (1.0, 0.0):
        ep = Episode(task_id="t", group_id=0, reward=reward)
        ep.append(ids[:-3], generated=False)
        ep.append(ids[-3:], generated=True, logprobs=before[-3:], versions=[0, 0, 0])
        eps.append(ep)
    await asyncio.to_thread(learner.step, TrainBatch.from_episodes(eps, torch.tensor([1.0, -0.5]), tok.pad_token_id))
    probe = TrainBatch.from_episodes(eps[:1], torch.zeros(1), tok.pad_token_id)
    probe.loss_mask[:] = 1.0
    return learner, probe


def max_diff(a: list[float], b: list[float]) -> float:
    return max(abs(x - y) for x, y in zip(a, b))


async def local_setup(model_dir: str, deadline_s: float = 60.0):
    from agentrl.data.chat import load_tokenizer
    from agentrl.config import ClusterConfig, EngineConfig
    from agentrl.weights.sync import EngineWeightSync
    from agentrl.rollout.fleet import EngineFleet
    from agentrl.run.startup import pick_transport

    tok = load_tokenizer(model_dir)
    fleet = EngineFleet.local(model_dir, EngineConfig(max_num_seqs=8), tok.eos_token_id, ClusterConfig())
    await fleet.start()
    ids = fixed_sequence(tok)
    before = await fleet.members[0].engine.prompt_logprobs(ids)
    learner, probe = await stepped_learner(model_dir, tok, ids, before, lr=1e-4)
    hub = LocalHub(lambda: learner.state_dict_cpu(clone=False), None, deadline_s, 1 << 20)
    publish = await pick_transport("collective", fleet, hub)
    assert publish is not None and fleet.transport == "collective"
    sync = EngineWeightSync(None, fleet, deadline_s, publish=publish)
    return fleet, hub, sync, learner, probe, ids, before


def test_an_engine_killed_mid_push_is_restarted_into_a_new_group_and_a_silent_sender_misses_its_deadline(
        model_dir):
    """Push 1 lands. Push 2: the engine core is killed after the receivers started and before the
    learner sends: the push fails, the engine restarts, joins a new group and loads version 2. Push 3:
    the sender never sends: the push fails at its 4 s deadline, nothing hangs, and push 4 lands
    through a new group with logprobs equal to the learner's."""
    async def main() -> None:
        fleet, hub, sync, learner, probe, ids, _ = await local_setup(model_dir, deadline_s=4.0)
        member = fleet.members[0]
        real_send = hub.hub.send
        try:
            await sync.push(1)
            assert [r.ok for r in await sync.landed()] == [True]

            def kill_then_send(key: str, version: int) -> float:
                core = [p for p in psutil.Process().children(recursive=True)
                        if " ".join(p.cmdline()).startswith("VLLM::EngineCore")]
                assert core
                for p in core:
                    os.kill(p.pid, signal.SIGKILL)
                return real_send(key, version)

            hub.hub.send = kill_then_send
            await sync.push(2)
            (failed,) = await sync.landed()
            hub.hub.send = real_send
            assert not failed.ok
            for _ in range(240):  # the failed load reports the death once the sender's side has ended too
                if member.restarts and not fleet._restarts:
                    break
                await asyncio.sleep(0.5)
            await fleet.wait_restarts()
            assert member.restarts == 1 and fleet.versions() == [2] and member.group == member.epoch

            hub.hub.send = lambda key, version: time.sleep(8) or 0.0  # joins, never broadcasts
            t0 = time.monotonic()
            await sync.push(3)
            (late,) = await sync.landed()
            assert not late.ok and "deadline" in late.error and time.monotonic() - t0 < 30
            hub.hub.send = real_send
            for _ in range(60):  # the shielded load ends once the receivers' group times out
                if member.load_lock.locked() is False:
                    break
                await asyncio.sleep(0.5)
            await sync.push(4)
            (landed,) = await sync.drain()
            assert landed.ok and fleet.versions() == [4], landed
            after = await member.engine.prompt_logprobs(ids)
            assert max_diff(after, learner.logprobs(probe)[0, 1:len(ids)].tolist()) < 1e-4
            assert member.restarts == 1  # the missed deadline lost no weights: no second restart
        finally:
            await fleet.shutdown()

    asyncio.run(main())


def test_the_newest_snapshot_outlives_its_release_until_the_hub_closes():
    """A restarted engine catches up on the newest push, even once the run has released it."""
    hub = SenderHub("127.0.0.1", timeout_s=5, bucket_bytes=1 << 20)
    for v in (1, 2):
        hub.publish(v, {"w": torch.full((2,), float(v))}, None)
    hub.release(1)
    hub.release(2)
    assert list(hub.snapshots) == [2]
    hub.close_all()
    assert hub.snapshots == {}


def test_a_held_snapshot_outlives_its_release_until_its_send_ends():
    """An engine catching up after a restart holds the version it read; a newer push releasing that
    version meanwhile must not leave its receivers waiting for a broadcast that never comes."""
    hub = SenderHub("127.0.0.1", timeout_s=5, bucket_bytes=1 << 20)
    for v in (1, 2):
        hub.publish(v, {"w": torch.full((2,), float(v))}, None)
    assert hub.hold("engine0", 1)
    hub.publish(3, {"w": torch.full((2,), 3.0)}, None)
    hub.release(1)  # the push of v3 landed and released v1 (and v2), but engine0 is about to send v1
    hub.release(2)
    assert sorted(hub.snapshots) == [1, 3]
    assert not hub.hold("engine1", 2)  # gone: the caller loads a newer version instead
    hub.close("engine0")  # its load ended (here: failed; a finished send ends the hold the same way)
    assert sorted(hub.snapshots) == [3]
    with pytest.raises(RuntimeError, match="v1 were released"):
        hub.endpoints["engine0"] = type("E", (), {"group": None})()
        hub.send("engine0", 1)
    hub.close_all()
