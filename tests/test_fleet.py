"""EngineFleet with in-memory members: routing, per-engine versions, deadline misses, restarts.

The members play an engine's part in memory (unit tests of the fleet alone); the real engines, local
and Ray actors, are exercised in tests/test_e2e_cluster.py.
"""

from __future__ import annotations

import asyncio

import pytest

from agentrl.weights.sync import EngineWeightSync
from agentrl.rollout.engine import Generation
from agentrl.rollout.fleet import EngineFleet, FleetFailed, Member


class Dead(Exception):
    pass


class MemMember(Member):
    """Serves one token stamped with its version; `die()` makes its next calls fail as a dead engine's."""

    def __init__(self, index: int, load_delay_s: float = 0.0) -> None:
        super().__init__(index)
        self.load_delay_s, self.dead, self.starts, self.loaded = load_delay_s, False, 0, []
        self.fail_starts = 0

    async def start(self) -> None:
        if self.fail_starts:
            self.fail_starts -= 1
            raise RuntimeError("could not start")
        self.starts += 1
        self.dead, self.version = False, 0

    async def generate(self, prompt_ids, max_tokens, temperature=1.0, top_p=1.0, seed=None) -> Generation:
        await asyncio.sleep(0)
        if self.dead:
            raise Dead(f"engine {self.index} is gone")
        return Generation([self.index], [-0.5], [self.version], "stop")

    async def load_weights(self, handover, version: int) -> float:
        if self.dead:
            raise Dead("gone")
        await asyncio.sleep(self.load_delay_s)
        self.loaded.append((handover, version))
        return 0.1

    async def alive(self) -> bool:
        return not self.dead

    def is_death(self, exc: BaseException) -> bool:
        return isinstance(exc, Dead)


def make(n: int, max_restarts: int = 2, **kw) -> EngineFleet:
    return EngineFleet([MemMember(i, **kw) for i in range(n)], max_restarts)


def test_episodes_stay_on_one_engine_and_new_ones_go_to_the_least_loaded():
    async def run():
        fleet = make(3)
        await fleet.start()
        async with fleet.lease() as a, fleet.lease() as b, fleet.lease() as c:
            picked = [a.member.index, b.member.index, c.member.index]
            assert sorted(picked) == [0, 1, 2]  # one live episode each
            for _ in range(3):  # every turn of an episode goes to its engine
                assert (await b.generate([1], 4)).token_ids == [b.member.index]
            async with fleet.lease() as d:  # all tied at one: any engine, then it has two
                assert d.member.episodes == 2
                async with fleet.lease() as e:
                    assert e.member is not d.member and e.member.episodes == 2
        assert [m.episodes for m in fleet.members] == [0, 0, 0]
    asyncio.run(run())


def test_each_engine_keeps_its_own_version_and_the_fleet_reports_the_oldest():
    async def run():
        fleet = make(2)
        seen = []
        fleet.on_version = seen.append
        await fleet.start()
        slow = fleet.members[1]
        slow.load_delay_s = 0.3
        sync = EngineWeightSync(None, fleet, deadline_s=0.1, publish=lambda v: (f"blob-v{v}", 10))
        await sync.push(1)
        results = await sync.drain()
        # Engine 0 serves v1 at once; engine 1 missed the deadline and still stamps v0.
        assert not results[0].ok and "deadline" in results[0].error
        assert fleet.versions() == [1, 0] and fleet.version == 0 and seen == []
        await asyncio.sleep(0.4)  # the late load lands: its version is set then, not before
        assert fleet.versions() == [1, 1] and fleet.version == 1 and seen == [1]
        slow.load_delay_s = 0.0
        await sync.push(2)
        assert (await sync.drain())[0].ok and fleet.versions() == [2, 2] and seen == [1, 2]
        gens = [await m.generate([1], 4) for m in fleet.members]
        assert [g.versions for g in gens] == [[2], [2]]
    asyncio.run(run())


