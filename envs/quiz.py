"""Multi-turn verifiable task: an arithmetic quiz of several questions asked one after another in
one conversation.

After each answer the env says whether it was right (giving the right answer when it was not) and
asks the next question, so every episode has `questions` model turns and the token ledger is
exercised across turns. Each answer is scored by `rewards.rules.numeric_match`; the episode reward
is the fraction of questions answered correctly, and `success` means all of them were.
"""

from __future__ import annotations

import random
from typing import Any

from agentrl.env import Action, Env, Message, StepResult
from envs.calculator import OPS
from rewards.rules import numeric_match


def _ask(q: dict[str, Any], k: int) -> str:
    return f"Q{k}: {q['a']} {q['op']} {q['b']} = ?"


class ArithmeticQuizEnv(Env):
    async def reset(self, task: dict[str, Any]) -> list[Message]:
        self.questions: list[dict[str, Any]] = task["questions"]
        self.k = 0
        self.correct = 0
        # A short system message of our own: SmolLM2's template would otherwise insert its 20-token
        # default, paid for in every forward pass of the learner.
        return [{"role": "system", "content": "Answer each question with just the number."},
                {"role": "user", "content": _ask(self.questions[0], 1)}]

    async def step(self, action: Action) -> StepResult:
        q = self.questions[self.k]
        right = numeric_match(action.text, q["answer"]) == 1.0
        self.correct += right
        self.k += 1
        info = {"success": self.correct == len(self.questions), "correct": self.correct}
        reward = float(right) / len(self.questions)
        if self.k == len(self.questions):
            return StepResult(None, reward, True, info)
        verdict = "Correct." if right else f"Wrong, {q['a']} {q['op']} {q['b']} = {q['answer']}."
        return StepResult([{"role": "user", "content": f"{verdict} {_ask(self.questions[self.k], self.k + 1)}"}],
                          reward, False, info)

    @classmethod
    def make_tasks(cls, n: int, seed: int, split: str, questions: int = 3, max_operand: int = 10,
                   ops: str = "+-") -> list[dict[str, Any]]:
        rng = random.Random(f"quiz:{split}:{seed}")
        tasks = []
        for i in range(n):
            qs = []
            for _ in range(questions):
                a, b, op = rng.randint(0, max_operand), rng.randint(0, max_operand), rng.choice(ops)
                if op == "-" and b > a:  # results stay non-negative: a first quiz, not a test of signs
                    a, b = b, a
                qs.append({"a": a, "b": b, "op": op, "answer": OPS[op](a, b)})
            tasks.append({"id": f"{split}-{i}", "questions": qs})
        return tasks
