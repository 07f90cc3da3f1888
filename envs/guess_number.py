"""Multi-turn default task: find a hidden integer from "Higher." / "Lower." replies.

The model must use the feedback of earlier turns: a policy that ignores it rarely succeeds within
`max_turns`, while bisection always does (ceil(log2(high - low + 2)) guesses suffice).
Reward is 1.0 when the number is found, else 0.0; `turn_penalty` takes that much off per extra turn
(found at turn t: max(0, 1 - turn_penalty * (t - 1))), so a score also measures how fast it was found.

A task may carry a `history` of earlier wrong guesses: the episode then starts mid-game, with those
guesses and their replies in the prompt and the turn count (budget and penalty) already spent.
`make_tasks(..., midgame=p)` gives that share of the training tasks a random history; held-out tasks
always start at turn 1. Why: warm-started from 4-turn demonstrations, the model meets turns 5-16 only
after its own mistakes, so RL sees few of them (on the 16-turn workload a turn among 9-16 holds 0.06
as many training guesses as one among 1-4) and never improves them. Measured there, neither mid-game
starts nor `range_penalty` (below) improved those turns (docs/benchmarks.md, "Staleness"): options, off
by default.
"""

from __future__ import annotations

import random
import re
from typing import Any

from agentrl.env import Action, Env, Message, StepResult

_INT_RE = re.compile(r"-?\d+")


def prompt_text(low: int, high: int) -> str:
    return f"Guess my number from {low} to {high}."


def feedback(guess: int, target: int) -> str:
    return "Higher." if guess < target else "Lower."


def replayed(task: dict[str, Any], max_turns: int) -> list[Message]:
    """The opening prompt, then each guess of the task's `history` with its reply."""
    history, target = task.get("history", []), task["target"]
    if len(history) >= max_turns:
        raise ValueError(f"task {task.get('id')}: history of {len(history)} guesses leaves no turn of "
                         f"max_turns={max_turns}")
    messages: list[Message] = [{"role": "user", "content": prompt_text(task["low"], task["high"])}]
    for guess in history:
        if not isinstance(guess, int) or guess == target:
            raise ValueError(f"task {task.get('id')}: history holds {guess!r}; it must hold wrong integer guesses")
        messages += [{"role": "assistant", "content": str(guess)},
                     {"role": "user", "content": feedback(guess, target)}]
    return messages


class GuessNumberEnv(Env):
    def __init__(self, max_turns: int = 4, turn_penalty: float = 0.0) -> None:
        self.max_turns, self.turn_penalty = max_turns, turn_penalty
        self.turn, self.low, self.high = 0, 0, 0
        self.task: dict[str, Any] = {}

    async def reset(self, task: dict[str, Any]) -> list[Message]:
        messages = replayed(task, self.max_turns)
        self.task, self.turn = task, len(task.get("history", []))
        self.low, self.high = task["low"], task["high"]
        for guess in task.get("history", []):
            self._narrow(guess)
        return messages

    def _narrow(self, guess: int) -> None:
        """Shrink the range the replies so far leave open."""
        if guess < self.task["target"]:
            self.low = max(self.low, guess + 1)
        else:
            self.high = min(self.high, guess - 1)

    def _off_range(self) -> float:
        """The task's `range_penalty` (training tasks only, see make_tasks): paid for a guess the replies
        so far already ruled out, or for no number at all."""
        return -float(self.task.get("range_penalty", 0.0))

    async def step(self, action: Action) -> StepResult:
        self.turn += 1
        out_of_turns = self.turn >= self.max_turns
        match = _INT_RE.fullmatch(action.text.strip())
        if match is None:
            return StepResult("Reply with one number.", self._off_range(), out_of_turns,
                              {"success": False, "valid": False})
        guess, target = int(match.group()), self.task["target"]
        if guess == target:
            reward = max(0.0, 1.0 - self.turn_penalty * (self.turn - 1))
            return StepResult(None, reward, True, {"success": True, "turns": self.turn})
        reward = 0.0 if self.low <= guess <= self.high else self._off_range()
        self._narrow(guess)
        return StepResult(feedback(guess, target), reward, out_of_turns, {"success": False})

    @classmethod
    def make_tasks(cls, n: int, seed: int, split: str, low: int = 1, high: int = 15, midgame: float = 0.0,
                   midgame_turns: int = 8, range_penalty: float = 0.0) -> list[dict[str, Any]]:
        """`n` tasks; with `midgame` > 0 that share of the "train" split starts after 1..`midgame_turns`
        wrong guesses drawn uniformly (so some ignore the replies, as the model's late guesses do).
        `range_penalty` > 0 goes into every "train" task: a guess outside the range the replies leave
        open then costs that much at once (a per-turn signal); held-out tasks never carry it."""
        if not 0.0 <= midgame <= 1.0 or midgame_turns < 1:
            raise ValueError(f"midgame must be in [0, 1] and midgame_turns >= 1, got {midgame}, {midgame_turns}")
        # Different splits draw from independent streams, so eval tasks are never the train stream.
        rng = random.Random(f"{split}:{seed}")
        tasks = [{"id": f"{split}-{i}", "low": low, "high": high, "target": rng.randint(low, high)}
                 for i in range(n)]
        if split == "train" and range_penalty:
            for task in tasks:
                task["range_penalty"] = range_penalty
        if split == "train" and midgame > 0:
            # a stream of its own: the targets stay those of a run without midgame
            mid_rng = random.Random(f"{split}:{seed}:midgame")
            for task in tasks:
                if mid_rng.random() < midgame:
                    wrong = [g for g in range(low, high + 1) if g != task["target"]]
                    task["history"] = [mid_rng.choice(wrong) for _ in range(mid_rng.randint(1, midgame_turns))]
        return tasks