def test_a_dead_engine_fails_its_episode_turns_is_restarted_and_loads_the_newest_weights():
    async def run():
        fleet = make(2)
        await fleet.start()
        await fleet.load_weights_file("blob-v3", 3)
        dying = fleet.members[0]
        async with fleet.lease() as first, fleet.lease() as second:
            lease = first if first.member is dying else second
            dying.dead = True
            with pytest.raises(Dead):
                await lease.generate([1], 4)
            assert not dying.healthy
            with pytest.raises(RuntimeError, match="died earlier"):  # the episode's later turns fail too
                await lease.generate([1], 4)
            # Meanwhile new episodes go to the healthy engine.
            async with fleet.lease() as other:
                assert other.member.index == 1
        for _ in range(50):
            await asyncio.sleep(0.01)
            if dying.healthy:
                break
        assert dying.healthy and dying.restarts == 1 and dying.starts == 2
        assert dying.loaded[-1] == ("blob-v3", 3) and dying.version == 3 and fleet.version == 3
        assert fleet.stats()["engine_restarts"] == 1
    asyncio.run(run())


def test_an_error_of_one_request_does_not_restart_a_live_engine():
    async def run():
        fleet = make(1)
        await fleet.start()
        await fleet.report_failure(fleet.members[0], ValueError("prompt too long"))
        assert fleet.members[0].healthy and fleet.members[0].restarts == 0
    asyncio.run(run())


def test_an_error_that_arrives_before_the_death_shows_still_restarts_the_engine():
    """The engine's client notices its core's exit a moment after the error that the death caused
    (a weight group's reset connection) reached the caller: asked again, the fleet restarts it."""
    async def run():
        fleet = make(1)
        await fleet.start()
        member = fleet.members[0]
        await fleet.load_weights_file("blob-v2", 2)
        await fleet.report_failure(member, RuntimeError("Connection reset by peer"))
        assert member.healthy  # still alive when asked
        await asyncio.sleep(0.2)
        member.dead = True  # the client sees the exit now
        await fleet.wait_restarts()
        assert member.healthy and member.restarts == 1 and member.starts == 2 and member.version == 2
        # A second error while it is alive, and it stays so: looked at again, never restarted.
        await fleet.report_failure(member, ValueError("prompt too long"))
        await fleet.wait_restarts()
        assert member.restarts == 1
    asyncio.run(run())


def test_a_request_of_a_replaced_engine_life_failing_late_does_not_restart_the_new_one():
    """Two turns in flight when the engine dies: the first error restarts it; the second reaches its
    episode only after the restart, and is the old life's, not the new engine's."""
    async def run():
        fleet = make(1)
        await fleet.start()
        member = fleet.members[0]
        async with fleet.lease() as early, fleet.lease() as late:
            member.dead = True
            with pytest.raises(Dead):
                await early.generate([1], 4)
            await fleet.wait_restarts()
            assert member.healthy and member.restarts == 1
            # The late turn began on the old life and its error arrives now.
            await fleet.report_failure(member, Dead("gone"), member.epoch - 1)
            await fleet.wait_restarts()
            assert member.healthy and member.restarts == 1 and member.starts == 2
            assert (await late.generate([1], 4)).token_ids == [0]  # its next turn runs on the new life
    asyncio.run(run())


def test_an_engine_that_keeps_dying_fails_the_fleet_with_a_clear_error():
    async def run():
        fleet = make(1, max_restarts=1)
        await fleet.start()
        m = fleet.members[0]
        m.fail_starts = 5  # every restart fails
        m.dead = True
        await fleet.report_failure(m, Dead("gone"))
        with pytest.raises(FleetFailed, match="engine 0 died 2 times .*max_engine_restarts=1"):
            async with asyncio.timeout(5):
                async with fleet.lease():
                    pass
        assert fleet.failed.done()
    asyncio.run(run())


