"""Per-step metrics: one JSON line per learner step (plus the extra sinks of `train.loggers`), a console
progress bar, and a final summary with the curves plot.

Metric names (keys of each jsonl record):
  step, version, reward_mean, success_rate, eval_score (at eval points), staleness_hist,
  rollout_tokens_per_s, learner_step_s (the optimizer steps' passes), learner_call_s (the whole learner
  step: also the reference, pi_prox and value passes and the advantages), batch_wait_s, push_latency_s, push_failures,
  overlap_tokens (tokens generated while the learner stepped), loss and grad_norm (the batch's last optimizer
  step that trained the actor), policy/* (clip_frac, is_weight_*,
  is_ess, mismatch_k1, mismatch_abs, ...: each from the batch's last optimizer step that has it), policy_steps (with
  learner.mini_batches > 1: each step's policy metrics, a list), episodes/* (status counts), buffer/* (buffer counters).
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
import sys
import time
import warnings
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from pydantic import SecretStr
from tqdm import tqdm

from agentrl.config.secrets import RedactSecrets, masked
from agentrl.utils.files import atomic_write, read_jsonl, restart_jsonl_at
from agentrl.telemetry.plot import plot_run
from agentrl.utils.stdio import route_library_output
from agentrl.telemetry.trackers import flat_scalars, make_trackers

RUN_CONFIG = "run_config.json"  # the run's config as the sink writes it at start

log = logging.getLogger(__name__)


class LineProgress:
    """The progress bar where stderr is not a terminal (a log file, CI): plain log lines in place of
    tqdm's carriage-return redraws, which a log file keeps, every one, run together on a single line.
    A line at the first step (the run is going, at what rate), at every `every_pct` percent of the run,
    after `quiet_s` seconds without one (a slow run still shows it is alive), and at close if steps
    were made since the last: a 400-step run writes 22 lines at most, plus one per quiet 5 minutes.
    The attributes MetricsSink uses are tqdm's (`n`, `update`, `set_postfix`, `close`)."""

    def __init__(self, total: int, initial: int = 0, desc: str = "steps", every_pct: int = 5,
                 quiet_s: float = 300.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.total, self.n, self.desc = max(total, 1), initial, desc
        self._every, self._quiet_s, self._clock = max(1, every_pct), quiet_s, clock
        self._start_n, self._shown_n = initial, initial
        self._started = self._shown_at = clock()
        self._postfix: dict[str, str] = {}
        self.lines = 0

    def set_postfix(self, postfix: dict[str, str], refresh: bool = False) -> None:
        """tqdm's signature; the values go into the next line written."""
        self._postfix = dict(postfix)

    def update(self, n: int = 1) -> None:
        self.n += n
        if (self._shown_n == self._start_n or self._milestone(self.n) > self._milestone(self._shown_n)
                or self._clock() - self._shown_at >= self._quiet_s):
            self._show()

    def _milestone(self, step: int) -> int:
        """How many `every_pct` percent steps of the run `step` has passed."""
        return step * 100 // (self.total * self._every)

    def close(self) -> None:
        if self.n > self._shown_n:
            self._show()

    def _show(self) -> None:
        now = self._clock()
        elapsed = now - self._started
        done = self.n - self._start_n
        left = tqdm.format_interval((self.total - self.n) * elapsed / done) if done and elapsed > 0 else "?"
        postfix = " ".join(f"{k}={v}" for k, v in self._postfix.items())
        log.info("%s %d/%d (%d%%) %s | %s elapsed, %s left", self.desc, self.n, self.total,
                 100 * self.n // self.total, postfix, tqdm.format_interval(elapsed), left)
        self._shown_n, self._shown_at = self.n, now
        self.lines += 1


def progress_bar(total: int, initial: int, desc: str, show: bool) -> tqdm | LineProgress:
    """tqdm's bar on a terminal; `LineProgress` when stderr is a file or a pipe; a silent tqdm when
    `show` is off (its `n` still counts)."""
    if show and not sys.stderr.isatty():
        return LineProgress(total, initial, desc)
    return tqdm(total=total, initial=initial, desc=desc, dynamic_ncols=True, disable=not show, file=sys.stderr)


class TqdmHandler(logging.Handler):
    """Log lines that do not break the progress bar, on stderr as the bar is: stdout carries only what
    a command prints as its result (the summary, a report), so it can be piped."""

    def emit(self, record: logging.LogRecord) -> None:
        tqdm.write(self.format(record), file=sys.stderr)


def setup_logging(level: int = logging.INFO) -> None:
    """agentrl's log lines and every library's on stderr (`agentrl.utils.stdio`), one format."""
    route_library_output()
    handler = TqdmHandler()
    handler.addFilter(RedactSecrets())  # a secret quoted by accident (an error echoing a header) is masked
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s", "%H:%M:%S"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    # One INFO line per HTTP request (verifier, tool calls) or per episode (verifiers' rollouts and the
    # access log of its interception server, 3 lines an episode) would drown the training log.
    for noisy in ("httpx", "httpcore", "httpx2", "httpcore2", "openai", "aiohttp.access", "verifiers"):
        logging.getLogger(noisy).setLevel(max(level, logging.WARNING))
    quiet_cpu_install_notices(level)
    quiet_library_bars()


def quiet_library_bars() -> None:
    """Where stderr is a file or a pipe, the one-off bars of Hugging Face loads and saves ("Loading
    weights", "Writing model shards") would leave their carriage-return redraws in it, a few at every
    checkpoint: HF_HUB_DISABLE_PROGRESS_BARS (read by huggingface_hub at import, and by transformers
    through it) turns them off in this process and its children. A terminal keeps them, and a value the
    user set stands."""
    if not sys.stderr.isatty():
        os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")


def quiet_cpu_install_notices(level: int) -> None:
    """The lines every CPU run printed that say nothing a user can act on. Triton is left out of the CPU
    install on purpose (scripts/install.sh): vLLM says so at import, at INFO and through this handler (its
    own logging, VLLM_LOGGING_LEVEL included, is set up only when an engine starts), and torch warns once
    per custom op registered. vLLM's scan of every module's attributes reads the deprecated
    `torch.distributed.reduce_op`, which raises torch's FutureWarning, twice a process. Forked processes
    inherit these settings; a new interpreter (the engine cores' fork server, agentrl.rollout.core_process,
    and whatever vLLM spawns) gets the warning filter through PYTHONWARNINGS, read at its start."""
    logging.getLogger("vllm").setLevel(max(level, logging.WARNING))  # until vLLM's own set-up replaces it
    logging.getLogger("torch._library.triton").setLevel(max(level, logging.ERROR))
    message = "`torch.distributed.reduce_op` is deprecated"  # the start of the message; no ',' nor ':'
    warnings.filterwarnings("ignore", message=re.escape(message), category=FutureWarning)
    spec = f"ignore:{message}:FutureWarning"
    if spec not in os.environ.get("PYTHONWARNINGS", "").split(","):
        os.environ["PYTHONWARNINGS"] = ",".join(filter(None, [os.environ.get("PYTHONWARNINGS"), spec]))


def _clean(value: Any) -> Any:
    """The record as strict JSON: non-finite floats become null (json.dumps would write NaN), a secret
    its mask (the config's own dump masks them already; this holds for any SecretStr handed in)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, (SecretStr, str)):
        return masked(value)
    if isinstance(value, dict):
        return {str(k): _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    return value


def read_metrics(path: str | Path) -> list[dict[str, Any]]:
    """The records of a metrics.jsonl, in file order, without the torn line a killed writer can leave."""
    if not Path(path).exists():
        return []
    return [record for _, record in read_jsonl(path, strict=False) if isinstance(record, dict)]


def _num(record: dict[str, Any], key: str, spec: str) -> str:
    value = record.get(key)
    return format(value, spec) if isinstance(value, (int, float)) else "-"


def _rl_postfix(record: dict[str, Any]) -> dict[str, str]:
    return {"reward": _num(record, "reward_mean", ".3f"), "succ": _num(record, "success_rate", ".2f"),
            "tok_s": _num(record, "rollout_tokens_per_s", ".0f"), "stale": str(record.get("staleness_max", 0))}


class MetricsSink:
    """Appends records to `<out_dir>/metrics.jsonl`, forwards their scalars to the extra sinks of
    `train.loggers` (agentrl.telemetry.trackers), shows a progress bar over the steps, and at the end writes the
    summary and the curves plot."""

    def __init__(self, out_dir: str | Path, total_steps: int, show: bool = True,
                 loggers: Iterable[str] = ("jsonl",), start_step: int = 0, wandb_project: str = "agentrl",
                 run_config: dict[str, Any] | None = None, desc: str = "RL steps",
                 postfix: Callable[[dict[str, Any]], dict[str, str]] | None = None) -> None:
        self.dir = Path(out_dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.path = self.dir / "metrics.jsonl"
        # Trackers first: a missing package fails the run before metrics.jsonl is touched.
        self.trackers = make_trackers(loggers, self.dir, start_step, wandb_project, run_config)
        if run_config is not None:  # the config from the first step on (agentrl.view reads a running run's);
            # not config.json: a stage saves its model's Hugging Face config.json into the same folder
            atomic_write(self.dir / RUN_CONFIG, json.dumps(_clean(run_config), indent=2) + "\n")
        restart_jsonl_at(self.path, start_step)
        self._file = self.path.open("a")
        self._next_step = start_step
        self._finished = False  # write_summary ran: the trackers close as a finished run, not a failed one
        self._closed = False
        self.bar = progress_bar(total_steps, start_step, desc, show)
        self._postfix = postfix or _rl_postfix

    def log(self, record: dict[str, Any]) -> None:
        self._file.write(json.dumps(_clean(record)) + "\n")
        self._file.flush()  # a killed run keeps every whole line; resume drops a torn last one
        step = record.get("step", self._next_step)
        self._next_step = step + 1
        scalars = flat_scalars(record)
        for tracker in self.trackers:
            tracker.log(scalars, step)
        self.bar.set_postfix(self._postfix(record), refresh=False)  # shown by the update, once
        self.bar.update(1)

    def write_summary(self, summary: dict[str, Any]) -> Path:
        """Writes curves.png (from every record in metrics.jsonl, also those before a resume; its path goes
        into `summary["plot"]`) and summary.json, then closes the sink."""
        self._file.flush()
        records = read_metrics(self.path)
        try:
            summary["plot"] = str(plot_run(records, self.dir / "curves.png", _score(summary.get("eval_before")),
                                           _score(summary.get("eval_after")), f"{self.dir.resolve().name}: "
                                           f"{len(records)} learner steps"))
        except Exception:  # a plot must never cost the run its summary
            log.exception("could not draw %s", self.dir / "curves.png")
        path = self.dir / "summary.json"
        atomic_write(path, json.dumps(_clean(summary), indent=2) + "\n")
        self._finished = True
        self.close()
        return path

    def close(self) -> None:
        """Closes the bar, metrics.jsonl and the trackers; safe to call again (the training loop's `finally`)."""
        if self._closed:
            return
        self._closed = True
        self.bar.close()
        self._file.close()
        for tracker in self.trackers:
            try:
                tracker.close(ok=self._finished)
            except Exception:  # on the error path, raising here would hide the error that got us here
                log.exception("closing %s failed", type(tracker).__name__)


def _score(result: dict[str, Any] | None) -> float | None:
    return result.get("score") if isinstance(result, dict) else None


def print_summary(summary: dict[str, Any]) -> None:
    before, after = summary.get("eval_before"), summary.get("eval_after")
    lines = ["", "=== agentrl summary ==="]
    if before:
        lines.append(f"held-out eval score, warm start : {before['score']:.3f}  (n={before['n']}, failed={before['failed']})")
    if after:
        lines.append(f"held-out eval score, after RL   : {after['score']:.3f}  (n={after['n']}, failed={after['failed']})")
    if before and after:
        lines.append(f"improvement                     : {after['score'] - before['score']:+.3f}")
    for label, res in (("warm start", before), ("after RL  ", after)):
        if res and res.get("tool_call_success_rate") is not None:
            lines.append(f"tool-call success, {label}   : {res['tool_call_success_rate']:.3f}")
    train = summary.get("train", {})
    lines.append(f"max staleness trained           : {train.get('max_staleness_seen')}")
    signal = train.get("learning_signal")
    if signal:
        note = f"  (no learning signal from step {signal['warned_at_step']}: see the warning)" \
            if signal["warned_at_step"] is not None else ""
        lines.append(f"groups with equal rewards       : {signal['equal_reward_groups_frac']:.0%}{note}")
    evals = [res["seconds"] for res in (before, after) if res and res.get("seconds") is not None]
    eval_time = f", held-out evals {sum(evals):.0f}s" if evals else ""
    lines.append(f"RL time {train.get('seconds', 0):.0f}s{eval_time}, total wall time {summary.get('wall_s', 0):.0f}s")
    if summary.get("out_dir"):
        lines.append(f"run folder                      : {summary['out_dir']}")
    if "saved_model" in summary:
        lines.append(f"trained model                   : {summary['saved_model']}")
    if summary.get("plot"):
        lines.append(f"curves                          : {summary['plot']}")
    print("\n".join(lines), flush=True)
