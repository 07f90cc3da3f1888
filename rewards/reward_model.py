"""Reward-model scorer: a Hugging Face sequence classifier that scores episodes in micro-batches.

`RewardModelScorer` is `async (episode) -> RewardResult`. Each call renders `episode.messages`
(with the scorer's tokenizer chat template when it has one, else the contents joined by newlines)
and enqueues the text. One worker task per event loop drains the queue: a batch closes when it holds
`max_batch_size` requests or when its oldest request has waited `max_wait_s`, and one forward pass
in a worker thread (`asyncio.to_thread`) scores the whole batch, so the event loop never runs the
model and concurrent rollouts share forward passes. One batch runs at a time; requests that arrive
meanwhile form the next one.

The model is an `AutoModelForSequenceClassification` with one output (num_labels=1) and a linear
`score` head on a decoder backbone (Qwen2, Llama, Mistral, Gemma, GPT-2, ... reward models). Rows
are right-padded and the score is read at each row's last real token, found from the attention
mask; the model's own pooling (the rightmost token that is not `pad_token_id`) is bypassed because
it misreads texts that contain the pad token and fails when no pad token is configured.
Texts longer than `max_length` tokens keep their last `max_length` tokens (the end of the
conversation, where the answer is) and report `info["truncated"] = True`.

Results (the Reward contract: an infrastructure failure is never a reward of 0):
  * ok: value = scale * score + shift; info has "raw_score", "n_tokens" (before truncation),
    "truncated", "batch_size";
  * error: the forward pass raised (every request of that batch gets the reason), the score is not
    finite, or the episode has nothing to score; value is NaN;
  * timeout: no score within `timeout_s` of the call; value is NaN.

Global torch settings (threads, default dtype, grad mode) are left alone; inference mode is
entered only inside the worker thread.
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import logging
import math
import time
from typing import Any, Callable

import torch

from agentrl.utils.classifier import head_scores, last_token_at
from agentrl.config import RewardModelConfig
from agentrl.utils.padding import pad_tokens
from agentrl.types import Episode
from rewards.base import RewardResult

log = logging.getLogger(__name__)

EngineFactory = Callable[[torch.nn.Module, int, bool], Any]  # (model, micro_batch_size, offload) -> engine


@dataclasses.dataclass
class RewardModelStats:
    """Counters of one scorer. items = requests that reached a forward pass (ok or error)."""

    calls: int = 0
    batches: int = 0  # forward passes attempted
    items: int = 0
    ok: int = 0
    errors: int = 0  # requests answered with status "error"
    error_batches: int = 0  # forward passes that raised
    timeouts: int = 0
    truncated: int = 0
    forward_s: float = 0.0  # wall time spent in forward passes (tokenisation included)
    max_batch_size: int = 0
    mean_batch_size: float = 0.0  # items / batches, filled in by `stats()`


@dataclasses.dataclass
class _Request:
    text: str
    future: asyncio.Future[RewardResult]
    enqueued: float  # loop.time() at the call


def content_text(content: Any) -> str:
    """A message's text: a string, or OpenAI-style parts [{"type": "text", "text": ...}, ...]."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, dict) and p.get("type", "text") == "text")
    return "" if content is None else str(content)


def _error(message: str, **info: Any) -> RewardResult:
    # NaN rather than 0.0: a caller that ignores `status` gets a poisoned value, not a plausible one.
    return RewardResult(float("nan"), "error", {"error": message, **info})


