"""N vLLM engines behind one `GenerateFn`: in this process (`LocalMember`) or as Ray actors (`RayMember`).

Routing. `lease()` pins an episode to one engine for all its turns, so each turn's prompt hits that
engine's prefix cache; a new episode goes to the healthy engine with the fewest live episodes.

Versions. Each engine has its own policy version: a weight push loads every healthy engine in
parallel, and an engine that misses the push deadline or fails keeps the version it serves (a load
that finishes late sets its version then: the stamp is never ahead of the weights, nor behind once
they are loaded). Tokens are stamped inside each engine by the version it serves. `version` is the
oldest version a healthy engine serves, the `E` the staleness buffer admits against; it never goes
down, because an engine rejoins only after loading the newest weights.

Faults. An engine that dies (its vLLM core or its Ray actor) fails the turns in flight on it, which
end their episodes with status `engine_error`; it is restarted, loads the newest weights, and takes
new episodes again. An engine that dies more than `max_restarts` times (or whose restarts fail that
often: its node is gone and no other can hold it) is retired while other engines are left, and the
run goes on with fewer, saying so; the last engine's failure sets `failed`, which ends the run.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from typing import Any, AsyncIterator, Callable

from agentrl.config import ClusterConfig, EngineConfig
from agentrl.weights.load import load_into
from agentrl.rollout.engine import Generation
from agentrl.rollout.failing import FailOnce
from agentrl.rollout.members import LocalMember, Member, RayMember

log = logging.getLogger(__name__)

# Seconds between the looks at an engine that reported an error but still said it was alive
# (`EngineFleet.report_failure`): vLLM's client notices a core's exit within a moment, well inside 7.5 s.
DEATH_RECHECK_S = (0.5, 1.0, 2.0, 4.0)


class FleetFailed(RuntimeError):
    """Every engine died more often than `cluster.max_engine_restarts` allows, or one could not start."""


def on_node(member: Member) -> str:
    """' on node <id>' for a Ray engine (where it runs, or ran), '' for one in this process."""
    node = member.where.get("node_id")
    return f" on node {node[:12]}" if node else ""


class _Leased:
    """The `GenerateFn` an episode sees: one engine, with its failures reported to the fleet."""

    def __init__(self, fleet: "EngineFleet", member: Member) -> None:
        self.fleet, self.member = fleet, member

    async def generate(self, prompt_ids: list[int], max_tokens: int, temperature: float = 1.0,
                       top_p: float = 1.0, seed: int | None = None) -> Generation:
        member, epoch = self.member, self.member.epoch
        if not member.healthy:
            raise RuntimeError(f"engine {member.index} died earlier in this episode")
        try:
            return await member.generate(prompt_ids, max_tokens, temperature, top_p, seed)
        except Exception as exc:
            await self.fleet.report_failure(member, exc, epoch)
            raise

    async def stream(self, prompt_ids: list[int], max_tokens: int, temperature: float = 1.0,
                     top_p: float = 1.0, seed: int | None = None) -> AsyncIterator[Generation]:
        """`generate` as it happens (`Member.stream`: a Ray engine's turn comes in one piece)."""
        member, epoch = self.member, self.member.epoch
        if not member.healthy:
            raise RuntimeError(f"engine {member.index} died earlier in this episode")
        try:
            async for delta in member.stream(prompt_ids, max_tokens, temperature, top_p, seed):
                yield delta
        except Exception as exc:
            await self.fleet.report_failure(member, exc, epoch)
            raise


class EngineFleet:
    """The engines of a run. Start with `await fleet.start()`; end with `await fleet.shutdown()`."""

    def __init__(self, members: list[Member], max_restarts: int) -> None:
        self.members, self.max_restarts = members, max_restarts
        self.on_version: Callable[[int], None] | None = None  # told each new oldest-served version
        self._failed = FailOnce()
        self._version = 0
        self._latest: tuple[Any, int] | None = None  # the newest weights pushed: restarts load them
        self._healthy = asyncio.Event()
        self._restarts: set[asyncio.Task] = set()
        self._confirming: set[int] = set()  # members whose error is being looked at again (report_failure)
        self._rotate = 0
        self.transport = "file"  # how weights reach the engines: "collective" once pick_transport joins them
        self.closers: list[Callable[[], None]] = []  # run at shutdown, after the engines stop (a weight hub)

    @property
    def failed(self) -> asyncio.Future:
        """Gets FleetFailed once no engine is left (each died more than `max_restarts` times)."""
        return self._failed.future

    @classmethod
    def local(cls, model_path: str, cfg: EngineConfig, eos_id: int, cluster: ClusterConfig) -> "EngineFleet":
        members = [LocalMember(i, model_path=model_path, cfg=cfg, eos_id=eos_id) for i in range(cluster.engines)]
        return cls(members, cluster.max_engine_restarts)

    @classmethod
    def ray(cls, model_path: str, cfg: EngineConfig, eos_id: int, cluster: ClusterConfig,
            avoid_nodes: frozenset[str] = frozenset()) -> "EngineFleet":
        """Engines as Ray actors (Ray must be connected: `agentrl.run.cluster.connect`). `avoid_nodes`: node
        ids the engines must not use (the learner's, with `cluster.colocate: false`)."""
        import ray

        from agentrl.rollout.ray_engine import EngineActor, actor_options, engine_capacity, engine_nodes, live_nodes

        remote = ray.remote(EngineActor)
        if avoid_nodes and not engine_nodes(cluster, avoid_nodes):
            raise FleetFailed("cluster.colocate=false: every node of the Ray cluster holds a learner rank; "
                              "add a node or set cluster.colocate=true")

        def make_actor(i: int):
            live = live_nodes(avoid_nodes)  # at each (re)start: the nodes alive now
            nodes, room = engine_nodes(cluster, nodes=live), engine_capacity(cluster, nodes=live)
            kept = sum(not m.retired for m in members)
            if nodes and room < kept:  # a node is gone, its engines with it
                raise RuntimeError(f"the live nodes of the Ray cluster hold {room:g} engines by their resources, "
                                   f"fewer than the {kept} the run keeps: engine {i} has nowhere to go")
            return remote.options(**actor_options(cluster, i, avoid_nodes, nodes)).remote(
                i, model_path, cfg.model_dump(), eos_id, cluster.tensor_parallel_size, cluster.engine_num_cpus,
                cluster.engine_num_gpus > 0)

        members = [RayMember(i, make_actor=make_actor, start_timeout_s=cluster.start_timeout_s,
                             workers=cluster.tensor_parallel_size) for i in range(cluster.engines)]
        return cls(members, cluster.max_engine_restarts)

    async def start(self) -> None:
        for m in self.members:
            if isinstance(m, LocalMember):
                await m.start()  # vLLM's start blocks this loop; local engines start one after another
        await asyncio.gather(*(m.start() for m in self.members if not isinstance(m, LocalMember)))
        for m in self.members:
            m.healthy = True
        self._healthy.set()

    # -- routing -------------------------------------------------------------------------------

    @contextlib.asynccontextmanager
    async def lease(self) -> AsyncIterator[_Leased]:
        """One engine for one episode: the healthy one with the fewest live episodes."""
        member = await self._pick()
        member.episodes += 1
        member.served += 1
        try:
            yield _Leased(self, member)
        finally:
            member.episodes -= 1

    async def _pick(self) -> Member:
        while True:
            self._raise_if_failed()
            healthy = [m for m in self.members if m.healthy]
            if healthy:
                self._rotate += 1
                n = len(self.members)
                return min(healthy, key=lambda m: (m.episodes, (m.index - self._rotate) % n))
            self._healthy.clear()
            waiter = asyncio.ensure_future(self._healthy.wait())
            await asyncio.wait([waiter, self.failed], return_when=asyncio.FIRST_COMPLETED)
            waiter.cancel()

    async def generate(self, prompt_ids: list[int], max_tokens: int, temperature: float = 1.0,
                       top_p: float = 1.0, seed: int | None = None) -> Generation:
        """One request on the least-loaded engine (the `GenerateFn` of a single turn)."""
        async with self.lease() as engine:
            return await engine.generate(prompt_ids, max_tokens, temperature, top_p, seed)

    async def stream(self, *args) -> AsyncIterator[Generation]:
        async with self.lease() as engine:
            async for delta in engine.stream(*args):
                yield delta

    # -- versions and weight loads -------------------------------------------------------------

    @property
    def version(self) -> int:
        return self._version

    def versions(self) -> list[int]:
        return [m.version for m in self.members]

    def _set_member_version(self, member: Member, version: int) -> None:
        member.version = max(member.version, version)
        served = [m.version for m in self.members if m.healthy]
        oldest = max(self._version, min(served)) if served else self._version
        if oldest != self._version:
            self._version = oldest
            if self.on_version is not None:
                self.on_version(oldest)

    async def _load(self, member: Member, handover: Any, version: int) -> float:
        epoch = member.epoch
        async with member.load_lock:
            if member.version >= version or member.epoch != epoch:
                return 0.0
            try:
                pause = await load_into(member, handover, version)
            except Exception as exc:
                # Reported here, not by the caller: a load that fails after the push's deadline has
                # stopped the caller's wait must still get a dead engine restarted.
                await self.report_failure(member, exc, epoch)
                raise
            if member.epoch == epoch:
                self._set_member_version(member, version)
            return pause

    async def load_weights_file(self, handover: Any, version: int) -> float:
        """Load `version` into every healthy engine in parallel; returns the longest pause. Raises
        naming the engines that failed; the others serve the new version. Each load is shielded: a
        caller's deadline stops the wait, not the load, whose version is set when it lands."""
        self._latest = (handover, version)
        targets = [m for m in self.members if m.healthy]
        jobs = [asyncio.ensure_future(self._load(m, handover, version)) for m in targets]
        done = await asyncio.shield(asyncio.gather(*jobs, return_exceptions=True))
        errors = [f"engine {m.index}: {r!r}" for m, r in zip(targets, done) if isinstance(r, BaseException)]
        skipped = [f"engine {m.index}: restarting" for m in self.members if m not in targets and not m.retired]
        if errors or skipped:
            raise RuntimeError("; ".join(errors + skipped))
        return max((r for r in done), default=0.0)

    # -- faults --------------------------------------------------------------------------------

    async def report_failure(self, member: Member, exc: BaseException, epoch: int | None = None) -> None:
        """Called on any error from an engine: restart it if it is dead (errors of one request are not).
        `epoch` is the engine life the failed call began on (default: the current one). An error of a life
        that a restart has since replaced is that life's (a request in flight when it died, reaching its
        caller late), and blaming the new life would restart a healthy engine."""
        epoch = member.epoch if epoch is None else epoch
        if not member.healthy or member.epoch != epoch:
            return
        if not member.is_death(exc) and await member.alive():
            # An error that the engine's death caused (a weight group's peer gone) can arrive before the
            # engine client has seen its core exit, while `alive()` still says yes; asked once, the death
            # would go unnoticed until some later request failed. Ask again for a few seconds.
            if member.index not in self._confirming:
                self._confirming.add(member.index)
                self._track(self._confirm(member, exc, epoch))
            return
        self._died(member, exc, epoch)

    async def _confirm(self, member: Member, exc: BaseException, epoch: int) -> None:
        try:
            for delay in DEATH_RECHECK_S:
                await asyncio.sleep(delay)
                if not member.healthy or member.epoch != epoch:  # reported meanwhile
                    return
                if not await member.alive():
                    self._died(member, exc, epoch)
                    return
        finally:
            self._confirming.discard(member.index)

    def _died(self, member: Member, exc: BaseException, epoch: int) -> None:
        if not member.healthy or member.epoch != epoch:  # another caller noticed first, while we asked
            return
        member.healthy = False
        member.last_error = f"{type(exc).__name__}: {exc}"
        log.error("engine %d died%s (%s); restarting it", member.index, on_node(member), member.last_error)
        self._track(self._restart(member))

    def _track(self, job) -> None:
        """Run `job` (a restart, or the re-check that may lead to one); `wait_restarts` waits for it."""
        task = asyncio.get_running_loop().create_task(job)
        self._restarts.add(task)
        task.add_done_callback(self._restarts.discard)

    async def _restart(self, member: Member) -> None:
        while True:
            if member.restarts >= self.max_restarts:
                self._give_up(member, f"engine {member.index} died {member.restarts + 1} times (cluster."
                                      f"max_engine_restarts={self.max_restarts}); last error: {member.last_error}")
                return
            member.restarts += 1
            # A load stuck on the dead engine (a pause that never returns) keeps the old lock.
            member.epoch += 1
            member.load_lock = asyncio.Lock()
            t0 = time.perf_counter()
            try:
                await member.stop()
                await member.start()
                await self._catch_up(member)
            except Exception as exc:
                member.last_error = f"restart failed: {type(exc).__name__}: {exc}"
                log.error("engine %d: %s", member.index, member.last_error)
                continue
            member.healthy = True
            self._set_member_version(member, member.version)
            self._healthy.set()
            log.warning("engine %d restarted in %.1fs%s, serving v%d", member.index, time.perf_counter() - t0,
                        on_node(member), member.version)
            return

    async def _catch_up(self, member: Member) -> None:
        """Load the newest weights pushed into a restarted engine. A push that lands meanwhile may
        release the handover being read (the learner keeps only the newest): then load that one."""
        while self._latest is not None and member.version < self._latest[1]:
            handover, version = self._latest
            try:
                await load_into(member, handover, version)
            except Exception:
                if self._latest[1] == version:
                    raise
                continue
            member.version = version

    def _give_up(self, member: Member, message: str) -> None:
        """Retire `member` if another engine is left (healthy, or still restarting), else fail the fleet."""
        left = [m for m in self.members if m is not member and not m.retired]
        if not left:
            self._fail(message)
            return
        member.retired = True
        log.error("%s; going on with %d of %d engines (engine %d retired)", message, len(left), len(self.members),
                  member.index)
        self._track(member.stop())  # a restart's actor that never started (no node to hold it)

    def _fail(self, message: str) -> None:
        log.error(message)
        self._failed.fail(FleetFailed(message))

    def _raise_if_failed(self) -> None:
        if self.failed.done():
            raise self.failed.exception()

    async def wait_restarts(self) -> None:
        """Until every restart under way has finished (or failed the fleet)."""
        while self._restarts:
            await asyncio.gather(*self._restarts, return_exceptions=True)
        self._raise_if_failed()

    def stats(self) -> dict[str, Any]:
        return {"engines": len(self.members), "weight_transport": self.transport, "engine_versions": self.versions(),
                "engine_restarts": sum(m.restarts for m in self.members),
                "engines_healthy": sum(m.healthy for m in self.members),
                "engines_retired": [m.index for m in self.members if m.retired],
                "engine_episodes": [m.served for m in self.members],
                "engine_where": [m.where for m in self.members]}

    async def shutdown(self) -> None:
        for task in list(self._restarts):
            task.cancel()
        await asyncio.gather(*self._restarts, return_exceptions=True)
        for m in self.members:
            await m.stop()
        for close in self.closers:
            close()