def test_an_engine_that_cannot_come_back_is_retired_and_the_others_go_on(caplog):
    """Engine 1's restarts all fail (its node is gone, none other can hold it): it is retired, said so,
    and the run goes on with engine 0: new episodes, pushes and the reported version are engine 0's, no
    push names the retired engine. Engine 0 dying for good then ends the fleet: none is left."""
    async def run():
        fleet = make(2, max_restarts=2)
        await fleet.start()
        gone = fleet.members[1]
        gone.fail_starts, gone.dead = 10, True
        with caplog.at_level("ERROR", logger="agentrl.rollout.fleet"):
            await fleet.report_failure(gone, Dead("node lost"))
            await fleet.wait_restarts()
        assert gone.retired and not gone.healthy and gone.restarts == 2 and not fleet.failed.done()
        assert "going on with 1 of 2 engines (engine 1 retired)" in caplog.text
        for _ in range(4):
            async with fleet.lease() as engine:
                assert (await engine.generate([1], 1)).token_ids == [0]
        assert await fleet.load_weights_file("blob", 1) == 0.1  # no "engine 1: restarting" error
        assert fleet.version == 1 and fleet.stats()["engines_retired"] == [1]
        last = fleet.members[0]
        last.fail_starts, last.dead = 10, True
        await fleet.report_failure(last, Dead("gone too"))
        with pytest.raises(FleetFailed, match="engine 0 died 3 times"):
            await fleet.wait_restarts()
        assert not last.retired
    asyncio.run(run())


def test_a_push_skips_a_restarting_engine_and_names_it():
    async def run():
        fleet = make(2)
        await fleet.start()
        fleet.members[1].healthy = False
        with pytest.raises(RuntimeError, match="engine 1: restarting"):
            await fleet.load_weights_file("blob", 1)
        assert fleet.versions() == [1, 0]
        assert fleet.version == 1  # the oldest version a healthy engine serves
    asyncio.run(run())


def test_a_restart_whose_weights_are_replaced_meanwhile_loads_the_newer_ones():
    """The learner keeps only the newest handover: a push that lands while a restarted engine reads
    the previous one releases it; the engine then loads the newer one, and that is not a death."""
    async def run():
        fleet = make(1)
        await fleet.start()
        m = fleet.members[0]
        await fleet.load_weights_file("blob-v1", 1)
        original = m.load_weights

        async def racing_load(handover, version):
            if handover == "blob-v1":
                fleet._latest = ("blob-v2", 2)  # a push landed and released blob-v1
                raise FileNotFoundError(handover)
            return await original(handover, version)

        m.load_weights = racing_load
        m.dead = True
        await fleet.report_failure(m, Dead("gone"))
        await fleet.wait_restarts()
        assert m.healthy and m.restarts == 1 and m.version == 2 and m.loaded[-1] == ("blob-v2", 2)
    asyncio.run(run())


def test_a_load_begun_on_an_engine_life_a_restart_replaced_does_not_restart_the_new_one():
    """A push's load hangs on an engine that died; the fleet restarts it (and the restart catches up).
    When the old load finally fails, its failure is the old engine's: the new one stays, restarted once."""
    async def run():
        fleet = make(1)
        await fleet.start()
        m = fleet.members[0]
        original, gate, calls = m.load_weights, asyncio.Event(), []

        async def hung_then_dead(handover, version):
            calls.append(handover)
            if len(calls) == 1:  # the load begun on the engine that is about to die
                await gate.wait()
                raise Dead("gone")
            return await original(handover, version)

        m.load_weights = hung_then_dead
        push = asyncio.ensure_future(fleet.load_weights_file("blob-v1", 1))
        await asyncio.sleep(0.01)
        m.dead = True
        await fleet.report_failure(m, Dead("gone"))
        await fleet.wait_restarts()
        assert m.healthy and m.restarts == 1 and m.version == 1  # caught up on the restarted engine
        gate.set()  # the old life's load fails now
        with pytest.raises(RuntimeError, match="engine 0: Dead"):
            await push
        await asyncio.sleep(0.01)
        await fleet.wait_restarts()
        assert m.healthy and m.restarts == 1 and fleet.stats()["engine_restarts"] == 1
    asyncio.run(run())


