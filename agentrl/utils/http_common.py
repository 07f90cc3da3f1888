"""The HTTP discipline shared by every remote endpoint (reward verifiers, tool servers), and the two
rules every server here keeps (`loads_request`, `internal_error`): a body that is no usable JSON is
the client's mistake (a 400 naming why), and a 5xx names an error id, never the exception.

One `PooledEndpoint` owns one pooled httpx.AsyncClient for one endpoint and makes requests with:
  * per-phase timeouts (connect / read / write / pool) and a cap on requests in flight;
  * retries with full-jitter exponential backoff on connect errors, timeouts, dropped connections
    (read/write errors, remote protocol errors), HTTP 5xx and 429 (a `Retry-After` on 429/503 is
    honoured, capped by `backoff_max_s`); never on other 4xx, malformed JSON, a body that breaks the
    schema or exceeds `max_response_bytes` (checked while streaming, so an endless body costs at most the cap);
  * an outcome that is the parsed reply or a `Failure` (kind, readable message, whether it was a
    timeout), never an exception, so callers report infrastructure failures instead of guessing values.
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
from typing import Any, AsyncIterator, Callable, TypeVar

import httpx
from pydantic import BaseModel, ValidationError

from agentrl.config import EndpointConfig

log = logging.getLogger(__name__)

T = TypeVar("T")


@dataclass
class EndpointStats:
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
class Failure:
    kind: str  # short machine-readable class: "connect", "timeout_read", "http_503", "bad_schema", ...
    message: str
    retryable: bool
    timeout: bool = False
    retry_after_s: float | None = None
    http_status: int | None = None

    @property
    def status(self) -> str:
        return "timeout" if self.timeout else "error"

    def info(self, attempts: int, url: str) -> dict[str, Any]:
        """What a caller reports for this failure: error, kind, attempts, url (and http_status)."""
        out: dict[str, Any] = {"error": self.message, "kind": self.kind, "attempts": attempts, "url": url}
        if self.http_status is not None:
            out["http_status"] = self.http_status
        return out


class TooLarge(Exception):
    pass


def retry_after_s(value: str | None) -> float | None:
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


def exception_failure(exc: httpx.HTTPError) -> Failure:
    reason = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
    if isinstance(exc, httpx.TimeoutException):
        kind = {httpx.ConnectTimeout: "timeout_connect", httpx.ReadTimeout: "timeout_read",
                httpx.WriteTimeout: "timeout_write", httpx.PoolTimeout: "timeout_pool"}.get(type(exc), "timeout")
        return Failure(kind, reason, retryable=True, timeout=True)
    if isinstance(exc, httpx.ConnectError):
        return Failure("connect", reason, retryable=True)
    if isinstance(exc, (httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError)):
        return Failure("dropped", reason, retryable=True)  # connection closed or reset mid-exchange
    return Failure("transport", reason, retryable=False)  # bad URL, local protocol, decoding errors


async def read_capped(response: httpx.Response, cap: int) -> bytes:
    """The (decoded) body, raising TooLarge as soon as it exceeds `cap` bytes."""
    declared = response.headers.get("content-length")
    if declared and declared.isdigit() and int(declared) > cap and "content-encoding" not in response.headers:
        raise TooLarge(f"Content-Length {declared}")
    chunks, size = [], 0
    async for chunk in response.aiter_bytes():
        size += len(chunk)
        if size > cap:
            raise TooLarge(f"more than {cap} bytes received")
        chunks.append(chunk)
    return b"".join(chunks)


def parse_json_model(body: bytes, model: type[BaseModel], shape: str) -> Any:
    """`model` validated from a JSON body, or a non-retryable Failure ("bad_json" / "bad_schema").

    `shape` describes the expected body in the error message, e.g. "{reward: finite float, info: object}".
    """
    try:
        data = json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        snippet = body[:120].decode("utf-8", "replace")
        return Failure("bad_json", f"response is not JSON ({exc}): {snippet!r}", retryable=False)
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'body'}: {e['msg']}" for e in exc.errors())
        return Failure("bad_schema", f"response breaks the schema {shape}: {problems}", retryable=False)


class PooledEndpoint:
    """One pooled httpx.AsyncClient for one endpoint, and `request()` with the retry policy above.

    Reuse one instance per endpoint for the whole run (one event loop) and `await aclose()` at the end.
    `transport` replaces the network, e.g. with httpx.MockTransport in unit tests.
    """

    label = "endpoint"  # names the kind of endpoint in logs and errors

    def __init__(self, config: EndpointConfig, *, transport: httpx.AsyncBaseTransport | None = None):
        self.config = config
        self._headers = {"Content-Type": "application/json", "Accept": "application/json"}
        if config.auth_env:
            token = os.environ.get(config.auth_env)
            if not token:
                raise ValueError(
                    f"{self.label} {config.url}: auth_env={config.auth_env!r} names an environment variable that "
                    f"is unset or empty; export {config.auth_env}=<bearer token> or drop auth_env"
                )
            self._headers["Authorization"] = f"Bearer {token}"
        self._transport = transport
        self._client: httpx.AsyncClient | None = None
        self._sem = asyncio.Semaphore(config.max_concurrency)
        self._stats = EndpointStats(url=config.url)
        self._rng = random.Random()

    def __repr__(self) -> str:  # never shows the token
        return f"{type(self).__name__}({self.config.url!r}, max_concurrency={self.config.max_concurrency})"

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

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()

    def stats(self) -> EndpointStats:
        """A snapshot of this endpoint's counters."""
        s = self._stats
        return replace(s, by_kind=Counter(s.by_kind), attempt_failures=Counter(s.attempt_failures))

    async def request(self, method: str, url: str, parse: Callable[[bytes], T | Failure], *,
                      body: bytes | None = None, headers: dict[str, str] | None = None) -> tuple[T | Failure, int]:
        """One call (with retries): (parsed reply or the last Failure, attempts made). Counts the call."""
        self._stats.calls += 1
        attempt = 0
        try:
            while True:
                attempt += 1
                outcome = await self._attempt(method, url, parse, body, headers)
                if not isinstance(outcome, Failure):
                    self._stats.ok += 1
                    return outcome, attempt
                self._stats.attempt_failures[outcome.kind] += 1
                if not outcome.retryable or attempt > self.config.max_retries:
                    self.record_failure(outcome, attempt)
                    return outcome, attempt
                self._stats.retries += 1
                delay = self._backoff_s(attempt, outcome.retry_after_s)
                log.debug("%s %s attempt %d failed (%s); retrying in %.3fs", self.label, url, attempt,
                          outcome.message, delay)
                await asyncio.sleep(delay)
        except asyncio.CancelledError:
            self._stats.cancelled += 1
            raise

    def record_failure(self, failure: Failure, attempts: int) -> None:
        """Count a call's final failure (also one that never reached the network) and log it."""
        if failure.timeout:
            self._stats.timeout += 1
        else:
            self._stats.error += 1
        self._stats.by_kind[failure.kind] += 1
        log.warning("%s %s: %s after %d attempt(s): %s", self.label, self.config.url, failure.status, attempts,
                    failure.message)

    def _backoff_s(self, attempt: int, retry_after: float | None) -> float:
        c = self.config
        if retry_after is not None:
            return min(retry_after, c.backoff_max_s)
        # Full jitter (AWS Architecture Blog, "Exponential Backoff and Jitter"): U(0, min(cap, base * 2^n)).
        return self._rng.uniform(0.0, min(c.backoff_max_s, c.backoff_base_s * 2 ** (attempt - 1)))

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

    async def _attempt(self, method: str, url: str, parse: Callable[[bytes], T | Failure], body: bytes | None,
                       headers: dict[str, str] | None) -> T | Failure:
        cap = self.config.max_response_bytes
        async with self._slot():
            try:
                async with self._get_client().stream(method, url, content=body, headers=headers) as response:
                    if not 200 <= response.status_code < 300:
                        return await _status_failure(response)
                    raw = await read_capped(response, cap)
            except TooLarge as exc:
                return Failure("too_large", f"response body exceeds max_response_bytes={cap} ({exc})", False)
            except httpx.HTTPError as exc:
                return exception_failure(exc)
        return parse(raw)


