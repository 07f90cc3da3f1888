"""Fault points for the kill-and-resume tests and `bench/chaos_resume.py`.

    AGENTRL_CRASH_AT=<point>:<n>[:<signal>]   send <signal> (KILL, the default; TERM; INT) to this
                                              process the n-th time it reaches <point>
    AGENTRL_FAIL_AT=<point>:<n>[+]            raise OSError(ENOSPC, "No space left on device
                                              (injected)") at the n-th visit of <point> (with "+": at
                                              every visit from the n-th on)

A real signal at a named place in the code, so a test can kill (SIGKILL: nothing is flushed, no
`finally` runs) or pre-empt (SIGTERM, SIGINT: the run's handlers act) a run in the middle of a learner
step or half-way through a checkpoint write every time, which a timer from outside cannot. Crash points:
"startup" (the engines and the learner are up, no step taken), "generation" (an episode just finished
while others are still generating), "learner_step" (after the first backward of a step, before its
optimizer step), "weight_push" (the snapshot is written, the engines have not loaded it),
"checkpoint_write" (every file is in the temporary folder, which is not yet renamed and has no
manifest row). Fail points: "checkpoint_io" (half of the driver state file written, the learner's
files all written). Unset, `reached` and `fail_point` are one dict lookup.
"""

from __future__ import annotations

import errno
import os
import signal
import threading
from collections import Counter

POINTS = ("startup", "generation", "learner_step", "weight_push", "checkpoint_write")
FAIL_POINTS = ("checkpoint_io",)
SIGNALS = {"KILL": signal.SIGKILL, "TERM": signal.SIGTERM, "INT": signal.SIGINT}
ENV_VAR = "AGENTRL_CRASH_AT"
FAIL_ENV_VAR = "AGENTRL_FAIL_AT"

_hits: Counter[str] = Counter()
_lock = threading.Lock()  # the learner step runs in a worker thread


def _target() -> tuple[str, int, signal.Signals] | None:
    spec = os.environ.get(ENV_VAR)
    if not spec:
        return None
    point, _, rest = spec.partition(":")
    n, _, sig = rest.partition(":")
    if point not in POINTS or not n.isdigit() or int(n) < 1 or (sig or "KILL") not in SIGNALS:
        raise ValueError(f"{ENV_VAR}={spec!r}: expected <point>:<n>[:<signal>] with point one of {POINTS}, "
                         f"n >= 1 and signal one of {tuple(SIGNALS)}")
    return point, int(n), SIGNALS[sig or "KILL"]


def reached(point: str) -> None:
    """Count a visit to `point`; signal the process on the configured visit."""
    target = _target()
    if target is None or target[0] != point:
        return
    with _lock:
        _hits[point] += 1
        if _hits[point] == target[1]:
            os.kill(os.getpid(), target[2])


def fail_point(point: str) -> None:
    """Count a visit to `point`; raise an injected ENOSPC on the configured visit(s)."""
    spec = os.environ.get(FAIL_ENV_VAR)
    if not spec:
        return
    where, _, n = spec.partition(":")
    every = n.endswith("+")
    n = n.removesuffix("+")
    if where not in FAIL_POINTS or not n.isdigit() or int(n) < 1:
        raise ValueError(f"{FAIL_ENV_VAR}={spec!r}: expected <point>:<n>[+] with point one of {FAIL_POINTS}, n >= 1")
    if where != point:
        return
    with _lock:
        _hits[f"fail:{point}"] += 1
        visit = _hits[f"fail:{point}"]
    if visit == int(n) or (every and visit > int(n)):
        raise OSError(errno.ENOSPC, "No space left on device (injected by AGENTRL_FAIL_AT)")


def reset() -> None:
    """Forget the visits counted so far (tests that set a fault in a process that already ran others)."""
    with _lock:
        _hits.clear()
