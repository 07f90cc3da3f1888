"""Local servers answer local programs only: one aiohttp middleware every server of the project puts first
(serve, the sandbox, the tool server, the verifier, the run viewer), and its ASGI twin for the OpenEnv apps
a run starts (agentrl.utils.local_only_asgi); both ask the same `Guard`, so the rules are written once.

Why: a web page in the user's browser can send a "simple request" (a POST whose Content-Type is text/plain,
multipart/form-data or application/x-www-form-urlencoded, or none with a Blob body) to any port on
127.0.0.1 without a CORS preflight, and DNS rebinding (the page's own name re-pointed at 127.0.0.1) lets it
read the answers too. So `local_only(bind_host)` refuses:

  * a Host header that is not a name of the address the server listens on (403): for a loopback bind
    `localhost`, `127.0.0.1`, `[::1]`, with or without the port; for a non-loopback bind that address, this
    machine's host name and, for a wildcard bind (0.0.0.0, ::), any IP literal (rebinding needs a name);
    plus the names given as `allow_hosts` (`--allow-host NAME`);
  * an Origin header that is not the Host itself (403): a browser names the page that sent the request,
    other programs send none;
  * a state-changing request (POST, PUT, PATCH, DELETE) whose media type is not application/json (415): a
    browser must then preflight, and no Access-Control-Allow-* header is ever granted, so the preflight
    fails. A body-less request without a Content-Type (POST /sessions, POST /stats/reset) is let through;
  * with a `token`, a request without `Authorization: Bearer <token>` (401).

Every refusal is a JSON body {"error": reason}. A WebSocket handshake (which no CORS rule covers: any page
may open one to any port) is held to the same Host, Origin and token rules.
"""

from __future__ import annotations

import hmac
import logging
import socket
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Awaitable, Callable, Iterable, Optional
from urllib.parse import urlsplit

from agentrl.utils.hosts import host_name, is_ip_literal, is_loopback, is_wildcard

if TYPE_CHECKING:  # aiohttp is imported where the aiohttp middleware is made: the ASGI one needs none of it
    from aiohttp import web

LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1")
STATE_CHANGING = frozenset({"POST", "PUT", "PATCH", "DELETE"})
TOKEN_ENV = "AGENTRL_SERVER_TOKEN"  # the bearer token of the rewards servers and of the apps a run starts

__all__ = ["Guard", "LOOPBACK_NAMES", "STATE_CHANGING", "TOKEN_ENV", "allowed_names", "host_name", "install",
           "is_loopback", "local_only", "warn_if_exposed"]


def allowed_names(bind_host: str, allow_hosts: Iterable[str] = ()) -> frozenset[str]:
    """The Host names a server bound to `bind_host` answers to (besides IP literals on a wildcard bind)."""
    names = {host_name(h) for h in allow_hosts if h}
    if is_loopback(bind_host) or is_wildcard(bind_host):
        names.update(LOOPBACK_NAMES)  # a wildcard bind also listens on loopback
    if not is_loopback(bind_host):
        names.add(host_name(bind_host))
        names.update(n.lower() for n in (socket.gethostname(), socket.getfqdn()) if n and not is_loopback(n))
    return frozenset(names - {""})


def _media_type(content_type: str) -> str:
    return content_type.split(";", 1)[0].strip().lower()  # "application/json; charset=utf-8" is JSON


def _origin_netloc(origin: str) -> str | None:
    """scheme://host[:port] -> host[:port] without a default port; None for "null" or garbage."""
    try:
        parts = urlsplit(origin.strip())
        default = {"http": 80, "https": 443, "ws": 80, "wss": 443}.get(parts.scheme)
        if not parts.hostname:
            return None
        host = f"[{parts.hostname}]" if ":" in parts.hostname else parts.hostname
        return host if parts.port in (None, default) else f"{host}:{parts.port}"
    except ValueError:
        return None


def _same_origin(origin: str, host: str) -> bool:
    netloc = _origin_netloc(origin)
    host = host.strip().lower()
    for port in (":80", ":443"):  # Host may carry the default port an Origin leaves out
        if host.endswith(port) and not host.endswith("]"):
            host = host[: -len(port)]
    return netloc is not None and netloc.lower() == host


