"""StalenessBuffer: admission, refunds, stale drops, cancellation, close, and a randomized simulation.

Every test drives its own event loop with asyncio.run. The simulation delays only with
asyncio.sleep(0), so a seed fixes the whole interleaving and the runs are reproducible.
"""

from __future__ import annotations

import asyncio
import random
from collections import Counter

import pytest

from agentrl.run.buffer import NO_TOKENS, BatchAssembly, BufferClosed, StalenessBuffer
from agentrl.types import Episode, Group

FAIL_STATUSES = ("env_error", "timeout", "engine_error")


def make_episode(group_id: int, versions: list[int], status: str = "ok") -> Episode:
    """A prompt of 3 tokens, then one generated token per entry of `versions`, then an env reply."""
    ep = Episode(task_id=f"task{group_id}", group_id=group_id)
    ep.append([1, 2, 3], generated=False)
    if versions:
        ep.append([7] * len(versions), generated=True, logprobs=[-0.5] * len(versions), versions=versions)
    ep.append([4], generated=False)
    ep.status = status
    return ep


def make_group(group_id: int, *version_lists: list[int], statuses: list[str] | None = None) -> Group:
    statuses = statuses or ["ok"] * len(version_lists)
    eps = [make_episode(group_id, v, s) for v, s in zip(version_lists, statuses)]
    return Group(group_id=group_id, task={"id": group_id}, episodes=eps)


def run(coro) -> None:
    """asyncio.run with a generous deadline, so a regression fails instead of hanging."""
    asyncio.run(asyncio.wait_for(coro, timeout=5))


async def settle(n: int = 20) -> None:
    for _ in range(n):
        await asyncio.sleep(0)


def test_batch_size_must_be_a_multiple_of_group_size():
    with pytest.raises(ValueError, match="multiple of group_size"):
        StalenessBuffer(batch_size=6, group_size=4, max_staleness=0)
    with pytest.raises(ValueError):
        StalenessBuffer(batch_size=4, group_size=2, max_staleness=-1)
    assert StalenessBuffer(batch_size=8, group_size=4, max_staleness=0).groups_per_batch == 2


def test_admission_blocks_at_capacity_and_opens_after_engine_update():
    async def main():
        buf = StalenessBuffer(batch_size=4, group_size=2, max_staleness=1)  # G = 2, capacity 4 at E=0
        assert buf.capacity_groups == 4
        assert [await buf.admit() for _ in range(4)] == [0, 0, 0, 0]
        waiter = asyncio.create_task(buf.admit())
        await settle()
        assert not waiter.done() and buf.issued_groups == 4

        # Returning a batch does not free slots: returned groups stay issued until the engine moves.
        buf.put(make_group(0, [0, 0], [0]))
        buf.put(make_group(1, [0], [0]))
        batch = await buf.get_batch(0)
        assert [g.group_id for g in batch.groups] == [0, 1]
        await settle()
        assert not waiter.done()

        buf.set_engine_version(1)  # capacity (1 + 1 + 1) * 2 = 6
        assert await waiter == 1
        assert await buf.admit() == 1
        extra = asyncio.create_task(buf.admit())
        await settle()
        assert not extra.done() and buf.issued_groups == 6
        extra.cancel()
        st = buf.stats()
        assert st["groups_admitted"] == 6 and st["groups_returned"] == 2 and st["groups_in_flight"] == 4
        with pytest.raises(ValueError):
            buf.set_engine_version(0)

    run(main())


def test_max_staleness_zero_blocks_new_groups_while_push_in_flight():
    async def main():
        buf = StalenessBuffer(batch_size=2, group_size=2, max_staleness=0)  # G = 1
        assert await buf.admit() == 0
        buf.put(make_group(0, [0, 0], [0]))
        batch = await buf.get_batch(0)
        assert batch.staleness_hist == {0: 2}
        # Learner is now at V=1, the engine still serves 0: nothing may start on the old weights.
        waiter = asyncio.create_task(buf.admit())
        await settle()
        assert not waiter.done()
        buf.set_engine_version(1)
        assert await waiter == 1

    run(main())


