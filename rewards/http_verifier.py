"""HTTP verifier client: score an episode by POSTing it to a user's verifier URL.

Wire protocol (the reference server is `rewards.servers.verifier`):

    POST <url>   headers: Idempotency-Key: <episode key>, Authorization: Bearer <token> (optional)
    request:     {"episode_id": <episode key>, "task": ..., "messages": [...], "completion": "..."}
    response:    200 {"reward": <finite float>, "info": {...} | null}   (other keys are ignored)

The episode key is `episode.info["episode_key"]`, created once per episode
(`"{task_id}:{group_id}:{uuid}"`) and sent unchanged on every retry, so a verifier with side
effects can deduplicate.

Failure policy (the Reward contract: an infrastructure failure is never a reward of 0), shared with
every remote endpoint through `agentrl.utils.http_common.PooledEndpoint`:
  * retried, with full-jitter exponential backoff: connect errors, timeouts, dropped connections
    (read/write errors, remote protocol errors), HTTP 5xx and 429 (a `Retry-After` on 429/503 is
    honoured, capped by `backoff_max_s`);
  * not retried: other 4xx, malformed JSON, a body that breaks the schema or exceeds
    `max_response_bytes` (checked while streaming, so an endless body costs at most the cap);
  * the result is status "timeout" if the last failed attempt was a timeout, else "error"; either
    way `value` is NaN and `info` holds "error" (a readable reason), "kind" and "attempts".
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

from pydantic import BaseModel, Field

from agentrl.config import VerifierConfig  # the settings live in the config tree (rewards.sources.N.http)
from agentrl.utils.http_common import EndpointStats, Failure, PooledEndpoint, parse_json_model
from agentrl.types import Episode
from rewards.base import RewardResult
from rewards.rules import last_assistant_text

VerifierStats = EndpointStats  # the counters of one verifier endpoint (see agentrl.utils.http_common)


class VerifierResponse(BaseModel):
    """The body a verifier returns. Extra keys are ignored so verifiers can add fields."""

    reward: float = Field(strict=True, allow_inf_nan=False)  # strict: "1.0" and true are rejected
    info: dict[str, Any] | None = None


def episode_key(episode: Episode) -> str:
    """The episode's idempotency key, created on first use and stored in episode.info."""
    key = episode.info.get("episode_key")
    if not key:
        key = f"{episode.task_id}:{episode.group_id}:{uuid.uuid4().hex}"
        episode.info["episode_key"] = key
    return str(key)


def _parse(body: bytes) -> VerifierResponse | Failure:
    return parse_json_model(body, VerifierResponse, "{reward: finite float, info: object}")


class HttpVerifier(PooledEndpoint):
    """`async (episode) -> RewardResult` backed by one pooled httpx.AsyncClient for one endpoint.

    Reuse one instance per endpoint for the whole run (one event loop) and `await aclose()` at the end.
    `transport` replaces the network, e.g. with httpx.MockTransport in unit tests.
    """

    label = "verifier"
    config: VerifierConfig

    async def __call__(self, episode: Episode) -> RewardResult:
        key = episode_key(episode)
        payload = {"episode_id": key, "task": episode.info.get("task"), "messages": episode.messages,
                   "completion": last_assistant_text(episode.messages)}
        try:
            body = json.dumps(payload, ensure_ascii=False, allow_nan=False).encode()
        except (TypeError, ValueError) as exc:
            self._stats.calls += 1
            failure = Failure("encode", f"episode is not JSON-serialisable: {exc}", False)
            self.record_failure(failure, 0)
            return self._failed(failure, 0)
        started = time.perf_counter()
        outcome, attempts = await self.request("POST", self.config.url, _parse, body=body,
                                               headers={"Idempotency-Key": key})
        if isinstance(outcome, Failure):
            return self._failed(outcome, attempts)
        info = {"attempts": attempts, "latency_s": time.perf_counter() - started, "verifier": outcome.info or {}}
        return RewardResult(outcome.reward, "ok", info)

    def _failed(self, failure: Failure, attempts: int) -> RewardResult:
        # NaN rather than 0.0: a caller that ignores `status` gets a poisoned value, not a plausible one.
        return RewardResult(float("nan"), failure.status, failure.info(attempts, self.config.url))
