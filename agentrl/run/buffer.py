"""StalenessBuffer: admission control for rollout groups and the drop rule at batch assembly.

Versions. V is the learner's policy version (optimizer steps taken); E = `engine_version` is the
version the rollout engine serves (E <= V; it lags while a weight push is in flight). Every generated
token is stamped with the engine version that sampled it, so a token's version is >= the E at which
its group was admitted. G = `groups_per_batch` = batch_size // group_size. k = `versions_per_batch`:
the most optimizer steps the learner takes on one batch (`learner.mini_batches`; a batch short of
failed episodes can take fewer).

Admission. A group may start only while `issued_groups < capacity_groups = returned + L * G`, where
`issued_groups` = admitted - refunded (a group is refunded when all its episodes failed, when it is
dropped as stale, or when its producer gives its slot back with `release`), `returned` counts the
groups handed to the learner (they stay issued), and L = max(0, (E + max_staleness - W) // k + 1) is
the number of batches still to come that can take a group admitted now: W is the version the learner
takes its next batch at (exact once the driver reports it, `set_learner_version`; until then the
version of the last batch plus k), and a group admitted at E is fresh for every batch taken at a
version up to E + max_staleness. With k = 1, W is the number of batches returned and the capacity is
(E + max_staleness + 1) * G. Counting batches by versions at k > 1 would open k - 1 batches of slots
at every step: groups without end, each dropped as stale once the learner has passed its version.
Admission uses E, not V, because E is what new tokens will carry: with max_staleness 0 no group
starts on old weights mid-push. With `max_ahead_batches` = A, the capacity is further capped at
returned + A * G: generation runs at most A batches ahead of the learner. When generation is faster
than learning, the bound alone lets it run L batches ahead, so nearly every trained token is exactly
max_staleness old (measured: 75 % of tokens at 16 with a bound of 16, docs/benchmarks.md); A keeps
the bulk of a batch fresh while the bound still admits stragglers up to max_staleness. A >= 1, so
liveness below holds (G slots above the groups returned).

Invariant (safety): no episode returned by `get_batch(V)` has V - episode.min_version > max_staleness.
Proof: group.min_version <= episode.min_version for each of its episodes; every group with
V - group.min_version > max_staleness is dropped by the scan that immediately precedes assembly, and
the scan and the assembly run with no await between them, so no group can slip in unchecked.

On-policy at max_staleness 0 (the driver calls `set_engine_version(V)` once the learner reaches V,
never earlier, and reports V first): by induction on the batches, when the learner is at W = V and
E == V, every live group (issued, not yet returned) was admitted at V, and there are at most L * G = G
of them; while E < V, L = 0 and nothing is admitted. `get_batch(V)` needs G ready groups, so it takes
all of them and leaves none live. The engine cannot reach a newer version before that batch is
trained, so all their tokens carry version V: every returned episode has min_version == V, and none is
ever dropped.

Liveness: `get_batch(V)` can complete once W = V is known and E >= V - max_staleness (then L >= 1, so G
slots are free above the groups already returned, and stale drops refund their slots), provided
producers keep admitting and putting groups.

All methods run on one event loop; state changes are synchronous, so no lock is needed.
"""

from __future__ import annotations

import asyncio
from collections import Counter, deque
from dataclasses import dataclass, field
from typing import Any, get_args

from agentrl.types import TRAINABLE_STATUSES, Episode, EpisodeStatus, Group

# Stat key for episodes whose status is trainable but that generated no tokens.
NO_TOKENS = "no_generated_tokens"
_FAILED_KEYS = tuple(s for s in get_args(EpisodeStatus) if s not in TRAINABLE_STATUSES) + (NO_TOKENS,)


class BufferClosed(Exception):
    """Raised by `admit` and `get_batch` once the buffer is closed."""


@dataclass
class BatchAssembly:
    """One training batch as assembled by `StalenessBuffer.get_batch`."""

    groups: list[Group]  # groups_per_batch groups, FIFO by completion; only trainable episodes
    learner_version: int  # V the batch was assembled for
    staleness_hist: dict[int, int] = field(default_factory=dict)  # V - episode.min_version -> count
    dropped_stale: int = 0  # groups dropped as stale while assembling this batch
    dropped_ids: list[int] = field(default_factory=list)  # their group ids
    dropped_groups: list[Group] = field(default_factory=list)  # the groups themselves (rollouts.jsonl writes them)

    @property
    def episodes(self) -> list[Episode]:
        return [e for g in self.groups for e in g.episodes]