def test_failed_episodes_are_removed_and_counted_by_status():
    async def main():
        buf = StalenessBuffer(batch_size=6, group_size=6, max_staleness=0)
        await buf.admit()
        group = make_group(0, [0], [0, 0], [0], [0], [0], [],
                           statuses=["ok", "truncated", "env_error", "timeout", "engine_error", "ok"])
        buf.put(group)
        assert [e.status for e in group.episodes] == ["ok", "truncated"]
        batch = await buf.get_batch(0)
        assert len(batch.episodes) == 2 and batch.staleness_hist == {0: 2}
        st = buf.stats()
        assert st["episodes_failed/env_error"] == 1
        assert st["episodes_failed/timeout"] == 1
        assert st["episodes_failed/engine_error"] == 1
        assert st[f"episodes_failed/{NO_TOKENS}"] == 1
        assert st["groups_failed"] == 0 and st["episodes_returned"] == 2

    run(main())


def test_all_failed_group_is_refunded():
    async def main():
        buf = StalenessBuffer(batch_size=2, group_size=2, max_staleness=0)  # capacity 1
        await buf.admit()
        waiter = asyncio.create_task(buf.admit())
        await settle()
        assert not waiter.done()
        buf.put(make_group(0, [0], [], statuses=["timeout", "ok"]))
        assert await waiter == 0  # the refund freed the slot
        st = buf.stats()
        assert st["groups_failed"] == 1 and st["groups_refunded"] == 1 and st["groups_issued"] == 1
        assert st["groups_in_buffer"] == 0
        assert st["episodes_failed/timeout"] == 1 and st[f"episodes_failed/{NO_TOKENS}"] == 1

    run(main())


def test_stale_group_is_dropped_refunded_and_never_returned():
    async def main():
        buf = StalenessBuffer(batch_size=2, group_size=2, max_staleness=1)  # G = 1, capacity 2 at E=0
        await buf.admit()
        await buf.admit()
        buf.put(make_group(10, [0, 2], [2]))  # min_version 0: stale at V=2
        buf.put(make_group(11, [1, 2], [2]))  # min_version 1: staleness 1 at V=2
        waiter = asyncio.create_task(buf.admit())
        await settle()
        assert not waiter.done()
        batch = await buf.get_batch(2)
        assert [g.group_id for g in batch.groups] == [11]
        assert batch.dropped_stale == 1
        assert batch.staleness_hist == {1: 1, 0: 1}
        st = buf.stats()
        assert st["groups_dropped_stale"] == 1 and st["groups_refunded"] == 1 and st["groups_returned"] == 1
        # The next batch is taken at version 3, and a group the engine would start at 0 is fresh only up to
        # version 1: it waits for the engine. At E = 2 the capacity is 1 returned + ((2 + 1 - 3) + 1) * 1 = 2,
        # and 1 slot is issued (group 11), so the waiter gets in only because the drop refunded group 10's.
        await settle()
        assert not waiter.done()
        buf.set_engine_version(2)
        assert await waiter == 2
        assert buf.issued_groups == buf.capacity_groups == 2

    run(main())


def test_cancelled_waiters_leak_nothing():
    async def main():
        buf = StalenessBuffer(batch_size=2, group_size=1, max_staleness=0)  # capacity 2
        await buf.admit()
        await buf.admit()
        waiters = [asyncio.create_task(buf.admit()) for _ in range(3)]
        getter = asyncio.create_task(buf.get_batch(0))
        await settle()
        waiters[0].cancel()
        waiters[2].cancel()
        getter.cancel()
        await asyncio.gather(*waiters[::2], getter, return_exceptions=True)
        assert buf.issued_groups == 2 and buf.stats()["groups_admitted"] == 2

        buf.set_engine_version(1)  # capacity 4: the one live waiter gets in, one slot stays free
        assert await waiters[1] == 1
        assert buf.issued_groups == 3
        assert await buf.admit() == 1
        assert buf.issued_groups == 4 and buf.stats()["groups_in_flight"] == 4

        buf.put(make_group(0, [0]))
        buf.put(make_group(1, [0]))
        assert len(buf) == 2  # the cancelled getter took nothing
        buf.release()
        assert buf.issued_groups == 3 and buf.stats()["groups_released"] == 1

    run(main())