# The warm start's default share of best moves (model.default.demo_optimal_prob unset): this task's RL
# gains were measured from a teacher this imperfect.
DEMO_OPTIMAL_PROB = 0.3


def demo_tasks(n: int, seed: int, split: str) -> list[dict[str, Any]]:
    """Tasks for the embedded default model's warm start (`model.default.task: guess_number`)."""
    return GuessNumberEnv.make_tasks(n, seed, split)


def demonstration(task: dict[str, Any], rng: random.Random, optimal_prob: float,
                  max_turns: int = 4) -> list[Message]:
    """A teacher episode: each guess is the bisection midpoint with probability `optimal_prob`,
    otherwise a uniform guess among the numbers still consistent with the feedback. The teacher is
    deliberately imperfect so that RL has something to improve."""
    lo, hi, target = task["low"], task["high"], task["target"]
    messages: list[Message] = [{"role": "user", "content": prompt_text(lo, hi)}]
    for turn in range(max_turns):
        guess = (lo + hi) // 2 if rng.random() < optimal_prob else rng.randint(lo, hi)
        messages.append({"role": "assistant", "content": str(guess)})
        if guess == target or turn == max_turns - 1:
            break
        messages.append({"role": "user", "content": feedback(guess, target)})
        if guess < target:
            lo = guess + 1
        else:
            hi = guess - 1
    return messages


def preference_pairs(n: int, seed: int, split: str = "preferences",
                     max_turns: int = 4) -> list[tuple[list[Message], list[Message]]]:
    """`n` (chosen, rejected) episodes for reward-model training, one hidden number per pair: chosen
    finds it (the env's reward 1), rejected runs out of turns (reward 0). Both are `demonstration`s
    with a teacher strength drawn per attempt, sampled until each kind has turned up, so turn count
    alone does not separate them: a chosen episode can also take all `max_turns` guesses.
    The messages are what `rollout` records in `episode.messages`, which a reward model scores."""
    rng = random.Random(f"{split}:{seed}:pairs")
    pairs = []
    for task in GuessNumberEnv.make_tasks(n, seed, split):
        found: dict[bool, list[Message]] = {}
        while len(found) < 2:
            messages = demonstration(task, rng, rng.random(), max_turns)
            found.setdefault(messages[-1]["content"] == str(task["target"]), messages)
        pairs.append((found[True], found[False]))
    return pairs
