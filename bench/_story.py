"""The multi-turn story env the rollout benchmark runs: three model turns, the env asking for more between them."""

from __future__ import annotations

from typing import Any

from agentrl.env import Action, Env, Message, StepResult

TOPICS = ["a lighthouse keeper", "a lost robot", "a dragon who bakes", "a city under the sea", "two rival chefs",
          "a map with no edges", "the last train home", "a talking cat", "a winter festival", "a broken clock"]


class StoryEnv(Env):
    """Three model turns: a story, then two continuations the env asks for. Never done early, no reward."""

    turns = 3

    async def reset(self, task: dict[str, Any]) -> list[Message]:
        self.topic, self.k = task["topic"], 0
        # Our own short system message: SmolLM2's template would insert its default one otherwise.
        return [{"role": "system", "content": "You are a storyteller. Write long, vivid answers."},
                {"role": "user", "content": f"Tell me a story about {self.topic}."}]

    async def step(self, action: Action) -> StepResult:
        self.k += 1
        if self.k >= self.turns:
            return StepResult(None, 0.0, True, {"success": True})
        return StepResult([{"role": "user", "content": f"Go on. What happens next to {self.topic}?"}], 0.0, False)


def story_tasks(n: int, offset: int = 0) -> list[dict[str, Any]]:
    return [{"id": f"story-{offset + i}", "topic": TOPICS[(offset + i) % len(TOPICS)]} for i in range(n)]
