"""Rule rewards: plain functions of the final answer text, and the adapter that makes them RewardFns.

The one signature to copy when writing a rule:

    def my_rule(completion: str, answer: Any) -> float:
        ...

`completion` is the text of the episode's last assistant message; `answer` is
`episode.info["task"][answer_key]` (whatever the dataset row holds: a string, a number, a pattern).
Return a finite float. Raise (ValueError, KeyError, ...) when the *task* cannot be scored, e.g. an
answer that is not a number: `rule_reward` then reports status "error" instead of a reward of 0,
so a broken dataset row is counted and dropped rather than silently trained on.

Plug a rule in as a reward with `as_reward(numeric_match)` or
`functools.partial(rule_reward, fn=numeric_match)`; both are `async (episode) -> RewardResult`.

Built-in rules:
    exact_match(completion, answer)          1.0 iff equal after collapsing whitespace (case-sensitive)
    numeric_match(completion, answer, tol)   1.0 iff the last number in the completion is within tol of answer
    regex_format(completion, pattern)        1.0 iff the stripped completion fully matches pattern (re.DOTALL)
"""

from __future__ import annotations

import functools
import math
import re
from typing import Any, Callable

from agentrl.utils.tracebacks import describe
from agentrl.types import Episode
from rewards.base import RewardFn, RewardResult

RuleFn = Callable[[str, Any], float]

# Thousands separators only in groups of three, so "1,000" is 1000 but "1,2,3" is three numbers.
_NUMBER = re.compile(
    r"[-+]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:[eE][-+]?\d+)?"
    r"|[-+]?\.\d+(?:[eE][-+]?\d+)?"
)


def last_assistant_text(messages: list[dict[str, Any]]) -> str:
    """Text of the last message with role "assistant" ("" if there is none or it has no text).

    Content may be a string or OpenAI-style content parts ([{"type": "text", "text": ...}, ...]).
    """
    for message in reversed(messages):
        if message.get("role") != "assistant":
            continue
        content = message.get("content")
        if isinstance(content, str):
            return content
        if isinstance(content, list):
            return "".join(
                p.get("text", "") for p in content if isinstance(p, dict) and p.get("type", "text") == "text"
            )
        return ""
    return ""


def last_number(text: str) -> float | None:
    """The last number written in `text` ("1,234.5", "-3", "2e-3", ".5"), or None."""
    matches = _NUMBER.findall(text)
    if not matches:
        return None
    return float(matches[-1].replace(",", ""))


def exact_match(completion: str, answer: str) -> float:
    """1.0 iff `completion` equals `answer` after stripping and collapsing runs of whitespace."""
    return 1.0 if " ".join(completion.split()) == " ".join(str(answer).split()) else 0.0


def numeric_match(completion: str, answer: Any, tol: float = 1e-6) -> float:
    """1.0 iff the last number in `completion` is close to `answer`.

    Close means |pred - answer| <= max(tol, tol * |answer|) (math.isclose with rel_tol = abs_tol = tol).
    `answer` may be a number or a string holding one ("42", "1,000", "#### 42" uses its last number);
    an answer with no number raises ValueError: the task is broken, not the completion wrong.
    """
    if isinstance(answer, bool) or not isinstance(answer, (int, float, str)):
        raise ValueError(f"numeric_match: answer must be a number or a string, got {type(answer).__name__}")
    target = float(answer) if not isinstance(answer, str) else last_number(answer)
    if target is None or not math.isfinite(target):
        raise ValueError(f"numeric_match: answer {answer!r} holds no finite number")
    pred = last_number(completion)
    if pred is None or not math.isfinite(pred):
        return 0.0
    return 1.0 if math.isclose(pred, target, rel_tol=tol, abs_tol=tol) else 0.0


def regex_format(completion: str, pattern: str | re.Pattern[str]) -> float:
    """1.0 iff the stripped completion matches `pattern` in full.

    A string pattern is compiled with re.DOTALL so `.` spans lines, e.g.
    r"<think>.*?</think>\\s*<answer>.*?</answer>"; a compiled pattern keeps its own flags.
    """
    regex = pattern if isinstance(pattern, re.Pattern) else re.compile(pattern, re.DOTALL)
    return 1.0 if regex.fullmatch(completion.strip()) else 0.0


def _rule_name(fn: Callable[..., Any]) -> str:
    inner = fn.func if isinstance(fn, functools.partial) else fn
    return getattr(inner, "__name__", type(inner).__name__)


def _error(message: str, rule: str) -> RewardResult:
    # NaN rather than 0.0: a caller that ignores `status` gets a poisoned value, not a plausible one.
    return RewardResult(float("nan"), "error", {"error": message, "rule": rule})


async def rule_reward(episode: Episode, fn: RuleFn, answer_key: str = "answer") -> RewardResult:
    """Score `episode` with `fn(last assistant text, episode.info["task"][answer_key])`.

    A missing task or answer, a rule that raises, or a non-finite value gives status "error".
    """
    rule = _rule_name(fn)
    task = episode.info.get("task")
    if not isinstance(task, dict) or answer_key not in task:
        return _error(f"episode.info['task'] has no {answer_key!r} to score against", rule)
    completion = last_assistant_text(episode.messages)
    try:
        value = float(fn(completion, task[answer_key]))
    except Exception as exc:  # user rule code: any failure is reported, never scored as 0
        line, trace = describe(exc)
        result = _error(f"{rule} raised {line}", rule)
        result.info["traceback"] = trace
        return result
    if not math.isfinite(value):
        return _error(f"{rule} returned non-finite value {value!r}", rule)
    return RewardResult(value, "ok", {"rule": rule})


def as_reward(fn: RuleFn, answer_key: str = "answer") -> RewardFn:
    """Wrap a rule `fn(completion, answer) -> float` as an `async (episode) -> RewardResult`."""

    async def reward(episode: Episode) -> RewardResult:
        return await rule_reward(episode, fn, answer_key)

    reward.__name__ = f"rule_reward[{_rule_name(fn)}]"
    return reward
