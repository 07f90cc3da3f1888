"""Failed episodes: logs a person can read, and the rule that ends a run whose episodes keep failing.

Logs. The first failure of each kind (status and exception type) is logged once, with the episode,
its task and the full traceback; later ones are counted, and `flush` (each training step, the end of
an evaluation, or every `FLUSH_S` seconds) writes one line per status: the count and one example. A
run where 30 % of episodes fail stays a few lines per step, not one line per episode.

Fail fast. Transient failures are recorded and their episodes dropped (never scored 0). But
`rollout.fail_after` episodes in a row ending failed, in the order they end, with none finishing
between them, mean failures persist: a deterministic bug in the env, a tool server that is down, a
reward source that always errors. The watch then builds `EpisodesFailing`, whose message is what the
run ends with: the counts by status, the first failure of the streak with its traceback and task,
and what to try. At least `rollout.max_concurrency + 1` are counted: one engine death fails every
episode in flight on it at once, and the fleet restarts it. An evaluation in which every episode
failed ends the same way (`check_evaluation`), since a small held-out set never reaches the streak.
"""

from __future__ import annotations

import json
import logging
import time
from collections import Counter
from dataclasses import dataclass, field

from agentrl.types import TRAINABLE_STATUSES, Episode

log = logging.getLogger(__name__)

FLUSH_S = 30.0  # aggregated lines at least this often when nothing calls `flush` (a long evaluation)
TASK_CHARS = 300  # how much of the failing task the summary shows

HINTS = {
    "env_error": "the env (or agent) raised: fix the code the traceback points to; try it on a few tasks without "
                 "the engine or learner: python -m agentrl.check --config <your config> --policy scripted",
    "timeout": "the env, a tool it calls or the engine exceeded rollout.turn_timeout_s / episode_timeout_s: is the "
               "tool server up? raise the deadlines if the work is just slow",
    "engine_error": "vLLM failed the request: a prompt longer than engine.max_model_len, or an engine out of memory",
    "reward_error": "a reward source failed on every episode: check rewards.sources (a rule's answer_key, a "
                    "verifier's URL); rewards.on_failure=retry retries it",
}


class EpisodesFailing(RuntimeError):
    """Episodes kept failing with none finishing; the message is the run's closing summary."""


def _kind(ep: Episode) -> tuple[str, str]:
    """What makes two failures "the same": the status and the exception type (or the error's head)."""
    return ep.status, ep.error.split(":", 1)[0]


@dataclass
class FailureWatch:
    """Counts and logs failed episodes, and trips when `limit` in a row failed (0: never)."""

    limit: int
    in_a_row: int = 0
    finished: int = 0
    failed: Counter[str] = field(default_factory=Counter)  # by status, this process's run
    tripped: EpisodesFailing | None = None
    _streak_first: Episode | None = None
    _kinds_seen: set[tuple[str, str]] = field(default_factory=set)
    _pending: dict[str, list] = field(default_factory=dict)  # status -> [count, example line]
    _flushed_at: float = field(default_factory=time.monotonic)

    @classmethod
    def for_rollout(cls, fail_after: int, max_concurrency: int) -> "FailureWatch":
        return cls(0 if fail_after == 0 else max(fail_after, max_concurrency + 1))

    def record(self, ep: Episode) -> None:
        if ep.status in TRAINABLE_STATUSES:
            self.finished += 1
            self.in_a_row, self._streak_first = 0, None
            return
        self.failed[ep.status] += 1
        self.in_a_row += 1
        if self._streak_first is None:
            self._streak_first = ep
        kind = _kind(ep)
        if kind not in self._kinds_seen:
            self._kinds_seen.add(kind)
            log.warning("%s ended with %s: %s%s", ep.label, ep.status, ep.error,
                        f" (first of its kind; later ones are counted)\n{ep.traceback}" if ep.traceback else
                        " (first of its kind; later ones are counted)")
        else:
            pending = self._pending.setdefault(ep.status, [0, ""])
            pending[0] += 1
            pending[1] = pending[1] or f"{ep.label}: {ep.error}"
        if self.limit and self.in_a_row >= self.limit and self.tripped is None:
            self.tripped = EpisodesFailing(self.summary(f"{self.in_a_row} episodes in a row failed with none "
                                                        f"finishing (rollout.fail_after)"))
            self.flush()
        if time.monotonic() - self._flushed_at > FLUSH_S:
            self.flush()

    def flush(self, where: str = "") -> None:
        """One line per status of the failures counted since the last flush."""
        self._flushed_at = time.monotonic()
        for status, (n, example) in sorted(self._pending.items()):
            log.warning("%s%d more episode%s ended with %s, e.g. %s", f"{where}: " if where else "", n,
                        "s" if n > 1 else "", status, example)
        self._pending.clear()

    def check_evaluation(self, episodes: list[Episode]) -> None:
        """Raise EpisodesFailing when every episode of an evaluation failed."""
        failed = [e for e in episodes if e.status not in TRAINABLE_STATUSES]
        if failed and len(failed) == len(episodes):
            self.flush()
            self._streak_first = self._streak_first or failed[0]
            raise EpisodesFailing(self.summary(f"all {len(episodes)} episodes of an evaluation failed"))

    def summary(self, headline: str) -> str:
        first = self._streak_first
        assert first is not None
        counts = ", ".join(f"{status} {n}" for status, n in self.failed.most_common())
        lines = [f"{headline}; failed episodes so far: {counts} ({self.finished} finished).",
                 f"The first of them, {first.label}, ended with {first.status}: {first.error}"]
        if first.traceback:
            lines.append(first.traceback)
        task = first.info.get("task")
        if task is not None:
            text = json.dumps(task, default=repr)
            lines.append(f"Its task: {text[:TASK_CHARS]}{' ...' if len(text) > TASK_CHARS else ''}")
        lines.append("What to try:")
        lines += [f"  {status}: {HINTS[status]}" for status in self.failed if status in HINTS]
        return "\n".join(lines)
