"""Process-reward-model scorer: a causal LM trained by `python -m agentrl.prm` scores every assistant turn.

`PRMScorer` is `async (episode) -> RewardResult`. The episode's messages are tokenised by
`agentrl.data.steps.prm_sample`, the very function the prm stage builds its conversation rows with, so
each assistant turn is one step, scored at the EOS that ends it: the positions training put labels on.
A step's score is the softmax over the reward tokens' logits there (`prm.reward_tokens`, good label
first), at the good label (`agentrl.algo.preference.prm_step_scores`), i.e. P(good step). The
episode's reward aggregates the step scores: `min` (default: one bad step spoils the episode, the usual
choice for best-of-n and RL with PRMs), `last`, or `mean`.

No batching: each call runs its own forward pass in a worker thread (`asyncio.to_thread`), so the event
loop never runs the model, and a lock taken inside that thread lets one forward run at a time, which
bounds memory to one episode's activations and keeps torch's threads from being oversubscribed. The lock
is a threading one, held by the thread: a caller cancelled mid-forward does not release it early, and
the scorer works from any event loop. Only the logits at the step positions are computed
(`logits_to_keep`, where the model takes it), not a (T, vocab) matrix per episode.

Env tools are not recorded on an episode, so the first prompt is rendered without them: a PRM meant for
tool-using episodes should be trained on rows without `data.tools_key` too.

Results (the Reward contract: a failure is never a reward of 0):
  * ok: value = aggregate(step scores); info has "step_scores" (one float per assistant turn, in order),
    "n_steps", "n_tokens", "aggregate";
  * error (value NaN): the episode has no assistant turn, its messages cannot be tokenised, it is over
    `max_length` tokens (never cut: every step reads its whole context, as in training), the forward
    pass raised, or a score is not finite.
"""

from __future__ import annotations

import asyncio
import inspect
import math
import threading
from typing import Any

import torch

from agentrl.algo.preference import prm_step_scores
from agentrl.config.sources import PRMScorerConfig
from agentrl.config.stages import PRMConfig
from agentrl.data.samples import StepSample
from agentrl.data.steps import prm_sample, reward_token_ids
from agentrl.types import Episode
from rewards.base import RewardResult
from rewards.reward_model import content_text

AGGREGATES = {"min": min, "last": lambda xs: xs[-1], "mean": lambda xs: sum(xs) / len(xs)}


def _error(message: str, **info: Any) -> RewardResult:
    # NaN rather than 0.0: a caller that ignores `status` gets a poisoned value, not a plausible one.
    return RewardResult(float("nan"), "error", {"error": message, **info})


class PRMScorer:
    """`async (episode) -> RewardResult` backed by a local process reward model (a causal LM).

    Loading is synchronous; build the scorer before the loop starts or with
    `await asyncio.to_thread(PRMScorer, config)`. A reward token that is not exactly one token of the
    folder's tokenizer is a ConfigError here, at start-up."""

    def __init__(self, config: PRMScorerConfig) -> None:
        from transformers import AutoModelForCausalLM

        from agentrl.data.chat import ChatFormat, load_tokenizer

        self.config = config
        # As the prm stage loaded it: the same tokens, so the same positions and reward-token ids.
        self.tokenizer = load_tokenizer(config.path)
        self.fmt = ChatFormat(self.tokenizer)
        self.reward_ids = reward_token_ids(PRMConfig(reward_tokens=config.reward_tokens), self.fmt)
        model = AutoModelForCausalLM.from_pretrained(config.path, local_files_only=True, dtype=torch.float32)
        self.model = model.to(config.device).eval()
        self._keeps_logits = "logits_to_keep" in inspect.signature(self.model.forward).parameters
        self._lock = threading.Lock()

    def sample(self, messages: list[dict[str, Any]]) -> StepSample:
        """The episode's tokens and step positions, exactly as the prm stage builds a conversation row."""
        msgs = [{**m, "content": content_text(m.get("content"))} for m in messages]
        return prm_sample(self.fmt, msgs, None, "episode")

    def step_scores(self, sample: StepSample) -> list[float]:
        """P(good step) at each of `sample.positions`. Blocking: runs the model (call it off the loop)."""
        device = self.model.device
        ids_1T = torch.tensor([sample.tokens], dtype=torch.long, device=device)
        positions = torch.tensor(sample.positions, dtype=torch.long, device=device)
        with self._lock, torch.inference_mode():
            if self._keeps_logits:  # the LM head on the step positions only
                logits_NV = self.model(input_ids=ids_1T, use_cache=False, logits_to_keep=positions).logits[0]
            else:
                logits_NV = self.model(input_ids=ids_1T, use_cache=False).logits[0, positions]
            return prm_step_scores(logits_NV[:, self.reward_ids]).cpu().tolist()

    async def __call__(self, episode: Episode) -> RewardResult:
        if not any(m.get("role") == "assistant" for m in episode.messages):
            return _error("episode has no assistant turn to score")
        try:
            sample = self.sample(episode.messages)
        except Exception as exc:  # noqa: BLE001 - a message the chat template rejects is this episode's problem
            return _error(f"tokenising the messages failed: {type(exc).__name__}: {exc}")
        n_tokens = len(sample.tokens)
        if n_tokens > self.config.max_length:
            return _error(f"episode is {n_tokens} tokens, over prm.max_length={self.config.max_length}",
                          n_tokens=n_tokens)
        try:
            scores = await asyncio.to_thread(self.step_scores, sample)
        except Exception as exc:  # noqa: BLE001 - any model failure is reported, never scored
            return _error(f"PRM forward failed: {type(exc).__name__}: {exc}", n_tokens=n_tokens)
        info = {"step_scores": scores, "n_steps": len(scores), "n_tokens": n_tokens,
                "aggregate": self.config.aggregate}
        if not all(math.isfinite(s) for s in scores):
            return _error(f"PRM returned a non-finite step score in {scores}", **info)
        return RewardResult(float(AGGREGATES[self.config.aggregate](scores)), "ok", info)
