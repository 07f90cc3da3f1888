"""HTTP verifier client: score an episode by POSTing it to a user's verifier URL.

Wire protocol (the reference server is `rewards.servers.verifier`):

    POST <url>   headers: Idempotency-Key: <episode key>, Authorization: Bearer <token> (optional)
    request:     {"episode_id": <episode key>, "task": ..., "messages": [...], "completion": "..."}
    response:    200 {"reward": <finite float>, "info": {...} | null}   (other keys are ignored)

The episode key is `episode.info["episode_key"]`, created once per episode
(`"{task_id}:{group_id}:{uuid}"`) and sent unchanged on every retry, so a verifier with side
effects can deduplicate.

Failure policy (the Reward contract: an infrastructure failure is never a reward of 0):
  * retried, with full-jitter exponential backoff: connect errors, timeouts, dropped connections
    (read/write errors, remote protocol errors), HTTP 5xx and 429 (a `Retry-After` on 429/503 is
    honoured, capped by `backoff_max_s`);
  * not retried: other 4xx, malformed JSON, a body that breaks the schema or exceeds
    `max_response_bytes` (checked while streaming, so an endless body costs at most the cap);
  * the result is status "timeout" if the last failed attempt was a timeout, else "error"; either
    way `value` is NaN and `info` holds "error" (a readable reason), "kind" and "attempts".
"""

from __future__ import annotations

import asyncio
import contextlib
import email.utils
import json
import logging
import math
import os
import random
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field, replace
from typing import Any, AsyncIterator

import httpx
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from agentrl.types import Episode
from rewards.base import RewardResult
from rewards.rules import last_assistant_text

log = logging.getLogger(__name__)


class VerifierConfig(BaseModel):
    """One verifier endpoint and how hard to try it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    url: str = Field(description="Full URL the episode is POSTed to, e.g. http://host:8000/verify.")
    connect_timeout_s: float = Field(5.0, gt=0, le=300, description="TCP/TLS connect deadline per attempt.")
    read_timeout_s: float = Field(30.0, gt=0, le=3600, description="Max wait between bytes of the response.")
    write_timeout_s: float = Field(10.0, gt=0, le=3600, description="Max wait while sending the request.")
    pool_timeout_s: float = Field(10.0, gt=0, le=3600, description="Max wait for a pooled connection.")
    max_retries: int = Field(3, ge=0, le=20, description="Retries after the first attempt (attempts = 1 + this).")
    backoff_base_s: float = Field(0.25, ge=0, le=60, description="Backoff scale: sleep ~ U(0, base * 2**retry).")
    backoff_max_s: float = Field(10.0, ge=0, le=600, description="Cap on one backoff sleep and on Retry-After.")
    max_concurrency: int = Field(64, ge=1, le=4096, description="Requests in flight to this endpoint at most.")
    auth_env: str | None = Field(
        None, description="Name of an env var holding a bearer token (sent as Authorization: Bearer ...)."
    )
    max_response_bytes: int = Field(1 << 20, ge=64, le=1 << 30, description="Larger response bodies are an error.")

    @field_validator("url")
    @classmethod
    def _http_url(cls, url: str) -> str:
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"verifier url must start with http:// or https://, got {url!r}")
        return url

    @model_validator(mode="after")
    def _backoff_order(self) -> "VerifierConfig":
        if self.backoff_max_s < self.backoff_base_s:
            raise ValueError("backoff_max_s must be >= backoff_base_s")
        return self


class VerifierResponse(BaseModel):
    """The body a verifier returns. Extra keys are ignored so verifiers can add fields."""

    reward: float = Field(strict=True, allow_inf_nan=False)  # strict: "1.0" and true are rejected
    info: dict[str, Any] | None = None


@dataclass
class VerifierStats:
    """Counters for one endpoint. calls = ok + error + timeout + cancelled once no call is in flight."""

    url: str
    calls: int = 0
    ok: int = 0
    error: int = 0
    timeout: int = 0
    cancelled: int = 0  # calls the caller cancelled (asyncio.CancelledError is re-raised, never a result)
    retries: int = 0  # attempts after the first, summed over calls
    in_flight: int = 0
    max_in_flight: int = 0  # high-water mark of concurrent requests (attempts) to the endpoint
    by_kind: Counter[str] = field(default_factory=Counter)  # final failure kind of failed calls
    attempt_failures: Counter[str] = field(default_factory=Counter)  # every failed attempt, retried or not


@dataclass(frozen=True)
class _Failure:
    kind: str  # short machine-readable class: "connect", "timeout_read", "http_503", "bad_schema", ...
    message: str
    retryable: bool
    timeout: bool = False
    retry_after_s: float | None = None
    http_status: int | None = None


class _TooLarge(Exception):
    pass


def episode_key(episode: Episode) -> str:
    """The episode's idempotency key, created on first use and stored in episode.info."""
    key = episode.info.get("episode_key")
    if not key:
        key = f"{episode.task_id}:{episode.group_id}:{uuid.uuid4().hex}"
        episode.info["episode_key"] = key
    return str(key)