@dataclass(frozen=True)
class Guard:
    """The rules of the module's docstring for one server, free of any web framework: `refusal` is what
    the aiohttp middleware (`local_only`) and the ASGI one (agentrl.utils.local_only_asgi) both ask."""

    bind_host: str
    names: frozenset[str]
    any_ip: bool
    expected: Optional[bytes]  # b"Bearer <token>", or None: no token required

    def __repr__(self) -> str:  # the token stays out of logs and tracebacks
        return f"Guard(bind_host={self.bind_host!r}, names={sorted(self.names)}, token={self.expected is not None})"

    @classmethod
    def for_bind(cls, bind_host: str, allow_hosts: Iterable[str] = (), token: str | None = None) -> "Guard":
        return cls(bind_host, allowed_names(bind_host, allow_hosts), is_wildcard(bind_host),
                   f"Bearer {token}".encode() if token else None)

    def refusal(self, method: str | None, header: Callable[[str], Optional[str]],
                has_body: bool) -> tuple[int, str] | None:
        """(status, reason) to refuse a request with, or None to serve it. `method` is None for a WebSocket
        handshake (no body; its Origin is the only thing that stops a page's cross-site WebSocket), `header`
        looks a header up by name, `has_body` says whether the request carries a body."""
        host = header("Host")
        if host is not None:  # HTTP/1.0 clients may send none; a browser always sends one
            name = host_name(host)
            if name not in self.names and not (self.any_ip and is_ip_literal(name)):
                return 403, (f"Host {host!r} is not a name of this server's address {self.bind_host!r} (a web page's "
                             "own name re-pointed here?); add it with --allow-host if it is yours")
        origin = header("Origin")
        if origin is not None and (host is None or not _same_origin(origin, host)):
            return 403, (f"cross-site request from Origin {origin!r} refused: this server answers local programs, "
                         "not web pages")
        if method in STATE_CHANGING:
            content_type = header("Content-Type")
            if content_type is None and has_body:
                return 415, f"{method} with a body needs Content-Type: application/json"
            if content_type is not None and _media_type(content_type) != "application/json":
                return 415, (f"Content-Type {content_type!r} refused: {method} bodies must be application/json "
                             "(what a web page can send without asking is refused)")
        if self.expected is not None:
            given = (header("Authorization") or "").encode("utf-8", "surrogateescape")
            if not hmac.compare_digest(given, self.expected):
                return 401, "missing or wrong bearer token (Authorization: Bearer <token>)"
        return None


def local_only(bind_host: str, allow_hosts: Iterable[str] = (), token: str | None = None) -> Any:
    """The aiohttp middleware for a server listening on `bind_host`; see the module's docstring."""
    from aiohttp import web

    guard = Guard.for_bind(bind_host, allow_hosts, token)

    @web.middleware
    async def middleware(request: web.Request,
                         handler: Callable[[web.Request], Awaitable[web.StreamResponse]]) -> web.StreamResponse:
        refused = guard.refusal(request.method, request.headers.get, request.body_exists)
        if refused is not None:
            return web.json_response({"error": refused[1]}, status=refused[0])
        return await handler(request)

    return middleware


def install(app: web.Application, bind_host: str, allow_hosts: Iterable[str] = (), token: str | None = None) -> None:
    """Put `local_only` first in `app`'s middlewares (before the app is frozen by its runner), once."""
    if app.frozen or any(getattr(m, "local_only", False) for m in app.middlewares):
        return  # serve() may be given the same app twice
    middleware = local_only(bind_host, allow_hosts, token)
    middleware.local_only = True
    app.middlewares.insert(0, middleware)


def warn_if_exposed(log: logging.Logger, bind_host: str, what: str, risk: str, guarded: bool) -> None:
    """A non-loopback listen without a token: say who can do what (`risk`) at start-up."""
    if not is_loopback(bind_host) and not guarded:
        log.warning("the %s listens on %s, not loopback, with no token: %s. Bind 127.0.0.1, or require a bearer "
                    "token", what, bind_host or "every interface", risk)
