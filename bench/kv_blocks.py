"""KV-cache blocks of 32 tokens (agentrl's CPU default, agentrl.rollout.engine.kv_block_size) against vLLM's
CPU default of 128: the held-out eval of the SmolLM2 examples, side by side.

    python bench/kv_blocks.py [--configs reasoning_gym,smollm2_quiz] [--rounds 1]

Prefix caching reuses whole blocks only. reasoning_gym's 128 eval prompts open with the same system
message and three solved items (about 120 of their 127 tokens), and a quiz episode's later turns extend
its earlier ones; at 128-token blocks none of that is reused, since no prompt fills a block. Each side is
`python -m agentrl.train --config examples/agents/<config>.yaml train.steps=0 train.eval_after=false
engine.block_size=<B>` in a subprocess (the eval before RL alone, as a user runs it); its summary gives
the eval's seconds and score. Sides alternate per round (128 first, then 32; the next round the other
way). Both sides sample the same episodes (per-episode seeds), so the scores match; a mismatch is printed.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

from _common import median, print_host, progress, run_logged, table

SIDES = (128, 32)


def eval_once(config: str, block_size: int, out: Path) -> tuple[float, float]:
    """(eval seconds, score) of one eval-only run."""
    cmd = [sys.executable, "-m", "agentrl.train", "--config", f"examples/agents/{config}.yaml", "train.steps=0",
           "train.eval_after=false", f"engine.block_size={block_size}", f"train.out_dir={out}"]
    run_logged(cmd, out.with_suffix(".log"))
    before = json.loads((out / "summary.json").read_text())["eval_before"]
    return before["seconds"], before["score"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--configs", default="reasoning_gym,smollm2_quiz")
    ap.add_argument("--rounds", type=int, default=1)
    args = ap.parse_args()
    rows, ratios = [], []
    with tempfile.TemporaryDirectory(prefix="kv_blocks_") as tmp:
        for config in args.configs.split(","):
            times: dict[int, list[float]] = {b: [] for b in SIDES}
            scores: dict[int, set[float]] = {b: set() for b in SIDES}
            for r in range(args.rounds):
                for b in (SIDES if r % 2 == 0 else SIDES[::-1]):
                    progress(f"{config}: round {r + 1}, blocks of {b}")
                    seconds, score = eval_once(config, b, Path(tmp) / f"{config}-{b}-{r}")
                    times[b].append(seconds)
                    scores[b].add(round(score, 6))
            slow, fast = median(times[128]), median(times[32])
            ratios.append(slow / fast)
            same = "same" if scores[128] == scores[32] else f"DIFFER {sorted(scores[128])} vs {sorted(scores[32])}"
            rows.append([config, " ".join(f"{t:.1f}" for t in times[128]), " ".join(f"{t:.1f}" for t in times[32]),
                         f"{slow / fast:.2f}x", f"{sorted(scores[32])[0]:.3f} ({same})"])
    print(table(["config", "eval s, blocks of 128", "eval s, blocks of 32", "128 / 32", "held-out score"], rows,
                title="held-out eval (128 episodes, SmolLM2-135M) on one engine"))


if __name__ == "__main__":
    print_host()
    main()
