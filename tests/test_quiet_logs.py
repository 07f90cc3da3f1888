"""A run's log is readable when stderr is a file: progress as a bounded number of plain lines, not one
tqdm redraw per step run together by carriage returns (agentrl.telemetry.metrics.LineProgress); and DeepSpeed's
"Setting accelerator to CPU" notice, which a CPU install can do nothing about, is gone at its source
(agentrl.utils.stdio.pin_cpu_accelerator: DS_ACCELERATOR=cpu, as DeepSpeed documents)."""

from __future__ import annotations

import io
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest
from tqdm import tqdm

from agentrl.utils import stdio
from agentrl.telemetry.metrics import LineProgress, MetricsSink, TqdmHandler

ROOT = Path(__file__).resolve().parents[1]
NOTICE = "Setting accelerator to CPU"


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def drive(bar: LineProgress, clock: FakeClock, steps: int, step_s: float) -> list[int]:
    """`steps` updates `step_s` apart; the step counts at which a line was written."""
    shown = []
    for _ in range(steps):
        clock.now += step_s
        bar.set_postfix({"reward": f"{bar.n / 400:.3f}"})
        before = bar.lines
        bar.update(1)
        if bar.lines > before:
            shown.append(bar.n)
    return shown


def test_a_fast_400_step_run_writes_a_line_at_the_start_and_every_5_percent(caplog):
    caplog.set_level(logging.INFO, logger="agentrl.telemetry.metrics")
    clock = FakeClock()
    bar = LineProgress(400, desc="RL steps", clock=clock)
    shown = drive(bar, clock, 400, step_s=0.5)
    bar.close()
    assert shown == [1, *range(20, 401, 20)] and bar.lines == 21  # close adds nothing: 400 was shown
    messages = [r.getMessage() for r in caplog.records if r.name == "agentrl.telemetry.metrics"]
    assert len(messages) == 21
    assert messages[0] == "RL steps 1/400 (0%) reward=0.000 | 00:00 elapsed, 03:19 left"
    assert messages[10] == "RL steps 200/400 (50%) reward=0.497 | 01:40 elapsed, 01:40 left"
    assert messages[-1] == "RL steps 400/400 (100%) reward=0.998 | 03:20 elapsed, 00:00 left"


def test_a_slow_run_adds_a_line_per_quiet_five_minutes_and_stays_under_200():
    clock = FakeClock()
    bar = LineProgress(400, clock=clock)
    shown = drive(bar, clock, 400, step_s=60.0)  # 400 minutes: a milestone every 20 minutes
    # A line 300 s (5 steps) after the one before, whichever wrote it: from the first milestone (step 20)
    # on, the quiet lines and the milestones fall on the same steps.
    assert shown == [1, 6, 11, 16, *range(20, 401, 5)]
    assert bar.lines == 81 <= 22 + 400 * 60 // 300


def test_a_run_that_stops_early_says_where_at_close():
    clock = FakeClock()
    bar = LineProgress(400, initial=100, clock=clock)  # resumed at step 100
    assert drive(bar, clock, 37, step_s=1.0) == [101, 120]
    bar.close()
    assert (bar.n, bar.lines) == (137, 3)
    bar.close()  # the training loop's `finally` may close it again: no second line
    assert bar.lines == 3


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.mark.parametrize("stream_type", [io.StringIO, Terminal])
def test_the_sink_draws_tqdm_on_a_terminal_and_plain_lines_into_a_file(tmp_path, monkeypatch, stream_type):
    stream = stream_type()
    monkeypatch.setattr(sys, "stderr", stream)
    handler = TqdmHandler()
    handler.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
    logger = logging.getLogger("agentrl.telemetry.metrics")
    monkeypatch.setattr(logger, "propagate", False)  # this handler alone: the root's may write to stderr too
    level = logger.level
    logger.setLevel(logging.INFO)  # setLevel, not the attribute: it also clears the logger's cache
    logger.addHandler(handler)
    try:
        sink = MetricsSink(tmp_path, 400, show=True)
        for step in range(400):
            sink.log({"step": step, "reward_mean": step / 400, "success_rate": 0.5, "rollout_tokens_per_s": 900.0})
        sink.close()
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)
    text = stream.getvalue()
    if stream_type is Terminal:
        assert isinstance(sink.bar, tqdm) and "\r" in text  # redrawn in place
        return
    lines = text.splitlines()
    assert "\r" not in text and 21 <= len(lines) <= 22, text[-2000:]  # at most 22 by design, whatever the clock
    assert lines[-1].startswith("INFO agentrl.telemetry.metrics: RL steps 400/400 (100%) reward=0.998 succ=0.50 "
                                "tok_s=900 stale=0 | ")
    assert sum(1 for line in lines if "/400 (" in line) == len(lines)


