"""Any reasoning-gym dataset as an env, chosen by name and config in the YAML and scored by the
dataset's own `score_answer`; optionally several attempts, each later one worth less.

    env:  {import_path: envs.rgym:ReasoningGymEnv, kwargs: {attempts: 2, attempt_decay: 0.5}}
    data: {task_kwargs: {dataset: basic_arithmetic, config: {min_terms: 2, max_terms: 2}}}

A task names its dataset entry instead of holding it: {"dataset", "config", "seed", "size", "index"}.
Checkpoints keep tasks as JSON, and an entry's metadata may hold tuples and other values JSON does not
give back as themselves; a reasoning-gym item is a function of (config, seed, size, index) (most
datasets seed one `Random(seed + index)` per item), so the env rebuilds it in `reset`. Train and eval
use disjoint indices of the same stream (even and odd), so no held-out item is a training item.

With `shots` = k, the conversation opens with k solved items of the same dataset and config (drawn from
their own seed, never a train or eval item) as earlier user/assistant turns, the answers in tags: a
small model follows worked turns far better than instructions (SmolLM2-135M-Instruct on 2-operand
1-digit basic_arithmetic, 16 tokens: 0.0 right bare, 0.17 with 3 shots and the "direct" prompt).

The model answers between <answer> and </answer> (the default system prompt, reasoning-gym's "direct",
says so); the answer is the last tagged span (reasoning-gym's `extract_answer`), or the whole reply
when it has none (small models seldom write the tags; the dataset's rule then scores the bare reply),
and `score_answer(answer, entry)` scores it in [0, 1]. A score below 1 is wrong: with
`attempts` > 1 the env says so and asks again. The episode's reward is the score of its last attempt k
(the first right one, or the last allowed) times `attempt_decay ** (k - 1)`.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import json
from importlib.metadata import version
from typing import Any

from agentrl.env import Action, Env, Message, StepResult
from agentrl.utils.extras import needs

with needs("envs.rgym", "reasoning-gym", "envs", "reasoning_gym"):
    import reasoning_gym
    from reasoning_gym.factory import DATASETS
    from reasoning_gym.utils import SYSTEM_PROMPTS, extract_answer

SPLIT_OFFSET = {"train": 0, "eval": 1}  # index = 2 * i + offset: the splits never share an item
SHOT_SEED = 1_000_003  # the shots' dataset seed is the tasks' seed plus this: a stream of its own


def nearest(name: str, names: list[str], what: str) -> str:
    guesses = difflib.get_close_matches(name, names, n=3, cutoff=0.5)
    hint = f"; did you mean {', '.join(repr(g) for g in guesses)}?" if guesses else f" (the {len(names)} names: {', '.join(names)})"
    return f"{what} {name!r} does not exist{hint}"


def check_spec(dataset: str, config: dict[str, Any]) -> None:
    """ValueError naming the nearest valid names when `dataset` or a `config` key does not exist."""
    if dataset not in DATASETS:
        raise ValueError(f"{nearest(dataset, sorted(DATASETS), 'reasoning-gym dataset')} "
                         f"(in reasoning-gym {version('reasoning-gym')})")
    fields = [f.name for f in dataclasses.fields(DATASETS[dataset][1]) if f.name not in ("seed", "size")]
    for key in config:
        if key in ("seed", "size"):
            raise ValueError(f"config of {dataset!r}: {key!r} is not a config key here (data.seed and the task "
                             f"count set the dataset's seed and size)")
        if key not in fields:
            raise ValueError(f"config of {dataset!r}: {nearest(key, fields, 'key')}")


@functools.lru_cache(maxsize=16)
def _dataset(name: str, config_json: str, seed: int, size: int) -> Any:
    return reasoning_gym.create_dataset(name, seed=seed, size=size, **json.loads(config_json))


def dataset_and_entry(task: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
    """The reasoning-gym dataset of `task` (built once per process) and its entry {question, answer, metadata}."""
    config_json = json.dumps(task["config"], sort_keys=True)
    dataset = _dataset(task["dataset"], config_json, task["seed"], task["size"])
    return dataset, dataset[task["index"]]


def shot_turns(task: dict[str, Any], k: int) -> list[Message]:
    """k solved items of the task's dataset and config, from the shot stream, as user/assistant turns."""
    if k == 0:
        return []
    shots = _dataset(task["dataset"], json.dumps(task["config"], sort_keys=True), task["seed"] + SHOT_SEED, k)
    return [m for entry in shots for m in ({"role": "user", "content": entry["question"]},
                                          {"role": "assistant", "content": f"<answer>{entry['answer']}</answer>"})]


class ReasoningGymEnv(Env):
    def __init__(self, attempts: int = 1, attempt_decay: float = 0.5, system_prompt: str | None = "direct",
                 shots: int = 0) -> None:
        if attempts < 1:
            raise ValueError(f"env.kwargs.attempts must be >= 1, got {attempts}")
        if not 0.0 <= attempt_decay <= 1.0:
            raise ValueError(f"env.kwargs.attempt_decay must be in [0, 1], got {attempt_decay}")
        if shots < 0:
            raise ValueError(f"env.kwargs.shots must be >= 0, got {shots}")
        self.attempts, self.attempt_decay, self.shots = attempts, attempt_decay, shots
        # A name of reasoning-gym's prompts ("direct", "default", ...) or the text itself; None: no system message.
        self.system_prompt = SYSTEM_PROMPTS.get(system_prompt, system_prompt) if system_prompt else None
        self.attempt = 0

    async def reset(self, task: dict[str, Any]) -> list[Message]:
        self.dataset, self.entry = dataset_and_entry(task)
        self.attempt = 0
        system = [{"role": "system", "content": self.system_prompt}] if self.system_prompt else []
        return system + shot_turns(task, self.shots) + [{"role": "user", "content": self.entry["question"]}]

    async def step(self, action: Action) -> StepResult:
        self.attempt += 1
        tagged = extract_answer(action.text)
        answer = action.text.strip() if tagged is None else tagged
        score = float(self.dataset.score_answer(answer, self.entry))
        right = score >= 1.0
        info = {"success": right, "score": score, "attempts": self.attempt, "tagged": tagged is not None}
        if right or self.attempt >= self.attempts:
            return StepResult(None, score * self.attempt_decay ** (self.attempt - 1), True, info)
        left = self.attempts - self.attempt
        return StepResult(f"That is not right. Try again ({left} attempt{'s' if left > 1 else ''} left).", 0.0, False, info)

    @classmethod
    def make_tasks(cls, n: int, seed: int, split: str, dataset: str = "basic_arithmetic",
                   config: dict[str, Any] | None = None) -> list[dict[str, Any]]:
        """`n` tasks of reasoning-gym's `dataset` built with `config` (its config class's fields, e.g.
        basic_arithmetic's min_terms, max_digits); ValueError on an unknown name or key or a config the
        dataset rejects, before any engine starts."""
        config = dict(config or {})
        check_spec(dataset, config)
        if split not in SPLIT_OFFSET:
            raise ValueError(f"split {split!r}: reasoning-gym tasks come in the splits {sorted(SPLIT_OFFSET)}")
        tasks = [{"id": f"{split}-{i}", "dataset": dataset, "config": config, "seed": seed, "size": 2 * n,
                  "index": 2 * i + SPLIT_OFFSET[split]} for i in range(n)]
        try:  # the first item is built now, so that a config the dataset rejects fails at start-up
            dataset_and_entry(tasks[0])
        except (AssertionError, TypeError, ValueError) as exc:
            raise ValueError(f"config of {dataset!r} {config}: {str(exc) or type(exc).__name__}") from None
        return tasks
