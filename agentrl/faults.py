"""Crash points for the kill-and-resume tests and `bench/chaos_resume.py`.

    AGENTRL_CRASH_AT=<point>:<n>   SIGKILL this process the n-th time it reaches <point>

A real SIGKILL (nothing is flushed, no `finally` runs), at a named place in the code, so a test can
kill a run in the middle of a learner step or half-way through a checkpoint write every time, which a
timer from outside cannot. Points: "generation" (an episode just finished while others are still
generating), "learner_step" (after the first backward of a step, before its optimizer step),
"weight_push" (the snapshot is written, the engines have not loaded it), "checkpoint_write" (every
file is in the temporary folder, which is not yet renamed and has no manifest row). Unset, `reached` is one dict lookup.
"""

from __future__ import annotations

import os
import signal
import threading
from collections import Counter

POINTS = ("generation", "learner_step", "weight_push", "checkpoint_write")
ENV_VAR = "AGENTRL_CRASH_AT"

_hits: Counter[str] = Counter()
_lock = threading.Lock()  # the learner step runs in a worker thread


def _target() -> tuple[str, int] | None:
    spec = os.environ.get(ENV_VAR)
    if not spec:
        return None
    point, _, n = spec.partition(":")
    if point not in POINTS or not n.isdigit() or int(n) < 1:
        raise ValueError(f"{ENV_VAR}={spec!r}: expected <point>:<n> with point one of {POINTS} and n >= 1")
    return point, int(n)


def reached(point: str) -> None:
    """Count a visit to `point`; SIGKILL the process on the configured visit."""
    target = _target()
    if target is None or target[0] != point:
        return
    with _lock:
        _hits[point] += 1
        if _hits[point] == target[1]:
            os.kill(os.getpid(), signal.SIGKILL)
