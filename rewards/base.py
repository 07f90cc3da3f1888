"""The reward contract: `async (episode) -> RewardResult`.

An infrastructure failure (a verifier that times out, a scorer that raises) is reported as
status "error" or "timeout" and is never turned into a value of 0: callers retry or drop
such episodes and count them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable, Literal

from agentrl.types import Episode

RewardStatus = Literal["ok", "error", "timeout"]


@dataclass(frozen=True)
class RewardResult:
    value: float  # meaningful only when status == "ok"
    status: RewardStatus = "ok"
    info: dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.status == "ok"


RewardFn = Callable[[Episode], Awaitable[RewardResult]]