def test_a_late_close_from_the_life_before_a_restart_leaves_the_new_group_alone():
    """An engine dies during a collective load; the fleet restarts it, and the new life joins a new
    group. The failed load's clean-up (`close` of its group) reaches the hub only after that: it must
    drop the dead life's group, not the one the new life just opened (which made the new life's join
    fail with KeyError and cost a second restart once restarts took 2 s)."""
    from agentrl.weights.load import join

    class Hub:  # SenderHub's bookkeeping of groups by key
        def __init__(self):
            self.endpoints: dict[str, str] = {}

        async def call(self, method, key, *args):
            if method == "open":
                self.endpoints[key] = "group"
                return {}
            if method == "join":
                return self.endpoints[key]  # KeyError for a dropped group, as SenderHub.join
            assert method == "close", method
            self.endpoints.pop(key, None)

    class Joining(Member):
        async def join_weight_group(self, init_info):
            pass

    async def run():
        hub, m = Hub(), Joining(0)
        old = await join(m, hub.call)
        m.epoch += 1  # restarted (the fleet's _restart)
        new = await join(m, hub.call)
        await hub.call("close", old)  # the dead life's failed load cleans up late
        assert new != old and list(hub.endpoints) == [new]
        assert await join(m, hub.call) == new and m.group == m.epoch  # joined: no new group
    asyncio.run(run())


def test_a_collective_load_closed_with_its_loop_closes_without_awaiting():
    """A load still waiting when its task is destroyed (the loop ends, or the task is collected) is
    closed by GeneratorExit; its clean-up must not await, or the close becomes a RuntimeError that the
    fleet would read as an engine failure."""
    from agentrl.weights.load import load_into

    class Hanging(Member):
        async def stage_weights(self, update_info):
            pass

        async def load_weights_collective(self, update_info, version):
            await asyncio.Event().wait()

    class Handover:
        update_info: dict = {}
        closed = 0

        async def call(self, method, *args):
            if method == "close":
                Handover.closed += 1
            elif method == "send":
                await asyncio.Event().wait()
            return {}

    async def run():
        m = Hanging(0)
        m.group = m.epoch  # joined already
        coro = load_into(m, Handover(), 1)
        task = asyncio.ensure_future(coro)
        await asyncio.sleep(0.01)
        return task, coro

    loop = asyncio.new_event_loop()
    task, coro = loop.run_until_complete(run())
    coro.close()  # what destroying the pending task does; raises RuntimeError if the clean-up awaits
    assert Handover.closed == 0
    loop.close()


def test_an_engine_outside_this_process_streams_its_turn_in_one_piece_and_reports_its_death():
    async def run():
        fleet = make(2)
        await fleet.start()
        async with fleet.lease() as engine:
            chunks = [g async for g in engine.stream([1], 4)]
            assert [(g.token_ids, g.versions, g.finish_reason) for g in chunks] == [([engine.member.index], [0], "stop")]
            engine.member.dead = True
            with pytest.raises(Dead):
                [g async for g in engine.stream([1], 4)]
            assert not engine.member.healthy  # reported to the fleet, which restarts it
        await fleet.wait_restarts()
        assert all(m.healthy for m in fleet.members)
    asyncio.run(run())


def test_a_ray_engine_dies_only_of_its_own_actor_error():
    """A collective load waits on learner rank 0's hub: when that rank's node dies the load fails with
    the rank's RayActorError, which must not restart the engine (it happened once: both engines of a
    run whose learner node died were torn down as dead). The engine's own actor error is its death."""
    from ray.exceptions import ActorDiedError, ActorUnavailableError

    from agentrl.rollout.members import RayMember

    class Handle:
        _actor_id = type("Id", (), {"hex": lambda self: "aa" * 16})()

    member = RayMember(0, actor=Handle())
    mine = ActorUnavailableError("socket closed", bytes.fromhex("aa" * 16))
    hub = ActorUnavailableError("socket closed", bytes.fromhex("bb" * 16))
    assert member.is_death(mine) and not member.is_death(hub)
    assert member.is_death(ActorDiedError())  # no actor named: the call was this engine's
    assert not member.is_death(RuntimeError("one request failed"))