class StalenessBuffer:
    """Bounded-staleness group buffer between the rollout workers and the learner (see module doc)."""

    def __init__(self, batch_size: int, group_size: int, max_staleness: int, engine_version: int = 0,
                 versions_per_batch: int = 1, max_ahead_batches: int | None = None):
        if batch_size <= 0 or group_size <= 0:
            raise ValueError(f"batch_size ({batch_size}) and group_size ({group_size}) must be positive")
        if batch_size % group_size:
            raise ValueError(f"batch_size ({batch_size}) must be a multiple of group_size ({group_size}): "
                             f"a batch is made of whole groups")
        if max_staleness < 0:
            raise ValueError(f"max_staleness must be >= 0, got {max_staleness}")
        if engine_version < 0:
            raise ValueError(f"engine_version must be >= 0, got {engine_version}")
        if versions_per_batch <= 0:
            raise ValueError(f"versions_per_batch must be positive, got {versions_per_batch}")
        if max_ahead_batches is not None and max_ahead_batches < 1:
            raise ValueError(f"max_ahead_batches must be >= 1 (or None), got {max_ahead_batches}")
        self.max_ahead_batches = max_ahead_batches
        self.batch_size = batch_size
        self.group_size = group_size
        self.groups_per_batch = batch_size // group_size
        self.max_staleness = max_staleness
        self.versions_per_batch = versions_per_batch
        self._engine_version = engine_version
        self._next_version = 0  # W: the learner version of the next batch (module doc)
        self._issued = 0
        self._ready: deque[Group] = deque()
        self._closed = False
        self._changed = asyncio.Event()  # replaced on every state change; waiters re-check on wake
        self._n: Counter[str] = Counter()

    # -- read-only views --------------------------------------------------------------------------

    @property
    def engine_version(self) -> int:
        return self._engine_version

    @property
    def capacity_groups(self) -> int:
        ahead = max(0, (self._engine_version + self.max_staleness - self._next_version) // self.versions_per_batch + 1)
        if self.max_ahead_batches is not None:
            ahead = min(ahead, self.max_ahead_batches)
        return self._n["groups_returned"] + ahead * self.groups_per_batch

    @property
    def issued_groups(self) -> int:
        return self._issued

    @property
    def in_flight_groups(self) -> int:
        """Admitted groups not yet put, released, or refunded."""
        return self._issued - self._n["groups_returned"] - len(self._ready)

    @property
    def closed(self) -> bool:
        return self._closed

    def __len__(self) -> int:
        """Finished groups waiting in the buffer."""
        return len(self._ready)

    # -- producer side ----------------------------------------------------------------------------

    async def admit(self) -> int:
        """Wait until a group may start, count it as issued and return the engine version now.

        Cancellation-safe: the slot is taken synchronously after the last await, so a cancelled
        waiter has taken nothing. A caller that will never `put` its group must `release` it.
        """
        while True:
            if self._closed:
                raise BufferClosed("buffer closed")
            if self._issued < self.capacity_groups:
                self._issued += 1
                self._n["groups_admitted"] += 1
                return self._engine_version
            await self._changed.wait()

    def put(self, group: Group) -> bool:
        """Hand in a finished group; non-trainable episodes are removed and counted by status.
        False when none was trainable: the group is refunded, not kept."""
        if self.in_flight_groups <= 0:
            raise RuntimeError(f"put of group {group.group_id} without a matching admit")
        kept = []
        for ep in group.episodes:
            if ep.trainable:
                kept.append(ep)
            else:
                key = ep.status if ep.status not in TRAINABLE_STATUSES else NO_TOKENS
                self._n[f"episodes_failed/{key}"] += 1
        group.episodes = kept
        if not kept:
            self._refund("groups_failed")
            return False
        self._ready.append(group)
        self._notify()
        return True

    def release(self) -> None:
        """Give back an admitted slot whose group will never be put (e.g. its producer was cancelled)."""
        if self.in_flight_groups <= 0:
            raise RuntimeError("release without a matching admit")
        self._refund("groups_released")

    # -- learner / driver side --------------------------------------------------------------------

    def set_engine_version(self, version: int) -> None:
        """Record that the engine now serves `version` (monotone); wakes admission waiters."""
        if version < self._engine_version:
            raise ValueError(f"engine version must not decrease ({self._engine_version} -> {version})")
        if version > self._engine_version:
            self._engine_version = version
            self._notify()

    def set_learner_version(self, version: int) -> None:
        """Record the learner version the next batch is taken at (after a step: it took k or fewer
        optimizer steps); wakes admission waiters."""
        if version != self._next_version:
            self._next_version = version
            self._notify()

    async def get_batch(self, learner_version: int) -> BatchAssembly:
        """Wait for groups_per_batch non-stale groups and return them, FIFO by completion.

        Groups with learner_version - group.min_version > max_staleness are dropped (and refunded)
        on every check, so the batch satisfies the invariant in the module docstring.
        """
        dropped: list[Group] = []
        while True:
            if self._closed:
                raise BufferClosed("buffer closed")
            dropped += self._drop_stale(learner_version)
            if len(self._ready) >= self.groups_per_batch:
                groups = [self._ready.popleft() for _ in range(self.groups_per_batch)]
                return self._assemble(groups, learner_version, dropped)
            await self._changed.wait()

    def close(self) -> None:
        """Wake every waiter; admit and get_batch raise BufferClosed from now on."""
        self._closed = True
        self._notify()

    def stats(self) -> dict[str, int]:
        """Counters since construction; groups_admitted == groups_returned + groups_in_buffer +
        groups_in_flight + groups_refunded, and groups_refunded is failed + dropped_stale + released."""
        out = {
            "engine_version": self._engine_version,
            "capacity_groups": self.capacity_groups,
            "groups_issued": self._issued,
            "groups_in_flight": self.in_flight_groups,
            "groups_in_buffer": len(self._ready),
        }
        for key in ("groups_admitted", "groups_returned", "groups_failed", "groups_dropped_stale",
                    "groups_released", "groups_refunded", "episodes_returned"):
            out[key] = self._n[key]
        for key in _FAILED_KEYS:
            out[f"episodes_failed/{key}"] = self._n[f"episodes_failed/{key}"]
        return out

    # -- checkpoints ------------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """Finished groups waiting, counters and the number of groups in flight, for a checkpoint. The
        groups are not copied: a group is never changed once put."""
        return {"ready": list(self._ready), "counters": {"issued": self._issued, **self._n},
                "in_flight": self.in_flight_groups, "next_version": self._next_version}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """The groups in flight when the state was taken are not restored (their episodes restart and
        are admitted again), so they are taken out of `issued` and `groups_admitted`: admitted ==
        returned + in buffer + in flight + refunded still holds."""
        counters, in_flight = dict(state["counters"]), state["in_flight"]
        self._issued = counters.pop("issued") - in_flight
        self._n = Counter(counters)
        self._n["groups_admitted"] -= in_flight
        self._ready = deque(state["ready"])
        # Checkpoints from before W was kept: one version a batch, as the learner then took.
        self._next_version = state.get("next_version", self._n["groups_returned"] // self.groups_per_batch)
        self._notify()

    # -- internals --------------------------------------------------------------------------------

    def _notify(self) -> None:
        self._changed.set()
        self._changed = asyncio.Event()

    def _refund(self, reason: str) -> None:
        self._issued -= 1
        self._n[reason] += 1
        self._n["groups_refunded"] += 1
        self._notify()

    def _drop_stale(self, learner_version: int) -> list[Group]:
        """The groups dropped."""
        stale = [g for g in self._ready if learner_version - g.min_version > self.max_staleness]
        if stale:
            self._ready = deque(g for g in self._ready if learner_version - g.min_version <= self.max_staleness)
            for _ in stale:
                self._refund("groups_dropped_stale")
        return stale

    def _assemble(self, groups: list[Group], learner_version: int, dropped: list[Group]) -> BatchAssembly:
        hist: Counter[int] = Counter(learner_version - e.min_version for g in groups for e in g.episodes)
        self._n["groups_returned"] += len(groups)
        self._n["episodes_returned"] += sum(hist.values())
        self._next_version = learner_version + self.versions_per_batch  # the most it can be: k steps on it
        return BatchAssembly(groups=groups, learner_version=learner_version,
                             staleness_hist=dict(sorted(hist.items())), dropped_stale=len(dropped),
                             dropped_ids=[g.group_id for g in dropped], dropped_groups=dropped)
