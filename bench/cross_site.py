"""What each local server answers to what a hostile web page (or a stranger without the token) can send: every
server the project runs (`agentrl serve`'s OpenAI endpoint on a scripted engine, the sandbox, the tool server,
the verifier, the run viewer, an OpenEnv app behind envs.openenv_server's guard), each on 127.0.0.1 with a bearer
token (the viewer has none), against one request per rule, each breaking that rule only (the token is sent
unless the column is "no token"):

  text/plain POST    a simple request (no preflight): Content-Type text/plain
  foreign Host       Host: evil.localtest:PORT (a name that is not the server's)
  foreign Origin     Origin: http://evil.localtest:PORT (a page of another site)
  rebinding          Host and Origin both the rebound name (the page's same-origin request), no token
  no token           a JSON request without Authorization
  JSON preflight     OPTIONS from a foreign Origin asking to POST application/json (what a browser asks first)
  own client         the server's own client: JSON, its token, loopback Host (must be accepted)

Each cell is refused/accepted and the HTTP status; `handled` is how many of the requests reached the server's
handlers (1: its own client's only). The servers are tests/test_cross_site_browser.py's `Servers`.

    python bench/cross_site.py
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

from _common import ROOT, print_host, progress, table

sys.path.insert(0, str(ROOT / "tests"))

from test_cross_site_browser import EVIL, Servers, Target  # noqa: E402

COLUMNS = ("text/plain POST", "foreign Host", "foreign Origin", "rebinding", "no token", "JSON preflight",
           "own client")


def attempts(t: Target) -> dict[str, tuple[str, dict[str, str]]]:
    """column -> (method, headers) for target `t`; the body is its JSON request (as text/plain in the first)."""
    evil = f"{EVIL}:{t.port}"
    return {"text/plain POST": ("POST", {**t.auth, "Content-Type": "text/plain"}),
            "foreign Host": ("POST", {**t.auth, "Host": evil}),
            "foreign Origin": ("POST", {**t.auth, "Origin": f"http://{evil}"}),
            "rebinding": ("POST", {"Host": evil, "Origin": f"http://{evil}"}),
            "no token": ("POST", {}),
            "JSON preflight": ("OPTIONS", {"Origin": f"http://{evil}", "Access-Control-Request-Method": "POST",
                                           "Access-Control-Request-Headers": "content-type"}),
            "own client": ("POST", dict(t.auth))}


def cell(reply) -> str:
    granted = [h for h in reply.headers if h.lower().startswith("access-control-allow")]
    word = "accepted" if reply.status_code < 400 else "refused"
    return f"{word} {reply.status_code}" + (" +CORS!" if granted else "")


def main() -> None:
    import httpx

    from agentrl.config import DefaultModelConfig
    from agentrl.models.default import build_tokenizer

    print_host(sys.argv[1:])
    progress("building the embedded model's tokenizer")
    tokenizer = build_tokenizer(DefaultModelConfig(), Path(tempfile.mkdtemp(prefix="cross-site-tok-")))
    rows = []
    with Servers(tokenizer, tokens=True) as servers:
        progress("servers up: " + ", ".join(f"{t.name} {t.url}" for t in servers.targets))
        for t in servers.targets:
            row = [t.name]
            for column, (method, headers) in attempts(t).items():
                if column == "no token" and not t.token:
                    row.append("n/a (no token)")
                    continue
                get = t.name == "viewer" and column not in ("text/plain POST", "JSON preflight")
                method = "GET" if get and method == "POST" else method
                body = None if method != "POST" else t.body
                reply = httpx.request(method, t.url + t.path, json=body if column != "text/plain POST" else None,
                                      content=httpx.Request("POST", "/", json=body).content
                                      if column == "text/plain POST" else None,
                                      headers=headers, timeout=60)
                row.append(cell(reply))
            row.append(len(t.handled))
            rows.append(row)
    print(table(["server", *COLUMNS, "handled"], rows,
                title="cross-site and tokenless requests against every local server (127.0.0.1)"))


if __name__ == "__main__":
    main()