def _retry_after_s(value: str | None) -> float | None:
    """Seconds from a Retry-After header: delta-seconds or an HTTP date (RFC 9110 10.2.3)."""
    if not value:
        return None
    try:
        seconds = float(value)
    except ValueError:
        try:
            seconds = email.utils.parsedate_to_datetime(value).timestamp() - time.time()
        except (TypeError, ValueError, IndexError):
            return None
    return max(0.0, seconds) if math.isfinite(seconds) else None


def _exception_failure(exc: httpx.HTTPError) -> _Failure:
    reason = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
    if isinstance(exc, httpx.TimeoutException):
        kind = {httpx.ConnectTimeout: "timeout_connect", httpx.ReadTimeout: "timeout_read",
                httpx.WriteTimeout: "timeout_write", httpx.PoolTimeout: "timeout_pool"}.get(type(exc), "timeout")
        return _Failure(kind, reason, retryable=True, timeout=True)
    if isinstance(exc, httpx.ConnectError):
        return _Failure("connect", reason, retryable=True)
    if isinstance(exc, (httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError)):
        return _Failure("dropped", reason, retryable=True)  # connection closed or reset mid-exchange
    return _Failure("transport", reason, retryable=False)  # bad URL, local protocol, decoding errors


async def _read_capped(response: httpx.Response, cap: int) -> bytes:
    """The (decoded) body, raising _TooLarge as soon as it exceeds `cap` bytes."""
    declared = response.headers.get("content-length")
    if declared and declared.isdigit() and int(declared) > cap and "content-encoding" not in response.headers:
        raise _TooLarge(f"Content-Length {declared}")
    chunks, size = [], 0
    async for chunk in response.aiter_bytes():
        size += len(chunk)
        if size > cap:
            raise _TooLarge(f"more than {cap} bytes received")
        chunks.append(chunk)
    return b"".join(chunks)


def _parse(body: bytes) -> VerifierResponse | _Failure:
    try:
        data = json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        snippet = body[:120].decode("utf-8", "replace")
        return _Failure("bad_json", f"response is not JSON ({exc}): {snippet!r}", retryable=False)
    try:
        return VerifierResponse.model_validate(data)
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'body'}: {e['msg']}" for e in exc.errors())
        return _Failure("bad_schema", f"response breaks the schema {{reward: finite float, info: object}}: "
                        f"{problems}", retryable=False)


