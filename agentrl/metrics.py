"""Per-step metrics: one JSON line per learner step, a console progress bar, and a final summary.

Metric names (keys of each jsonl record):
  step, version, reward_mean, success_rate, eval_score (at eval points), staleness_hist,
  rollout_tokens_per_s, learner_step_s, batch_wait_s, push_latency_s, push_failures,
  overlap_tokens (tokens generated while the learner stepped), policy/* (clip_frac, is_weight_*,
  is_ess, mismatch_k1, mismatch_abs, ...), episodes/* (status counts), buffer/* (buffer counters).
"""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path
from typing import Any

from tqdm import tqdm


class TqdmHandler(logging.Handler):
    """Log lines that do not break the progress bar."""

    def emit(self, record: logging.LogRecord) -> None:
        tqdm.write(self.format(record))


def setup_logging(level: int = logging.INFO) -> None:
    handler = TqdmHandler()
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s", "%H:%M:%S"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    # One INFO line per HTTP request (verifier, tool calls) would drown the training log.
    for noisy in ("httpx", "httpcore"):
        logging.getLogger(noisy).setLevel(max(level, logging.WARNING))


def _clean(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {str(k): _clean(v) for k, v in value.items()}
    return value


class MetricsSink:
    """Appends records to `<out_dir>/metrics.jsonl` and shows a progress bar over the steps."""

    def __init__(self, out_dir: str | Path, total_steps: int, show: bool = True) -> None:
        self.dir = Path(out_dir)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.path = self.dir / "metrics.jsonl"
        self.path.write_text("")
        self.bar = tqdm(total=total_steps, desc="RL steps", dynamic_ncols=True, disable=not show)

    def log(self, record: dict[str, Any]) -> None:
        with self.path.open("a") as f:
            f.write(json.dumps(_clean(record)) + "\n")
        self.bar.update(1)
        self.bar.set_postfix(
            reward=f"{record.get('reward_mean', float('nan')):.3f}",
            succ=f"{record.get('success_rate', float('nan')):.2f}",
            tok_s=f"{record.get('rollout_tokens_per_s', 0):.0f}",
            stale=record.get("staleness_max", 0),
        )

    def write_summary(self, summary: dict[str, Any]) -> Path:
        self.bar.close()
        path = self.dir / "summary.json"
        path.write_text(json.dumps(_clean(summary), indent=2) + "\n")
        return path


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
    lines.append(f"RL time {train.get('seconds', 0):.0f}s, total wall time {summary.get('wall_s', 0):.0f}s")
    if "saved_model" in summary:
        lines.append(f"trained model                   : {summary['saved_model']}")
    print("\n".join(lines), flush=True)
