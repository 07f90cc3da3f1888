"""Local servers answer local programs only: one aiohttp middleware every server of the project puts first
(serve, the sandbox, the tool server, the verifier, the run viewer).

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

Every refusal is a JSON body {"error": reason}.
"""

from __future__ import annotations

import hmac
import ipaddress
import logging
import socket
from typing import Any, Awaitable, Callable, Iterable
from urllib.parse import urlsplit

from aiohttp import web

LOOPBACK_NAMES = ("localhost", "127.0.0.1", "::1")
STATE_CHANGING = frozenset({"POST", "PUT", "PATCH", "DELETE"})
TOKEN_ENV = "AGENTRL_SERVER_TOKEN"  # the optional bearer token of the rewards servers

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def is_loopback(host: str) -> bool:
    """`host` (a name or an address, brackets allowed) is this machine's loopback."""
    host = host.strip("[]")
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _wildcard(host: str) -> bool:
    return host in ("", "0.0.0.0", "::", "[::]")


def _ip_literal(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
        return True
    except ValueError:
        return False


def host_name(header: str) -> str:
    """The name part of a Host header (or an Origin's netloc): port and IPv6 brackets gone, lower case."""
    header = header.strip().lower()
    if header.startswith("["):
        return header[1:].partition("]")[0]
    if header.count(":") == 1:  # name:port; a bare IPv6 address has several colons and no port
        return header.partition(":")[0]
    return header


def allowed_names(bind_host: str, allow_hosts: Iterable[str] = ()) -> frozenset[str]:
    """The Host names a server bound to `bind_host` answers to (besides IP literals on a wildcard bind)."""
    names = {host_name(h) for h in allow_hosts if h}
    if is_loopback(bind_host) or _wildcard(bind_host):
        names.update(LOOPBACK_NAMES)  # a wildcard bind also listens on loopback
    if not is_loopback(bind_host):
        names.add(host_name(bind_host))
        names.update(n.lower() for n in (socket.gethostname(), socket.getfqdn()) if n and not is_loopback(n))
    return frozenset(names - {""})


def _refuse(status: int, reason: str) -> web.Response:
    return web.json_response({"error": reason}, status=status)


def _media_type(content_type: str) -> str:
    return content_type.split(";", 1)[0].strip().lower()  # "application/json; charset=utf-8" is JSON


def _origin_netloc(origin: str) -> str | None:
    """scheme://host[:port] -> host[:port] without a default port; None for "null" or garbage."""
    try:
        parts = urlsplit(origin.strip())
        default = {"http": 80, "https": 443}.get(parts.scheme)
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


def local_only(bind_host: str, allow_hosts: Iterable[str] = (), token: str | None = None) -> Any:
    """The middleware for a server listening on `bind_host`; see the module's docstring."""
    names = allowed_names(bind_host, allow_hosts)
    any_ip = _wildcard(bind_host)
    expected = f"Bearer {token}".encode() if token else None

    @web.middleware
    async def middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
        host = request.headers.get("Host")
        if host is not None:  # HTTP/1.0 clients may send none; a browser always sends one
            name = host_name(host)
            if name not in names and not (any_ip and _ip_literal(name)):
                return _refuse(403, f"Host {host!r} is not a name of this server's address {bind_host!r} (a web "
                                    "page's own name re-pointed here?); add it with --allow-host if it is yours")
        origin = request.headers.get("Origin")
        if origin is not None and (host is None or not _same_origin(origin, host)):
            return _refuse(403, f"cross-site request from Origin {origin!r} refused: this server answers local "
                                "programs, not web pages")
        if request.method in STATE_CHANGING:
            content_type = request.headers.get("Content-Type")
            if content_type is None and request.body_exists:
                return _refuse(415, f"{request.method} with a body needs Content-Type: application/json")
            if content_type is not None and _media_type(content_type) != "application/json":
                return _refuse(415, f"Content-Type {content_type!r} refused: {request.method} bodies must be "
                                    "application/json (what a web page can send without asking is refused)")
        if expected is not None:
            given = request.headers.get("Authorization", "").encode("utf-8", "surrogateescape")
            if not hmac.compare_digest(given, expected):
                return _refuse(401, "missing or wrong bearer token (Authorization: Bearer <token>)")
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
