"""What bounds the OpenAI endpoint on a shared machine, and what its errors may show.

Sessions opened over HTTP (`POST /sessions`, agentrl.serve) expire after `server.session_idle_timeout_s`
without a request and hold at most `server.session_max_turns` turns and `server.session_max_tokens`
tokens over all their segments; a generation with no deadline from the rollout gets
`server.generation_timeout_s`. A 5xx body names an error id that the server's log holds with the
exception and its traceback (`public`), never the exception itself.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from dataclasses import replace

from agentrl.config import ServerConfig
from agentrl.utils.http_common import error_id, internal_error
from agentrl.rollout.openai_protocol import ProtocolError
from agentrl.rollout.session import Limits, Session

log = logging.getLogger("agentrl.rollout.openai_server")


def with_deadline(limits: Limits, cfg: ServerConfig) -> Limits:
    """`limits` with the server's generation deadline where the rollout set none (agentrl.serve)."""
    return limits if limits.timeout_s is not None else replace(limits, timeout_s=cfg.generation_timeout_s)


def http_limits(limits: Limits, cfg: ServerConfig) -> Limits:
    """The limits of a session a client opened over HTTP: the server's per-session caps on top."""
    return replace(limits, max_turns=min(limits.max_turns, cfg.session_max_turns),
                   max_session_tokens=cfg.session_max_tokens)


def too_many_sessions(n: int, cfg: ServerConfig) -> ProtocolError:
    return ProtocolError(f"{n} sessions are open, the limit (server.max_sessions): close sessions you are done "
                         f"with (DELETE /sessions/<id>) or wait for idle ones to expire after "
                         f"{cfg.session_idle_timeout_s:g} s", None, 429, "too_many_sessions")


def unknown_session(sid: str, cfg: ServerConfig) -> ProtocolError:
    shown = sid if len(sid) <= 64 else sid[:64] + "..."
    return ProtocolError(f"no session {shown!r} (it ended, expired after {cfg.session_idle_timeout_s:g} s"
                         " idle, or never existed)", None, 404, "session_not_found")


def sweep(sessions: dict[str, Session], cfg: ServerConfig, counters: Counter, now: float | None = None) -> int:
    """Close the expiring sessions idle for `server.session_idle_timeout_s`; how many were closed.
    A session serving a request is not idle; a training episode's session ends with its episode."""
    now, idle = time.monotonic() if now is None else now, cfg.session_idle_timeout_s
    stale = [sid for sid, s in sessions.items() if s.expires and not s.lock.locked() and now - s.last_used >= idle]
    for sid in stale:
        del sessions[sid]
    if stale:
        counters["sessions_expired"] += len(stale)
        log.info("closed %d session(s) idle for %g s or more (server.session_idle_timeout_s)", len(stale), idle)
    return len(stale)


def sweep_period_s(cfg: ServerConfig) -> float:
    """A quarter of the idle timeout: a session outlives its last request by at most 1.25x the timeout."""
    return min(30.0, max(0.01, cfg.session_idle_timeout_s / 4))


def public(exc: ProtocolError, what: str) -> ProtocolError:
    """`exc` as the client may see it: a 5xx is logged (with the engine's error and the traceback) under
    an error id, and its message names the id instead of anything internal."""
    if exc.status < 500:
        return exc
    detail = getattr(exc, "detail", None)
    text = f"{what}: {exc}" + (f" ({detail})" if detail else "")
    if exc.status == 500:  # a bug: the traceback goes to the log
        eid = internal_error(log, text, exc.__cause__ or exc)
    else:  # 502-504, an engine's error or a deadline: an episode status in training, one line in the log
        eid = error_id()
        log.warning("%s (error id %s)", text, eid)
    return ProtocolError(f"{exc} (error id {eid}; the server's log has the details)", exc.param, exc.status,
                         exc.code, exc.kind)


def internal(what: str, exc: BaseException) -> ProtocolError:
    """A bug of the server, as a 500 in OpenAI's shape: an id for the client, the traceback in the log."""
    eid = internal_error(log, what, exc)
    return ProtocolError(f"internal server error (error id {eid}; the server's log has the details)", None, 500,
                         "internal_error", kind="server_error")