def test_close_unblocks_waiters():
    async def main():
        buf = StalenessBuffer(batch_size=1, group_size=1, max_staleness=0)
        await buf.admit()
        admits = [asyncio.create_task(buf.admit()) for _ in range(2)]
        getter = asyncio.create_task(buf.get_batch(0))
        await settle()
        buf.close()
        for t in [*admits, getter]:
            with pytest.raises(BufferClosed):
                await t
        with pytest.raises(BufferClosed):
            await buf.admit()
        with pytest.raises(BufferClosed):
            await buf.get_batch(0)
        assert buf.closed and buf.issued_groups == 1

    run(main())


def test_put_or_release_without_admit_is_an_error():
    buf = StalenessBuffer(batch_size=1, group_size=1, max_staleness=0)
    with pytest.raises(RuntimeError):
        buf.put(make_group(0, [0]))
    with pytest.raises(RuntimeError):
        buf.release()


# -- randomized simulation --------------------------------------------------------------------------


async def simulate(seed: int, max_staleness: int, max_ahead: int | None = None) -> dict[str, int]:
    """Producers admit and generate groups whose tokens are stamped with the engine version at several
    points in time; a learner consumes batches; a pusher updates the engine version after a lag."""
    rng = random.Random(seed)
    group_size = rng.choice([1, 2, 4])
    gpb = rng.choice([1, 2, 3])
    n_producers = rng.randint(1, 3 * gpb + 2)
    n_steps = rng.randint(6, 14)
    buf = StalenessBuffer(batch_size=gpb * group_size, group_size=group_size, max_staleness=max_staleness,
                          max_ahead_batches=max_ahead)

    V = 0  # learner version
    admitted = holding = failed_groups = 0
    failed_eps: Counter[str] = Counter()
    returned_ids: list[int] = []
    dropped_in_batches = 0
    next_gid = iter(range(10**9))
    push_wanted = asyncio.Event()

    async def pause(max_yields: int) -> None:
        for _ in range(rng.randint(0, max_yields)):
            await asyncio.sleep(0)

    async def episode(gid: int, slow: bool, v0: int, doomed: bool) -> Episode:
        ep = Episode(task_id=f"t{gid}", group_id=gid)
        ep.append([1] * rng.randint(1, 4), generated=False)
        no_tokens = rng.random() < 0.04
        for _ in range(rng.randint(1, 3)):  # turns
            for _ in range(rng.randint(1, 3)):  # chunks within a turn; the engine may move in between
                await pause(60 if slow else 6)
                v = buf.engine_version
                assert v0 <= v <= V
                n = rng.randint(1, 3)
                if not no_tokens:
                    ep.append([5] * n, generated=True, logprobs=[-1.0] * n, versions=[v] * n)
            ep.append([2] * rng.randint(1, 3), generated=False)
        if doomed or rng.random() < 0.08:
            ep.status = rng.choice(FAIL_STATUSES)
        elif rng.random() < 0.2:
            ep.status = "truncated"
        return ep

    async def producer() -> None:
        nonlocal admitted, holding, failed_groups
        while True:
            v0 = await buf.admit()
            admitted += 1
            holding += 1
            assert buf.issued_groups <= buf.capacity_groups
            if max_ahead is not None:  # generation never runs more than max_ahead batches ahead
                assert buf.issued_groups - buf.stats()["groups_returned"] <= max_ahead * gpb
            assert v0 <= V
            try:
                gid = next(next_gid)
                slow, doomed = rng.random() < 0.15, rng.random() < 0.05
                eps = await asyncio.gather(*(episode(gid, slow, v0, doomed) for _ in range(group_size)))
                group = Group(group_id=gid, task={"id": gid}, episodes=list(eps), issued_version=v0)
                failed_groups += not any(e.trainable for e in eps)
                failed_eps.update(e.status if e.status in FAIL_STATUSES else NO_TOKENS
                                  for e in eps if not e.trainable)
                buf.put(group)
            except asyncio.CancelledError:
                buf.release()
                raise
            finally:
                holding -= 1

    async def pusher() -> None:
        while True:
            await push_wanted.wait()
            push_wanted.clear()
            await pause(30)  # weight push latency
            buf.set_engine_version(V)

    async def learner() -> None:
        nonlocal V, dropped_in_batches
        for _ in range(n_steps):
            batch: BatchAssembly = await buf.get_batch(V)
            assert len(batch.groups) == gpb
            for ep in batch.episodes:
                assert ep.trainable
                assert V - ep.min_version <= max_staleness, (seed, V, ep.versions)
                if max_staleness == 0:
                    assert ep.min_version == V
            assert batch.staleness_hist == dict(Counter(V - e.min_version for e in batch.episodes))
            returned_ids.extend(g.group_id for g in batch.groups)
            dropped_in_batches += batch.dropped_stale
            await pause(10)  # the optimizer step
            V += 1
            push_wanted.set()

    tasks = [asyncio.create_task(producer()) for _ in range(n_producers)] + [asyncio.create_task(pusher())]
    try:
        await asyncio.wait_for(learner(), timeout=5)
        st = buf.stats()
        # Every admitted group is returned, dropped, failed, still being generated, or in the buffer.
        assert admitted == st["groups_admitted"]
        assert admitted == (len(returned_ids) + st["groups_dropped_stale"] + st["groups_failed"]
                            + holding + st["groups_in_buffer"])
        assert st["groups_in_flight"] == holding and st["groups_released"] == 0
        assert st["groups_failed"] == failed_groups
        assert st["groups_dropped_stale"] == dropped_in_batches
        assert st["groups_returned"] == len(returned_ids) == len(set(returned_ids)) == n_steps * gpb
        assert all(st[f"episodes_failed/{k}"] == failed_eps[k] for k in (*FAIL_STATUSES, NO_TOKENS))
        assert st["groups_issued"] <= st["capacity_groups"]
        if max_staleness == 0:
            assert st["groups_dropped_stale"] == 0
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    st = buf.stats()
    assert st["groups_in_flight"] == 0  # every cancelled producer gave its slot back
    assert st["groups_admitted"] == st["groups_returned"] + st["groups_in_buffer"] + st["groups_refunded"]
    return st