def test_engines_and_ranks_ask_for_the_custom_resources_that_place_them():
    """cluster.engine_resources / learner_resources go into each actor's options and into what the
    cluster must hold; engines spread over nodes."""
    from agentrl.run.cluster import needed
    from agentrl.config import ClusterConfig
    from agentrl.rollout.ray_engine import actor_options

    cluster = ClusterConfig(backend="ray", engines=2, engine_num_cpus=1.0, engine_num_gpus=0.0, learner_ranks=3,
                            learner_num_cpus=2.0, learner_num_gpus=0.0, engine_resources={"engine_node": 1},
                            learner_resources={"learner_node": 0.5})
    assert needed(cluster) == {"CPU": 8.0, "GPU": 0.0, "engine_node": 2.0, "learner_node": 1.5}
    opts = actor_options(cluster, 1, frozenset(), ["n1", "n2"])
    assert opts["resources"] == {"engine_node": 1} and opts["scheduling_strategy"] == "SPREAD"
    assert opts["runtime_env"] == {"env_vars": {"CUDA_VISIBLE_DEVICES": ""}}
    cluster.engine_resources, cluster.learner_resources = {}, {}  # none asked for: nothing asked
    assert needed(cluster) == {"CPU": 8.0, "GPU": 0.0} and "resources" not in actor_options(cluster, 0, frozenset(), ["n1"])
    # Its node gone and no other able to hold it (a restart): a clear error, which the fleet counts as a
    # failed restart (and retires the engine when others are left), not an actor pending for ever.
    with pytest.raises(RuntimeError, match=r"no live node of the Ray cluster can hold engine 1 \(it asks for 1 CPU"):
        actor_options(cluster, 1, frozenset(), [])


def test_a_cancelled_ray_generation_cancels_the_actor_s_task(monkeypatch):
    """A client that leaves (or a deadline) cancels the await on a Ray engine's generate: the actor's
    task is cancelled too (ray.cancel of its reference), so vLLM aborts the request rather than
    generating for nobody; a generation that finishes is returned and cancels nothing."""
    import ray

    from agentrl.rollout.members import RayMember

    cancelled = []
    monkeypatch.setattr(ray, "cancel", lambda ref, **kw: cancelled.append(ref))

    class Ref:
        def __init__(self, delay: float) -> None:
            self.delay = delay

        def __await__(self):
            return asyncio.sleep(self.delay, result=Generation([7], [-0.1], [0], "stop")).__await__()

    class Actor:
        class generate:  # noqa: N801 (Ray's `actor.method.remote(...)` shape)
            delay = 0.0

            @classmethod
            def remote(cls, *args):
                return Ref(cls.delay)

    async def run():
        member = RayMember(0, actor=Actor())
        assert (await member.generate([1], 4)).token_ids == [7] and cancelled == []
        Actor.generate.delay = 60.0
        task = asyncio.ensure_future(member.generate([1], 4))
        await asyncio.sleep(0.05)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert len(cancelled) == 1 and cancelled[0].delay == 60.0
    asyncio.run(run())


def test_engine_capacity_counts_what_the_live_nodes_can_hold(monkeypatch):
    """By each live node's totals against one engine's ask: the loss of a node drops it below the engines
    a run keeps, and the fleet then fails that restart at once (and retires the engine) rather than
    leaving its actor pending for cluster.start_timeout_s per restart."""
    import ray

    from agentrl.config import ClusterConfig
    from agentrl.rollout.ray_engine import engine_capacity

    nodes = [{"NodeID": "head", "Alive": True, "Resources": {"CPU": 1.0}},
             {"NodeID": "L", "Alive": True, "Resources": {"CPU": 1.0, "learner_node": 1.0}},
             {"NodeID": "E1", "Alive": False, "Resources": {"CPU": 1.0, "engine_node": 1.0}},
             {"NodeID": "E2", "Alive": True, "Resources": {"CPU": 3.0, "engine_node": 2.0}}]
    monkeypatch.setattr(ray, "nodes", lambda: nodes)
    cluster = ClusterConfig(backend="ray", engines=2, engine_resources={"engine_node": 1})
    assert engine_capacity(cluster) == 2  # E2 only: E1 is gone, the others offer no engine_node
    assert engine_capacity(cluster, frozenset({"E2"})) == 0
    assert engine_capacity(ClusterConfig(backend="ray", engine_num_cpus=0.5)) == 2 + 2 + 6
    assert engine_capacity(ClusterConfig(backend="ray", engine_num_cpus=0)) == float("inf")
