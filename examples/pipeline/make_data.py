"""The datasets of the stages before RL, on the default task (guess the number from 1 to 15).

    python examples/pipeline/make_data.py --out runs/pipeline/data [--seed 0] [--pairs 2000] [--prm 3000]

Writes into `--out` (each file one JSON object a line, the same bytes for the same arguments):

  demos.jsonl     {"messages": [...]}                     SFT: the warm start's teacher, exactly the episodes
                                                          the embedded default model is warm-started on
                                                          (`demonstration(t, rng, 0.3)` on
                                                          `demo_tasks(4000, seed, "demo")`, one rng seeded by
                                                          `seed` for all of them)
  pairs.jsonl     {"chosen": [...], "rejected": [...]}    RM, DPO: `preference_pairs`; chosen finds the number,
                                                          rejected runs out of turns
  kto.jsonl       {"messages": [...], "label": bool}      KTO: the same episodes unpaired, every chosen one
                                                          desirable, every rejected one undesirable, shuffled
  prm.jsonl       {"messages": [...], "label": [bool]}    PRM: one label per assistant turn
  prm_eval.jsonl  (same)                                  PRM, held out: another split's tasks and episodes

A PRM step (an assistant guess) is correct iff it lies in the interval still consistent with the earlier
replies: lo=1, hi=15, "Higher." after guess g sets lo=max(lo, g+1), "Lower." sets hi=min(hi, g-1). The
teacher of `demonstration` never leaves that interval, so the PRM episodes come from a careless player:
each episode draws a carelessness p ~ U(0, 0.7), and each guess is, with probability p, uniform over the
whole range 1..15 (ignoring the replies, so right only by chance), else the teacher's (the midpoint with
probability 0.3, else uniform over the consistent interval). Replies are the env's (`GuessNumberEnv`):
the episode ends at the right number (no reply) or after 4 guesses.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run as a script from anywhere

from envs.guess_number import GuessNumberEnv, demo_tasks, demonstration, preference_pairs, prompt_text

Message = dict[str, str]
LOW, HIGH, MAX_TURNS = 1, 15, 4


def step_labels(messages: list[Message], low: int = LOW, high: int = HIGH) -> list[bool]:
    """Per assistant turn: is its guess inside the interval consistent with the replies before it?"""
    lo, hi = low, high
    labels: list[bool] = []
    guess = None
    for m in messages:
        if m["role"] == "assistant":
            guess = int(m["content"])
            labels.append(lo <= guess <= hi)
        elif m["role"] == "user" and guess is not None:
            if m["content"] == "Higher.":
                lo = max(lo, guess + 1)
            elif m["content"] == "Lower.":
                hi = min(hi, guess - 1)
    return labels


def careless_episode(task: dict[str, Any], rng: random.Random, careless: float, optimal_prob: float = 0.3,
                     max_turns: int = MAX_TURNS) -> list[Message]:
    """An episode of a player who ignores the replies with probability `careless` per guess."""
    low, high, target = task["low"], task["high"], task["target"]
    lo, hi = low, high
    messages: list[Message] = [{"role": "user", "content": prompt_text(low, high)}]
    for turn in range(max_turns):
        if rng.random() < careless:
            guess = rng.randint(low, high)
        else:
            guess = (lo + hi) // 2 if rng.random() < optimal_prob else rng.randint(lo, hi)
        messages.append({"role": "assistant", "content": str(guess)})
        if guess == target or turn == max_turns - 1:
            break
        if guess < target:
            lo = max(lo, guess + 1)
            messages.append({"role": "user", "content": "Higher."})
        else:
            hi = min(hi, guess - 1)
            messages.append({"role": "user", "content": "Lower."})
    return messages


def prm_rows(n: int, seed: int, split: str) -> list[dict[str, Any]]:
    rng = random.Random(f"{split}:{seed}:prm")
    rows = []
    for task in GuessNumberEnv.make_tasks(n, seed, split):
        messages = careless_episode(task, rng, rng.uniform(0.0, 0.7))
        rows.append({"messages": messages, "label": step_labels(messages, task["low"], task["high"])})
    return rows


def demo_rows(n: int, seed: int, optimal_prob: float = 0.3) -> list[dict[str, Any]]:
    """The warm start's demonstrations (`agentrl.models.default.demonstration_samples`), as messages."""
    rng = random.Random(seed)
    return [{"messages": demonstration(task, rng, optimal_prob)} for task in demo_tasks(n, seed, "demo")]


def kto_rows(pairs: list[tuple[list[Message], list[Message]]], seed: int) -> list[dict[str, Any]]:
    rows = [{"messages": chosen, "label": True} for chosen, _ in pairs]
    rows += [{"messages": rejected, "label": False} for _, rejected in pairs]
    random.Random(f"kto:{seed}").shuffle(rows)
    return rows


def write_jsonl(path: Path, rows: list[dict[str, Any]]) -> None:
    path.write_text("".join(json.dumps(r, separators=(",", ":")) + "\n" for r in rows))


def make(out: Path, seed: int = 0, demos: int = 4000, pairs: int = 2000, prm: int = 3000,
         prm_eval: int = 500) -> dict[str, int]:
    """Write every dataset into `out`; returns the row count of each file."""
    out.mkdir(parents=True, exist_ok=True)
    pair_list = preference_pairs(pairs, seed, "preferences")
    files = {
        "demos.jsonl": demo_rows(demos, seed),
        "pairs.jsonl": [{"chosen": c, "rejected": r} for c, r in pair_list],
        "kto.jsonl": kto_rows(pair_list, seed),
        "prm.jsonl": prm_rows(prm, seed, "prm"),
        "prm_eval.jsonl": prm_rows(prm_eval, seed, "prm_eval"),
    }
    for name, rows in files.items():
        write_jsonl(out / name, rows)
    return {name: len(rows) for name, rows in files.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="runs/pipeline/data", help="folder to write the .jsonl files into")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--demos", type=int, default=4000, help="SFT demonstrations (4000: the warm start's)")
    ap.add_argument("--pairs", type=int, default=2000, help="preference pairs (KTO: twice as many rows)")
    ap.add_argument("--prm", type=int, default=3000, help="PRM training episodes")
    ap.add_argument("--prm-eval", type=int, default=500, help="held-out PRM episodes")
    args = ap.parse_args()
    counts = make(Path(args.out), args.seed, args.demos, args.pairs, args.prm, args.prm_eval)
    labels = [lab for line in (Path(args.out) / "prm.jsonl").read_text().splitlines()
              for lab in json.loads(line)["label"]]
    print(f"wrote {args.out}: " + ", ".join(f"{name} {n}" for name, n in counts.items())
          + f"; PRM steps {len(labels)}, {sum(labels) / len(labels):.0%} correct")


if __name__ == "__main__":
    main()