class HttpVerifier:
    """`async (episode) -> RewardResult` backed by one pooled httpx.AsyncClient for one endpoint.

    Reuse one instance per endpoint for the whole run (one event loop) and `await aclose()` at the end.
    `transport` replaces the network, e.g. with httpx.MockTransport in unit tests.
    """

    def __init__(self, config: VerifierConfig, *, transport: httpx.AsyncBaseTransport | None = None):
        self.config = config
        self._headers = {"Content-Type": "application/json", "Accept": "application/json"}
        if config.auth_env:
            token = os.environ.get(config.auth_env)
            if not token:
                raise ValueError(
                    f"verifier {config.url}: auth_env={config.auth_env!r} names an environment variable that "
                    f"is unset or empty; export {config.auth_env}=<bearer token> or drop auth_env"
                )
            self._headers["Authorization"] = f"Bearer {token}"
        self._transport = transport
        self._client: httpx.AsyncClient | None = None
        self._sem = asyncio.Semaphore(config.max_concurrency)
        self._stats = VerifierStats(url=config.url)
        self._rng = random.Random()

    def __repr__(self) -> str:  # never shows the token
        return f"HttpVerifier({self.config.url!r}, max_concurrency={self.config.max_concurrency})"

    def _get_client(self) -> httpx.AsyncClient:
        if self._client is None:
            c = self.config
            n = c.max_concurrency
            self._client = httpx.AsyncClient(
                headers=self._headers,
                timeout=httpx.Timeout(connect=c.connect_timeout_s, read=c.read_timeout_s,
                                      write=c.write_timeout_s, pool=c.pool_timeout_s),
                limits=httpx.Limits(max_connections=n, max_keepalive_connections=n),
                transport=self._transport,
            )
        return self._client

    async def aclose(self) -> None:
        if self._client is not None:
            await self._client.aclose()
            self._client = None

    async def __aenter__(self) -> "HttpVerifier":
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    def stats(self) -> VerifierStats:
        """A snapshot of this endpoint's counters."""
        s = self._stats
        return replace(s, by_kind=Counter(s.by_kind), attempt_failures=Counter(s.attempt_failures))

    async def __call__(self, episode: Episode) -> RewardResult:
        self._stats.calls += 1
        key = episode_key(episode)
        payload = {"episode_id": key, "task": episode.info.get("task"), "messages": episode.messages,
                   "completion": last_assistant_text(episode.messages)}
        try:
            body = json.dumps(payload, ensure_ascii=False, allow_nan=False).encode()
        except (TypeError, ValueError) as exc:
            return self._failed(_Failure("encode", f"episode is not JSON-serialisable: {exc}", False), 0)
        headers = {"Idempotency-Key": key}
        attempt, started = 0, time.perf_counter()
        while True:
            attempt += 1
            try:
                outcome = await self._attempt(body, headers)
            except asyncio.CancelledError:
                self._stats.cancelled += 1
                raise
            if isinstance(outcome, VerifierResponse):
                self._stats.ok += 1
                info = {"attempts": attempt, "latency_s": time.perf_counter() - started,
                        "verifier": outcome.info or {}}
                return RewardResult(outcome.reward, "ok", info)
            self._stats.attempt_failures[outcome.kind] += 1
            if not outcome.retryable or attempt > self.config.max_retries:
                return self._failed(outcome, attempt)
            self._stats.retries += 1
            delay = self._backoff_s(attempt, outcome.retry_after_s)
            log.debug("verifier %s attempt %d failed (%s); retrying in %.3fs", self.config.url, attempt,
                      outcome.message, delay)
            try:
                await asyncio.sleep(delay)
            except asyncio.CancelledError:
                self._stats.cancelled += 1
                raise

    def _backoff_s(self, attempt: int, retry_after_s: float | None) -> float:
        c = self.config
        if retry_after_s is not None:
            return min(retry_after_s, c.backoff_max_s)
        # Full jitter (AWS Architecture Blog, "Exponential Backoff and Jitter"): U(0, min(cap, base * 2^n)).
        return self._rng.uniform(0.0, min(c.backoff_max_s, c.backoff_base_s * 2 ** (attempt - 1)))

    def _failed(self, failure: _Failure, attempts: int) -> RewardResult:
        status = "timeout" if failure.timeout else "error"
        if status == "timeout":
            self._stats.timeout += 1
        else:
            self._stats.error += 1
        self._stats.by_kind[failure.kind] += 1
        info: dict[str, Any] = {"error": failure.message, "kind": failure.kind, "attempts": attempts,
                                "url": self.config.url}
        if failure.http_status is not None:
            info["http_status"] = failure.http_status
        log.warning("verifier %s: %s after %d attempt(s): %s", self.config.url, status, attempts, failure.message)
        return RewardResult(float("nan"), status, info)

    @contextlib.asynccontextmanager
    async def _slot(self) -> AsyncIterator[None]:
        async with self._sem:
            s = self._stats
            s.in_flight += 1
            s.max_in_flight = max(s.max_in_flight, s.in_flight)
            try:
                yield
            finally:
                s.in_flight -= 1

    async def _attempt(self, body: bytes, headers: dict[str, str]) -> VerifierResponse | _Failure:
        cap = self.config.max_response_bytes
        async with self._slot():
            try:
                async with self._get_client().stream("POST", self.config.url, content=body,
                                                     headers=headers) as response:
                    if not 200 <= response.status_code < 300:
                        return await self._status_failure(response)
                    raw = await _read_capped(response, cap)
            except _TooLarge as exc:
                return _Failure("too_large", f"response body exceeds max_response_bytes={cap} ({exc})", False)
            except httpx.HTTPError as exc:
                return _exception_failure(exc)
        return _parse(raw)

    async def _status_failure(self, response: httpx.Response) -> _Failure:
        code = response.status_code
        try:
            snippet = (await _read_capped(response, 2048)).decode("utf-8", "replace")[:300]
        except (_TooLarge, httpx.HTTPError):
            snippet = ""
        retryable = code >= 500 or code == 429
        retry_after = _retry_after_s(response.headers.get("retry-after")) if code in (429, 503) else None
        phrase = response.reason_phrase or ""
        message = f"HTTP {code} {phrase}".rstrip() + (f": {snippet.strip()}" if snippet.strip() else "")
        return _Failure(f"http_{code}", message, retryable, retry_after_s=retry_after, http_status=code)