@pytest.mark.parametrize(("build", "extra_env", "pinned"), [
    ({"cuda": None, "hip": None, "xpu": None}, {}, True),  # a CPU build: nothing DeepSpeed could miss
    ({"cuda": "12.8", "hip": None, "xpu": None}, {}, False),  # a GPU build keeps DeepSpeed's detection
    ({"cuda": None, "hip": "6.3", "xpu": None}, {}, False),
    ({"cuda": None, "hip": None, "xpu": None}, {"DS_ACCELERATOR": "xpu"}, False),  # the user's own choice
])
def test_the_cpu_is_named_only_where_deepspeed_could_pick_nothing_else(monkeypatch, build, extra_env, pinned):
    monkeypatch.setattr(stdio, "_torch_build", lambda: build)
    monkeypatch.setattr(sys, "platform", "linux")
    env = dict(extra_env)
    assert stdio.pin_cpu_accelerator(env) is pinned
    assert env.get("DS_ACCELERATOR") == ("cpu" if pinned else extra_env.get("DS_ACCELERATOR"))


def test_an_accelerator_package_leaves_deepspeed_its_own_choice(monkeypatch):
    monkeypatch.setattr(stdio, "_torch_build", lambda: {"cuda": None, "hip": None, "xpu": None})
    monkeypatch.setattr(sys, "platform", "linux")
    real = stdio.importlib.util.find_spec
    monkeypatch.setattr(stdio.importlib.util, "find_spec",
                        lambda name, *a: object() if name == "torch_npu" else real(name, *a))
    env: dict[str, str] = {}
    assert stdio.pin_cpu_accelerator(env) is False and env == {}


def test_the_torch_build_is_read_without_importing_torch():
    code = ("import sys; from agentrl.utils.stdio import _torch_build; build = _torch_build(); cold = 'torch' not in "
            "sys.modules; import torch; print(cold, build == {k: getattr(torch.version, k, None) for k in "
            "('cuda', 'hip', 'xpu')}, build == _torch_build())")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
                          capture_output=True, text=True, timeout=300)
    assert (proc.returncode, proc.stdout) == (0, "True True True\n"), proc.stderr[-2000:]


# DeepSpeed picks its accelerator once a process (get_accelerator caches it): the child imports it after
# route_library_output, then forgets the choice and picks again with DS_ACCELERATOR unset, as a process
# without agentrl's set-up would, so one cold import shows both sides.
BOTH_SIDES = """
import os, sys
from agentrl.utils.stdio import route_library_output
route_library_output()
from deepspeed.accelerator import get_accelerator, real_accelerator
print("pinned", os.environ.get("DS_ACCELERATOR"), get_accelerator()._name, file=sys.stderr, flush=True)
real_accelerator.ds_accelerator = None
del os.environ["DS_ACCELERATOR"]
print("unpinned", get_accelerator()._name, file=sys.stderr, flush=True)
"""


def test_deepspeed_picks_the_cpu_without_its_notice_on_a_cpu_install():
    if not stdio.pin_cpu_accelerator({}):  # AGENTRL_VLLM=gpu: DeepSpeed's own detection, and its notice, stay
        pytest.skip("torch is built with a GPU backend: the pin applies to CPU-only installs")
    env = {k: v for k, v in os.environ.items() if k != "DS_ACCELERATOR"}
    proc = subprocess.run([sys.executable, "-c", BOTH_SIDES], cwd=ROOT, env={**env, "PYTHONPATH": str(ROOT)},
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0 and proc.stdout == "", proc.stderr[-3000:]
    pinned, unpinned = proc.stderr.split("pinned cpu cpu\n")
    assert NOTICE not in pinned, pinned[-2000:]
    # The control: without the pin the same DeepSpeed gives the notice (it went to stderr: agentrl.utils.stdio).
    assert NOTICE in unpinned and unpinned.rstrip().endswith("unpinned cpu"), unpinned[-2000:]
