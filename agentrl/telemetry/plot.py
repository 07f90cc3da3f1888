"""The end-of-run figure `<out_dir>/curves.png`, drawn from the metrics.jsonl records.

Top row against the learner step, bottom row against wall-clock minutes (`elapsed_s`, continued across
resumes): the training batch's mean reward and success rate, and the held-out eval score. On the step
axis an eval sits at the number of updates applied when it ran (a record's eval at step s follows update
s, so s + 1); the eval before RL sits at 0 and the eval after RL at the end of the run.
"""

from __future__ import annotations

import io
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from agentrl.utils.files import atomic_write

DPI = 110
PANELS = (("reward_mean", "mean reward (train batch)"), ("success_rate", "success rate (train batch)"),
          ("eval_score", "held-out eval score"))
SMOOTH_FROM = 20  # points; below this the raw curve is readable on its own


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _xs(records: Sequence[dict[str, Any]], time_axis: bool) -> list[float | None]:
    if time_axis:
        return [r["elapsed_s"] / 60 if _finite(r.get("elapsed_s")) else None for r in records]
    return [float(r["step"]) if _finite(r.get("step")) else None for r in records]


def _points(records: Sequence[dict[str, Any]], xs: list[float | None], key: str) -> tuple[list[float], list[float]]:
    pairs = [(x, float(r[key])) for r, x in zip(records, xs) if x is not None and _finite(r.get(key))]
    return [p[0] for p in pairs], [p[1] for p in pairs]


def _trailing_mean(ys: list[float], window: int) -> list[float]:
    out, total = [], 0.0
    for i, y in enumerate(ys):
        total += y - (ys[i - window] if i >= window else 0.0)
        out.append(total / min(i + 1, window))
    return out


def _draw_series(ax: Any, xs: list[float], ys: list[float]) -> None:
    if len(xs) < SMOOTH_FROM:
        ax.plot(xs, ys, marker="o", markersize=3, linewidth=1.2, color="C0")
        return
    window = max(2, len(xs) // 20)
    ax.plot(xs, ys, linewidth=0.8, alpha=0.35, color="C0", label="per step")
    ax.plot(xs, _trailing_mean(ys, window), linewidth=1.8, color="C0", label=f"mean of last {window}")
    ax.legend(loc="best", fontsize=8)


def _draw_eval(ax: Any, xs: list[float], ys: list[float], before: float | None, after: float | None,
               end: float) -> None:
    """In-run evals as a line from the score before RL to the score after it, the two ends marked."""
    line_x = ([0.0] if before is not None else []) + xs + ([end] if after is not None else [])
    line_y = ([before] if before is not None else []) + ys + ([after] if after is not None else [])
    ax.plot(line_x, line_y, marker="o", markersize=4, linewidth=1.2, color="C2", label="held-out eval")
    for x, y, label, marker in ((0.0, before, "before RL", "s"), (end, after, "after RL", "*")):
        if y is not None:
            ax.plot([x], [y], marker=marker, markersize=11, linestyle="none", label=f"{label}: {y:.3f}")
    if line_x:
        ax.legend(loc="best", fontsize=8)


def plot_run(records: Sequence[dict[str, Any]], path: str | Path, eval_before: float | None = None,
             eval_after: float | None = None, title: str = "") -> Path:
    """Writes the 2 x 3 figure of a run's records to `path` (PNG, replaced atomically) and returns the path."""
    # Imported here, not with the module: matplotlib costs about 0.9 s of every command's start-up and
    # is used once, at the end of a run. Figure, not pyplot: no GUI backend is chosen, no window can
    # open, and no global figure registry keeps the figure alive after it is saved (the same as
    # matplotlib.use("Agg") without changing it for the rest of the process).
    from matplotlib.figure import Figure

    path = Path(path)
    fig = Figure(figsize=(15, 8.5), dpi=DPI, layout="constrained")
    axes = fig.subplots(2, 3, squeeze=False)
    for row, (time_axis, xlabel) in enumerate(((False, "learner step"), (True, "wall-clock time (min)"))):
        xs = _xs(records, time_axis)
        seen = [x for x in xs if x is not None]
        # The step axis counts updates applied for evals (see the module docstring); time needs no shift.
        shift = 0.0 if time_axis else 1.0
        end = max(seen) + shift if seen else 0.0
        for col, (key, label) in enumerate(PANELS):
            ax = axes[row][col]
            px, py = _points(records, xs, key)
            if key == "eval_score":
                _draw_eval(ax, [x + shift for x in px], py, eval_before, eval_after, end)
                has_data = bool(px) or eval_before is not None or eval_after is not None
            else:
                _draw_series(ax, px, py)
                has_data = bool(px)
            if not has_data:
                ax.text(0.5, 0.5, f"no {key} in the records", transform=ax.transAxes, ha="center",
                        va="center", color="gray")
            x_name = "learner updates applied" if key == "eval_score" and not time_axis else xlabel
            ax.set(xlabel=x_name, ylabel=label, title=f"{label.split(' (')[0]} vs {xlabel.split(' (')[0]}")
            ax.grid(True, alpha=0.3)
    fig.suptitle(title or "agentrl run", fontsize=13)
    png = io.BytesIO()
    fig.savefig(png, format="png", dpi=DPI)
    atomic_write(path, png.getvalue())  # a reader never sees half a PNG
    return path