@pytest.mark.parametrize("max_staleness", [0, 1, 2, 4])
def test_randomized_simulation_respects_staleness_bound(max_staleness):
    totals: Counter[str] = Counter()
    for seed in range(25):
        totals.update(asyncio.run(simulate(seed * 7919 + max_staleness, max_staleness)))
    # The runs must exercise the refund paths, not just the happy one.
    assert totals["groups_failed"] > 0 and totals["groups_released"] > 0
    if max_staleness > 0:
        assert totals["groups_dropped_stale"] > 0


@pytest.mark.parametrize("max_staleness,max_ahead", [(4, 1), (16, 2), (1, 3)])
def test_randomized_simulation_with_a_cap_on_batches_ahead(max_staleness, max_ahead):
    """The cap holds at every admission (asserted inside), every batch still arrives (liveness: the learner
    takes all its steps), and the bound still holds."""
    totals: Counter[str] = Counter()
    for seed in range(25):
        totals.update(asyncio.run(simulate(seed * 104729 + max_staleness, max_staleness, max_ahead)))
    assert totals["groups_released"] > 0


def test_max_ahead_batches_caps_admission_below_the_bound():
    async def main():
        with pytest.raises(ValueError, match="max_ahead_batches"):
            StalenessBuffer(batch_size=4, group_size=2, max_staleness=16, max_ahead_batches=0)
        buf = StalenessBuffer(batch_size=4, group_size=2, max_staleness=16, max_ahead_batches=2)  # G = 2
        assert buf.capacity_groups == 4  # 2 batches, where the bound alone allows 17
        assert [await buf.admit() for _ in range(4)] == [0, 0, 0, 0]
        waiter = asyncio.create_task(buf.admit())
        await settle()
        assert not waiter.done()
        buf.put(make_group(0, [0], [0]))
        buf.put(make_group(1, [0], [0]))
        await buf.get_batch(0)  # one batch handed over: two more groups may start, on the same engine version
        assert await waiter == 0 and buf.capacity_groups == 6
        uncapped = StalenessBuffer(batch_size=4, group_size=2, max_staleness=16)
        assert uncapped.capacity_groups == 17 * 2

    run(main())