class RewardModelScorer:
    """`async (episode) -> RewardResult` backed by a local sequence-classification reward model.

    Loading the model is synchronous; build the scorer before the loop starts or with
    `await asyncio.to_thread(RewardModelScorer, config)`. Reuse one instance for the run and
    `await aclose()` at the end.
    """

    def __init__(self, config: RewardModelConfig, engine_factory: EngineFactory | None = None) -> None:
        """`engine_factory(model, micro_batch_size, offload) -> engine` wraps the frozen model in an eval-only
        engine when `config.deepspeed` (the learner's `frozen_engine`; passed in, so rewards/ never
        imports the learner)."""
        from transformers import AutoModelForSequenceClassification

        from agentrl.data.chat import load_tokenizer

        self.config = config
        # As rollouts and the reward-model stage load it: a score is read at the token it was trained on.
        self.tokenizer = load_tokenizer(config.path)
        dtype = torch.bfloat16 if config.dtype == "bfloat16" else torch.float32
        model = AutoModelForSequenceClassification.from_pretrained(config.path, local_files_only=True, dtype=dtype)
        head = getattr(model, "score", None)
        backbone = getattr(model, model.base_model_prefix, None)
        if not isinstance(head, torch.nn.Linear) or backbone is None or backbone is model:
            raise ValueError(f"{config.path}: expected a decoder classifier with a linear `score` head, "
                             f"got {type(model).__name__}")
        if head.out_features != 1:
            raise ValueError(f"{config.path}: a reward model has one output (num_labels=1), "
                             f"this one has {head.out_features}")
        self.model = model.to(config.device).eval()
        self.engine = None
        if config.offload and not config.deepspeed:
            raise ValueError("reward model offload needs deepspeed: true")
        if config.deepspeed:
            if engine_factory is None:
                raise ValueError("reward model deepspeed: true needs an engine_factory "
                                 "(agentrl.learner.models.frozen_engine)")
            self.engine = engine_factory(self.model, config.max_batch_size, config.offload)
            self.model = self.engine.module  # ZeRO-3's hooks gather each submodule's weights as it runs
        self._use_template = bool(getattr(self.tokenizer, "chat_template", None))
        self._pad_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0
        self._stats = RewardModelStats()
        self._pending: collections.deque[_Request] = collections.deque()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._worker: asyncio.Task[None] | None = None
        self._wakeup: asyncio.Event | None = None
        self._full: asyncio.Event | None = None
        self._closed = False

    # ---- public API ----

    def render(self, messages: list[dict[str, Any]]) -> str:
        """The text the model scores for `messages`."""
        msgs = [{**m, "content": content_text(m.get("content"))} for m in messages]
        if self._use_template:
            return self.tokenizer.apply_chat_template(msgs, tokenize=False)
        return "\n".join(m["content"] for m in msgs)

    async def __call__(self, episode: Episode) -> RewardResult:
        self._stats.calls += 1
        if self._closed:
            self._stats.errors += 1
            return _error("reward model scorer is closed")
        try:
            text = self.render(episode.messages)
        except Exception as exc:  # a message the chat template rejects is this episode's problem
            self._stats.errors += 1
            return _error(f"rendering the messages failed: {type(exc).__name__}: {exc}")
        if not text:
            self._stats.errors += 1
            return _error("episode has no text to score")
        loop = self._ensure_worker()
        request = _Request(text, loop.create_future(), loop.time())
        self._pending.append(request)
        self._wakeup.set()
        if len(self._pending) >= self.config.max_batch_size:
            self._full.set()
        try:
            return await asyncio.wait_for(request.future, self.config.timeout_s)
        except TimeoutError:
            self._stats.timeouts += 1
            return RewardResult(float("nan"), "timeout",
                                {"error": f"no reward-model score within {self.config.timeout_s}s",
                                 "waited_s": loop.time() - request.enqueued})

    def stats(self) -> RewardModelStats:
        """A snapshot of the counters."""
        s = self._stats
        return dataclasses.replace(s, mean_batch_size=s.items / s.batches if s.batches else 0.0)

    async def aclose(self) -> None:
        """Stop the worker; requests still waiting get status "error". Idempotent."""
        self._closed = True
        worker, self._worker = self._worker, None
        if worker is not None and not worker.done():
            worker.cancel()
            try:
                await worker
            except asyncio.CancelledError:
                pass
        self._fail_pending("reward model scorer closed")

    async def __aenter__(self) -> "RewardModelScorer":
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    # ---- batching ----

    def _ensure_worker(self) -> asyncio.AbstractEventLoop:
        """The running loop, with this scorer's worker task on it (a new loop gets a new worker)."""
        loop = asyncio.get_running_loop()
        if self._loop is not loop or self._worker is None or self._worker.done():
            if self._loop is not loop:
                self._pending.clear()  # futures of a finished loop can never be awaited again
            self._loop = loop
            self._wakeup, self._full = asyncio.Event(), asyncio.Event()
            self._worker = loop.create_task(self._run(), name="reward-model-batcher")
        return loop

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        cfg = self.config
        while True:
            while not self._pending:
                self._wakeup.clear()
                await self._wakeup.wait()
            # The batch closes when full or when its oldest request has waited max_wait_s.
            delay = self._pending[0].enqueued + cfg.max_wait_s - loop.time()
            if len(self._pending) < cfg.max_batch_size and delay > 0:
                self._full.clear()
                try:
                    async with asyncio.timeout(delay):
                        await self._full.wait()
                except TimeoutError:
                    pass
            batch: list[_Request] = []
            while self._pending and len(batch) < cfg.max_batch_size:
                request = self._pending.popleft()
                if not request.future.done():  # a timed-out or cancelled caller is skipped
                    batch.append(request)
            if batch:
                try:
                    await self._score(batch)
                except asyncio.CancelledError:
                    self._resolve(batch, [_error("reward model scorer closed")] * len(batch))
                    raise

    async def _score(self, batch: list[_Request]) -> None:
        """One forward pass for `batch`; a failure becomes an error result for each of its requests."""
        self._stats.batches += 1
        self._stats.items += len(batch)
        self._stats.max_batch_size = max(self._stats.max_batch_size, len(batch))
        started = time.perf_counter()
        try:
            scores, lengths = await asyncio.to_thread(self._forward, [r.text for r in batch])
        except Exception as exc:  # noqa: BLE001 - any model failure is reported per request, never scored
            self._stats.forward_s += time.perf_counter() - started
            self._stats.error_batches += 1
            log.warning("reward model forward failed on a batch of %d: %r", len(batch), exc)
            reason = f"reward model forward failed: {type(exc).__name__}: {exc}"
            self._resolve(batch, [_error(reason, batch_size=len(batch))] * len(batch))
            return
        self._stats.forward_s += time.perf_counter() - started
        results = [self._result(score, n, len(batch)) for score, n in zip(scores, lengths)]
        self._resolve(batch, results)

    def _result(self, score: float, n_tokens: int, batch_size: int) -> RewardResult:
        truncated = n_tokens > self.config.max_length
        info = {"raw_score": score, "n_tokens": n_tokens, "truncated": truncated, "batch_size": batch_size}
        if not math.isfinite(score):
            return _error(f"reward model returned a non-finite score {score!r}", **info)
        return RewardResult(self.config.scale * score + self.config.shift, "ok", info)

    def _resolve(self, batch: list[_Request], results: list[RewardResult]) -> None:
        for request, result in zip(batch, results):
            if request.future.done():
                continue  # the caller already gave up (timeout or cancellation)
            if result.ok:
                self._stats.ok += 1
                self._stats.truncated += int(result.info["truncated"])
            else:
                self._stats.errors += 1
            request.future.set_result(result)

    def _fail_pending(self, reason: str) -> None:
        while self._pending:
            request = self._pending.popleft()
            if not request.future.done() and not request.future.get_loop().is_closed():
                self._stats.errors += 1
                request.future.set_result(_error(reason))

    # ---- the model (runs in a worker thread) ----

    def _forward(self, texts: list[str]) -> tuple[list[float], list[int]]:
        """Scores of `texts` (one per text) and their token counts before left truncation."""
        encoded = self.tokenizer(texts, add_special_tokens=not self._use_template, verbose=False)["input_ids"]
        lengths = [len(ids) for ids in encoded]
        if min(lengths) == 0:
            raise ValueError("a text tokenised to zero tokens")
        input_ids_BT, attention_mask_BT = self.pad_right([ids[-self.config.max_length:] for ids in encoded])
        return self.score_tokens(input_ids_BT, attention_mask_BT).tolist(), lengths

    def pad_right(self, rows: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
        """(input_ids, attention_mask), both (B, T) long, right-padded with the tokenizer's pad id."""
        return pad_tokens(rows, self._pad_id)

    def score_tokens(self, input_ids_BT: torch.Tensor, attention_mask_BT: torch.Tensor) -> torch.Tensor:
        """(B,) float32 scores read at each row's last attended token of right-padded rows."""
        with torch.inference_mode():
            return last_token_scores(self.model, input_ids_BT, attention_mask_BT).cpu()


def last_token_scores(model: Any, input_ids_BT: torch.Tensor, attention_mask_BT: torch.Tensor) -> torch.Tensor:
    """(B,) float32 scores of a decoder classifier read at each right-padded row's last real token
    (`agentrl.utils.classifier.head_scores`, which the reward-model stage reads packed rows with; the model's
    own pad-id pooling is bypassed, see the module doc). Gradients flow unless the caller disables them."""
    device = model.device
    input_ids_BT, attention_mask_BT = input_ids_BT.to(device), attention_mask_BT.to(device)
    inputs = {"input_ids": input_ids_BT, "attention_mask": attention_mask_BT, "use_cache": False}
    return head_scores(model, inputs, last_token_at(attention_mask_BT))
