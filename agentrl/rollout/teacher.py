"""The teacher on an engine of its own (algo.teacher placement engine): each finished episode's ledger,
every row of it (multi-turn, tool tokens and agent segments included), is scored by prompt log-probs,
temperature 1 over the full vocabulary (`agentrl.algo.distill`), and stored on the episode
(`Episode.teacher_logprobs`, into `TrainBatch.teacher_logprobs`). The teacher engine is not in the fleet:
it never receives weight pushes."""

from __future__ import annotations

import asyncio
from typing import Protocol

from agentrl.types import Episode


class PromptScorer(Protocol):
    """`agentrl.rollout.engine.Engine`: log p(ids[t] | ids[:t]) for t >= 1."""

    async def prompt_logprobs(self, token_ids: list[int]) -> list[float]: ...


class TeacherScorer:
    """Scores finished episodes with the teacher's `engine`; `shutdown` stops it (if it can be stopped)."""

    def __init__(self, engine: PromptScorer) -> None:
        self.engine = engine

    async def score(self, episode: Episode) -> None:
        """Set episode.teacher_logprobs: per row, 0.0 at position 0 (nothing predicts it), then the teacher's
        log-prob of each later token given all before it. Rows are scored concurrently."""
        rows = episode.rows()
        scored = await asyncio.gather(*(self.engine.prompt_logprobs(row.tokens) for row in rows if len(row.tokens) > 1))
        it = iter(scored)
        episode.teacher_logprobs = [[0.0, *next(it)] if len(row.tokens) > 1 else [0.0] * len(row.tokens) for row in rows]

    def shutdown(self) -> None:
        stop = getattr(self.engine, "shutdown", None)
        if stop is not None:
            stop()