@pytest.mark.parametrize("k", [1, 2, 3])
@pytest.mark.parametrize("max_staleness", [0, 1, 2, 4])
def test_a_cap_at_or_above_the_bounds_own_reach_never_binds(max_staleness, k):
    """The engine serves a version at most the learner's (E <= W), so the bound alone lets generation run
    at most (E + s - W) // k + 1 <= s // k + 1 batches ahead. A cap A >= s // k + 1 therefore never changes
    the capacity, at any (E, W) with groups returned or not: `max_ahead_batches: 2` leaves every run at
    max_staleness 0 or 1 (the default) as it was. One batch below that reach, it binds where E = W."""
    reach = max_staleness // k + 1
    for cap in (reach, reach + 3):
        capped = StalenessBuffer(batch_size=4, group_size=2, max_staleness=max_staleness, versions_per_batch=k,
                                 max_ahead_batches=cap)
        uncapped = StalenessBuffer(batch_size=4, group_size=2, max_staleness=max_staleness, versions_per_batch=k)
        for w in range(0, 12, k):
            for buf in (capped, uncapped):
                buf.set_learner_version(w)
            for e in range(capped.engine_version, w + 1):
                for buf in (capped, uncapped):
                    buf.set_engine_version(e)
                assert capped.capacity_groups == uncapped.capacity_groups, (cap, w, e)
    if reach > 1:
        tight = StalenessBuffer(batch_size=4, group_size=2, max_staleness=max_staleness, versions_per_batch=k,
                                max_ahead_batches=reach - 1)
        assert tight.capacity_groups == (reach - 1) * 2 < reach * 2  # E = W = 0: the bound reaches `reach`


def test_several_optimizer_steps_a_batch_admit_one_batch_a_step_and_drop_nothing():
    """k = 2 versions a batch (learner.mini_batches 2), max_staleness 2, G = 1, the producer filling every
    free slot at once: a group started at E is fresh for the batches at versions E and E + 2, so two
    groups are live at a time and none goes stale. Counting slots in versions (the k = 1 formula,
    (E + 2 + 1) * G) would give 7 at E = 4 and 2 more at each step, every extra group dropped stale."""
    async def main():
        buf = StalenessBuffer(batch_size=2, group_size=2, max_staleness=2, versions_per_batch=2)
        assert buf.capacity_groups == 2  # 0 returned + ((0 + 2 - 0) // 2 + 1) * 1
        next_id = 0

        async def fill() -> int:
            nonlocal next_id
            started = 0
            while buf.issued_groups < buf.capacity_groups:
                version = await buf.admit()
                buf.put(make_group(next_id, [version, version], [version]))
                next_id, started = next_id + 1, started + 1
            return started

        assert await fill() == 2
        for n in range(10):
            batch = await buf.get_batch(2 * n)
            assert batch.dropped_stale == 0 and [g.group_id for g in batch.groups] == [n]
            # W = 2n + 2 until the driver reports the step (the most it can be), E = 2n: returned + 1 * G
            assert buf.capacity_groups == (n + 1) + 1
            buf.set_learner_version(2 * n + 2)
            buf.set_engine_version(2 * n + 2)
            assert buf.capacity_groups == (n + 1) + 2  # returned + ((E + 2 - W) // 2 + 1) with E = W
            assert await fill() == 1 and len(buf) == 2  # one new group a step; two live
        st = buf.stats()
        assert st["groups_dropped_stale"] == 0 and st["groups_returned"] == 10 and st["groups_admitted"] == 12

    run(main())


def test_a_step_of_fewer_optimizer_steps_than_k_opens_the_slots_it_leaves():
    """A short batch can take fewer than k optimizer steps: the driver reports the version it reached,
    and the slots for the batch that version makes fresh open (a wait would never end otherwise)."""
    async def main():
        buf = StalenessBuffer(batch_size=2, group_size=2, max_staleness=0, versions_per_batch=2)
        assert await buf.admit() == 0
        buf.put(make_group(0, [0, 0], [0]))
        await buf.get_batch(0)
        buf.set_engine_version(1)  # the learner took one step, not two
        waiter = asyncio.create_task(buf.admit())
        await settle()
        assert not waiter.done()  # W is still 2: a group started at 1 would be stale at 2
        buf.set_learner_version(1)
        assert await waiter == 1 and buf.capacity_groups == 2  # 1 returned + ((1 + 0 - 1) // 2 + 1) * 1

    run(main())
