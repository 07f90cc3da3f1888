"""The token samples the stage trainers consume, and what a build of a dataset returns.

Token lists, not tensors: padding, packing and batching belong to each trainer's collator, and plain
lists compare exactly in tests.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Sample:
    """One tokenised sequence. `mask` is 1 on the tokens a loss trains or scores (the response, the
    assistant turns, each ending with its EOS) and 0 on context."""

    tokens: list[int]
    mask: list[int]
    where: str  # the row's location, "path line N" or "path row N"


@dataclass(frozen=True)
class PairSample:
    """RM and DPO: the preferred and the dispreferred sequence of one row."""

    chosen: Sample
    rejected: Sample


@dataclass(frozen=True)
class LabeledSample:
    """KTO: one sequence, desirable or not."""

    sample: Sample
    desirable: bool


@dataclass(frozen=True)
class StepSample:
    """PRM: a sequence with one scored position per step. The logits at `positions[i]` restricted to the
    reward tokens score step i; `labels[i]` is the index of its reward token (0 = good). Scorers build
    it with no labels (`labels == []`)."""

    tokens: list[int]
    positions: list[int]
    labels: list[int]
    where: str


@dataclass
class Built:
    """A stage dataset, tokenised. `rows` counts the training rows after mixing, max_samples and the
    eval hold-out, before drops: `rows == len(train) + sum(dropped.values())`; `dropped` names only reasons
    that dropped something ({} when none did). `eval_dropped` counts the held-out rows dropped alike."""

    train: list[Any]
    eval: list[Any]
    dropped: dict[str, int]
    rows: int
    eval_dropped: dict[str, int] = field(default_factory=dict)
