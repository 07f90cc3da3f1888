"""The reward a process writes: `{"reward": <finite number>, ...}` as JSON in {reward_file}.

Read once, after the process exited 0. A file that is missing, too large, not JSON, not an object or
without a finite number "reward" is an error naming the file and what is wrong with it, never a 0.
The other keys go to the episode's `info["env"]` as an AgentEnv's returned dict's do ("success": bool
feeds the success rate, "tool_success": bool the tool-call success rate).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from agentrl.rollout.process_agent.child import ProcessAgentError

MAX_BYTES = 1 << 20


def read_reward(path: Path) -> dict[str, Any]:
    """The reward file's object; ProcessAgentError saying what is wrong with it."""
    where = f"its reward file {{reward_file}} ({path.name} in its working directory)"
    if not path.is_file():
        raise ProcessAgentError(f"the agent process exited 0 without writing {where}; write "
                                '{"reward": <number>} there, or set env.kwargs.reward: sources')
    if path.stat().st_size > MAX_BYTES:
        raise ProcessAgentError(f"{where} holds {path.stat().st_size} bytes, over {MAX_BYTES}")
    text = path.read_bytes().decode(errors="replace")
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ProcessAgentError(f"{where} is not JSON ({exc.msg} at line {exc.lineno} column {exc.colno}): "
                                f"{text[:80]!r}") from None
    if not isinstance(value, dict):
        raise ProcessAgentError(f"{where} holds {type(value).__name__} {text[:80]!r}; write an object "
                                '{"reward": <number>, ...}')
    reward = value.get("reward")
    if isinstance(reward, bool) or not isinstance(reward, (int, float)) or not math.isfinite(reward):
        raise ProcessAgentError(f"{where} has reward {reward!r} (keys {sorted(value)}); it must be a finite number")
    return value