async def _status_failure(response: httpx.Response) -> Failure:
    code = response.status_code
    try:
        snippet = (await read_capped(response, 2048)).decode("utf-8", "replace")[:300]
    except (TooLarge, httpx.HTTPError):
        snippet = ""
    retryable = code >= 500 or code == 429
    retry_after = retry_after_s(response.headers.get("retry-after")) if code in (429, 503) else None
    phrase = response.reason_phrase or ""
    message = f"HTTP {code} {phrase}".rstrip() + (f": {snippet.strip()}" if snippet.strip() else "")
    return Failure(f"http_{code}", message, retryable, retry_after_s=retry_after, http_status=code)


# ---------------------------------------------------------------- the server side

MAX_JSON_DEPTH = 64  # no request of any endpoint here nests deeper; json.loads would recurse to ~1000


class BadRequestBody(ValueError):
    """A request body that is no usable JSON: the client's mistake, answered with a 400."""


def _constant(name: str) -> Any:
    raise BadRequestBody(f"the request body holds {name}, which is not JSON (RFC 8259 has no NaN or Infinity)")


def _check_value(value: Any, depth: int) -> None:
    if depth > MAX_JSON_DEPTH:
        raise BadRequestBody(f"the request body nests deeper than {MAX_JSON_DEPTH} levels")
    if isinstance(value, str):
        # A lone surrogate ("\ud800") decodes from JSON but is no text: a tokenizer or a UTF-8 encoder fails on it.
        if _has_surrogate(value):
            raise BadRequestBody("the request body holds a string with a lone UTF-16 surrogate (not valid Unicode)")
    elif isinstance(value, dict):
        for key, item in value.items():
            _check_value(key, depth + 1)
            _check_value(item, depth + 1)
    elif isinstance(value, list):
        for item in value:
            _check_value(item, depth + 1)


def _has_surrogate(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def loads_request(raw: bytes) -> Any:
    """A request body as JSON, or BadRequestBody saying why not: not UTF-8, not JSON, NaN/Infinity,
    an integer too long to convert, deeper than MAX_JSON_DEPTH, or a lone surrogate in a string."""
    try:
        value = json.loads(raw, parse_constant=_constant)
    except BadRequestBody:
        raise
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise BadRequestBody(f"the request body is not valid JSON: {exc}") from None
    except ValueError as exc:  # "Exceeds the limit (4300 digits) for integer string conversion"
        raise BadRequestBody(f"the request body is not usable JSON: {exc}") from None
    except RecursionError:
        raise BadRequestBody(f"the request body nests deeper than {MAX_JSON_DEPTH} levels") from None
    _check_value(value, 0)
    return value


def error_id() -> str:
    """A fresh id for one server-side failure: the client's 5xx body names it, the server's log line too."""
    return uuid.uuid4().hex[:16]


def internal_error(logger: logging.Logger, what: str, exc: BaseException | None = None) -> str:
    """Log a server-side failure with its traceback under a fresh error id and return the id: the
    client's 5xx body names the id, never the exception, so internals stay in the server's log."""
    eid = error_id()
    logger.error("%s failed (error id %s)", what, eid, exc_info=exc if exc is not None else False)
    return eid
