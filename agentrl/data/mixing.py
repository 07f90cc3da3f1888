"""Which rows a stage trains and evaluates on: datasets mixed by weight, capped, and an eval hold-out,
all a function of the seed (a rerun with the same config sees the same rows in the same order).

Mixing: with `probs`, N = max_samples (or the datasets' total size) and dataset i gives
round(N * p_i / sum(p)) rows, drawn from seeded shuffles of it, a fresh shuffle each time it runs out
(oversampling a small dataset repeats all of its rows before any twice). Without `probs` every dataset
is used in full. The rows are then shuffled together, capped at max_samples, and, without an eval_path,
the first ceil(eval_fraction * n) are held out.
"""

from __future__ import annotations

import math
import random
from typing import Callable, TypeVar

from agentrl.config.stages import StageDataConfig
from agentrl.data.errors import DataError
from agentrl.data.rows import Row, read_rows
from agentrl.data.samples import Built

S = TypeVar("S")


def draw(rows: list[Row], n: int, rng: random.Random) -> list[Row]:
    """n rows without replacement from successive shuffles of `rows` (n may exceed len(rows))."""
    out: list[Row] = []
    while len(out) < n:
        order = list(rows)
        rng.shuffle(order)
        out += order[:n - len(out)]
    return out


def mix(datasets: list[list[Row]], probs: list[float] | None, max_samples: int | None, seed: int) -> list[Row]:
    """The training rows of several datasets, mixed by `probs`, shuffled together and capped."""
    if probs is None:
        rows = [row for rows in datasets for row in rows]
    else:
        total = max_samples if max_samples is not None else sum(len(rows) for rows in datasets)
        rows = []
        for i, (dataset, p) in enumerate(zip(datasets, probs)):
            rows += draw(dataset, round(total * p / sum(probs)), random.Random(f"{seed}/draw/{i}"))
    random.Random(f"{seed}/mix").shuffle(rows)
    return rows[:max_samples] if max_samples is not None else rows


def split_rows(cfg: StageDataConfig, seed: int) -> tuple[list[Row], list[Row]]:
    """(train, eval) rows: eval is eval_path's rows in file order, or the held-out head of the mix."""
    if not cfg.paths:
        raise DataError("data.paths: no training dataset given (a list of .jsonl/.json/.parquet files or "
                        "datasets folders)")
    rows = mix([read_rows(path, "data.paths") for path in cfg.paths], cfg.probs, cfg.max_samples, seed)
    if cfg.eval_path:
        return rows, read_rows(cfg.eval_path, "data.eval_path")
    # The epsilon keeps 0.1 * 30 (= 3.0000000000000004 in floats) at 3 rows, not 4.
    held = math.ceil(cfg.eval_fraction * len(rows) - 1e-9)
    if held >= len(rows) and rows:
        raise DataError(f"data.eval_fraction: holding out {held} of {len(rows)} rows leaves none to train on")
    return rows[held:], rows[:held]


def build(cfg: StageDataConfig, seed: int, make: Callable[[Row], S], length: Callable[[S], int]) -> Built:
    """Tokenise the split rows with `make`; samples longer than max_len (by `length`) are dropped and
    counted, never cut (a cut response would teach the model to stop mid-answer, or drop its EOS)."""
    train_rows, eval_rows = split_rows(cfg, seed)
    train, dropped = _keep(train_rows, make, length, cfg.max_len)
    held, eval_dropped = _keep(eval_rows, make, length, cfg.max_len)
    if not train:
        raise DataError(f"data.max_len: all {len(train_rows)} training rows are longer than {cfg.max_len} tokens")
    return Built(train, held, dropped, len(train_rows), eval_dropped)


def _keep(rows: list[Row], make: Callable[[Row], S], length: Callable[[S], int],
          max_len: int) -> tuple[list[S], dict[str, int]]:
    kept, too_long = [], 0
    made: dict[int, S] = {}  # an oversampled row is the same Row object each time: tokenised once
    for row in rows:
        if id(row) not in made:
            made[id(row)] = make(row)
        sample = made[id(row)]
        if length(sample) > max_len:
            too_long += 1
        else:
            kept.append(sample)
    return kept, ({"too_long": too_long} if too_long else {})  # empty: nothing dropped
