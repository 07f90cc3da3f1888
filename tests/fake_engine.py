"""An in-memory stand-in for `agentrl.rollout.engine.Engine` that plays a script instead of sampling.

It records every call (a copy of prompt_ids, max_tokens, sampling arguments) and what it returned,
so tests can compare the episode ledger against exactly what the "engine" saw and produced.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from agentrl.rollout.engine import Generation


@dataclass
class Reply:
    """One scripted model turn. `token_ids` (if set) are emitted verbatim instead of encode(text)."""

    text: str = ""
    token_ids: list[int] | None = None
    eos: bool = True  # append the EOS id (a model that stopped on its own)
    logprobs: list[float] | None = None  # default: distinct values derived from the call index
    versions: list[int] | None = None  # default: [call index] per token


@dataclass
class Call:
    prompt_ids: list[int]
    max_tokens: int
    temperature: float
    top_p: float
    seed: int | None
    output: Generation | None = None


Script = Callable[[list[int], int], "Reply | str"]


class ScriptedEngine:
    """`script` is a list of replies (the n-th generate call gets the n-th) or a function
    (prompt_ids, call_index) -> reply. A reply may be a plain string (= Reply(text))."""

    def __init__(self, tokenizer: Any, script: list["Reply | str"] | Script) -> None:
        self.tokenizer = tokenizer
        self.eos_id: int = tokenizer.eos_token_id
        self.script = script
        self.calls: list[Call] = []

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def _reply(self, prompt_ids: list[int], index: int) -> Reply:
        reply = self.script(prompt_ids, index) if callable(self.script) else self.script[index]
        return Reply(reply) if isinstance(reply, str) else reply

    async def generate(self, prompt_ids: list[int], max_tokens: int, temperature: float = 1.0,
                       top_p: float = 1.0, seed: int | None = None) -> Generation:
        index = len(self.calls)
        call = Call(list(prompt_ids), max_tokens, temperature, top_p, seed)  # copy: the ledger keeps growing
        self.calls.append(call)
        reply = self._reply(call.prompt_ids, index)
        ids = list(reply.token_ids) if reply.token_ids is not None else self.encode(reply.text)
        if reply.eos:
            ids.append(self.eos_id)
        cut = len(ids) > max_tokens
        ids = ids[:max_tokens]
        n = len(ids)
        logprobs = list(reply.logprobs[:n]) if reply.logprobs is not None else \
            [-0.25 * (index + 1) - 0.001 * j for j in range(n)]
        versions = list(reply.versions[:n]) if reply.versions is not None else [index] * n
        call.output = Generation(ids, logprobs, versions, "length" if cut or not reply.eos else "stop")
        return call.output

    async def stream(self, prompt_ids: list[int], max_tokens: int, temperature: float = 1.0,
                     top_p: float = 1.0, seed: int | None = None):
        """`generate`, delivered one token at a time (as the real Engine.stream delivers engine steps)."""
        out = await self.generate(prompt_ids, max_tokens, temperature, top_p, seed)
        for j, tok in enumerate(out.token_ids):
            last = j == len(out.token_ids) - 1
            yield Generation([tok], [out.logprobs[j]], [out.versions[j]], out.finish_reason if last else None)
