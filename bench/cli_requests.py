"""What a coding CLI sends to its model server: a recording server in the right API shapes, one CLI run
with a fixed prompt pointed at it (no internet), and the table of the requests it made.

    .venv/bin/python bench/cli_requests.py codex|claude|opencode [options] [-- more flags for the CLI]
    .venv/bin/python bench/cli_requests.py claude --upstream scripted --session   # through agentrl's endpoint
    .venv/bin/python bench/cli_requests.py opencode --upstream http://127.0.0.1:8000 --session -- --title t
    .venv/bin/python bench/cli_requests.py claude --from-log --log requests.jsonl   # a recorded log's table
    .venv/bin/python bench/cli_requests.py serve --port 8799 --log requests.jsonl   # the recorder alone

The CLIs are not installed by agentrl (they are other vendors' programs); install them outside the repo:

    mkdir -p /tmp/clis && cd /tmp/clis
    npm install @openai/codex@0.171.0 @anthropic-ai/claude-code@2.1.337 opencode-ai@1.18.33
    (cd node_modules/@anthropic-ai/claude-code && node install.cjs)   # npm 11 skips these postinstall scripts;
    (cd node_modules/opencode-ai && node postinstall.mjs)              # they put the native binary in place

and pass `--bin /tmp/clis/node_modules/.bin` (the default). Each CLI runs in a fresh temporary HOME and
working directory, with the environment that points it at the recorder and turns its telemetry and
update checks off (`cli_runs` below: the exact argv and variables); `--env NAME=VALUE` adds variables and
everything after `--` is passed to the CLI.

The recorder (bench/_cli_recorder.py) answers every model request with "Done." in the API's own shape,
streamed when asked, and logs each request (method, path, headers without secrets, JSON body).
`--upstream URL` forwards the requests to an agentrl endpoint instead (and logs its answers);
`--upstream scripted` starts agentrl's endpoint in this process on an engine that answers "Done." with
no context limit (the protocol without the model); `--session` opens a session there, sends the CLI's
requests into it and prints what its ledger recorded (tokens, segments and why each split).

The table gives per request: endpoint, prompt characters (instructions/system + messages/input, and the
tool specs separately), tokens of both under a tokenizer (`--model`: `default` the embedded default's,
a named model such as smollm2-135m-instruct or a folder; `-` none), tool count and the body's top-level
fields; then the answers (forwarded), the values of the fields an endpoint may refuse, and the headers
beyond the usual ones (beta flags, versions).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from aiohttp import web

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench._cli_recorder import REPLY, recorder_app, start_recorder  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
PROMPT = "Reply with the single word Done."


# ------------------------------------------------------------------ the CLIs


def cli_runs(bin_dir: Path, url: str, home: Path, prompt: str) -> dict[str, tuple[list[str], dict[str, str]]]:
    """Per CLI: (argv, environment) for one non-interactive run against `url`, no outbound traffic."""
    quiet = {"DO_NOT_TRACK": "1", "NO_COLOR": "1"}
    return {
        # Codex: a custom provider (config.toml overrides on the command line) speaking the Responses API.
        "codex": ([str(bin_dir / "codex"), "exec", "--skip-git-repo-check", "--sandbox", "read-only",
                   "-c", 'model_provider="agentrl"', "-c", 'model="agentrl"',
                   "-c", 'model_providers.agentrl.name="agentrl"',
                   "-c", f'model_providers.agentrl.base_url="{url}/v1"',
                   "-c", 'model_providers.agentrl.env_key="AGENTRL_KEY"',
                   "-c", 'model_providers.agentrl.wire_api="responses"',
                   "-c", "model_providers.agentrl.request_max_retries=0",
                   "-c", "model_providers.agentrl.stream_max_retries=0",
                   "-c", "analytics.enabled=false", "-c", "check_for_update_on_startup=false",
                   prompt],
                  {**quiet, "AGENTRL_KEY": "unused", "CODEX_HOME": str(home / ".codex")}),
        # Claude Code: print mode; ANTHROPIC_BASE_URL without /v1 (it adds /v1/messages).
        "claude": ([str(bin_dir / "claude"), "-p", prompt, "--model", "agentrl", "--output-format", "json"],
                   {**quiet, "ANTHROPIC_BASE_URL": url, "ANTHROPIC_API_KEY": "unused",
                    "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1", "DISABLE_TELEMETRY": "1",
                    "DISABLE_AUTOUPDATER": "1", "DISABLE_ERROR_REPORTING": "1", "DISABLE_BUG_COMMAND": "1",
                    "CLAUDE_CODE_DISABLE_TERMINAL_TITLE": "1", "ANTHROPIC_SMALL_FAST_MODEL": "agentrl",
                    "ANTHROPIC_DEFAULT_HAIKU_MODEL": "agentrl"}),
        # opencode: a custom OpenAI-compatible provider in OPENCODE_CONFIG_CONTENT; `run` is non-interactive.
        "opencode": ([str(bin_dir / "opencode"), "run", "--model", "agentrl/agentrl", prompt],
                     {**quiet, "OPENCODE_DISABLE_AUTOUPDATE": "1", "OPENCODE_DISABLE_SHARE": "1",
                      "OPENCODE_DISABLE_LSP_DOWNLOAD": "1", "OPENCODE_DISABLE_MODELS_FETCH": "1",
                      "OPENCODE_DISABLE_DEFAULT_PLUGINS": "1", "OPENCODE_DISABLE_AUTOCOMPACT": "1",
                      "OPENCODE_CONFIG_CONTENT": json.dumps({
                          "$schema": "https://opencode.ai/config.json", "autoupdate": False, "share": "disabled",
                          "model": "agentrl/agentrl", "small_model": "agentrl/agentrl",
                          "provider": {"agentrl": {"npm": "@ai-sdk/openai-compatible", "name": "agentrl",
                                                   "options": {"baseURL": f"{url}/v1", "apiKey": "unused"},
                                                   "models": {"agentrl": {"name": "agentrl"}}}}})}),
    }


def run_cli(name: str, bin_dir: Path, url: str, prompt: str, timeout_s: float,
            flags: list[str] | None = None, more_env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    home = Path(tempfile.mkdtemp(prefix=f"cli-{name}-"))
    work = home / "work"
    work.mkdir()
    (work / "README.md").write_text("A scratch folder.\n")
    (home / ".codex").mkdir()
    argv, extra = cli_runs(bin_dir, url, home, prompt)[name]
    argv = argv[:-1] + list(flags or []) + argv[-1:] if name == "codex" else argv + list(flags or [])
    env = {"PATH": f"{bin_dir}:{os.environ.get('PATH', '')}", "HOME": str(home), "TERM": "dumb",
           "XDG_CONFIG_HOME": str(home / ".config"), "XDG_DATA_HOME": str(home / ".local/share"),
           "XDG_CACHE_HOME": str(home / ".cache"), "XDG_STATE_HOME": str(home / ".local/state"), **extra,
           **(more_env or {})}
    try:
        return subprocess.run(argv, cwd=work, env=env, capture_output=True, text=True, timeout=timeout_s,
                              stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired as exc:  # its output so far comes as bytes
        text = [(b or b"").decode("utf-8", "replace") if isinstance(b, bytes) else (b or "") for b in (exc.stdout, exc.stderr)]
        return subprocess.CompletedProcess(argv, -9, text[0], text[1] + f"\n[timed out after {timeout_s:.0f} s]")
    finally:
        shutil.rmtree(home, ignore_errors=True)


# ------------------------------------------------------------------ the table


def _text(value: Any) -> str:
    """The text a prompt part carries (strings, content blocks, input items), JSON for anything else."""
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        return "".join(_text(v) for v in value)
    if isinstance(value, dict):
        for key in ("text", "content", "input", "output", "arguments"):
            if key in value:
                return _text(value[key]) if not isinstance(value[key], dict) else json.dumps(value[key])
        return ""
    return str(value)


def prompt_parts(body: dict[str, Any]) -> tuple[str, str]:
    """(instructions + conversation text, tool specs as JSON) of a request body."""
    text = _text(body.get("instructions")) + _text(body.get("system")) + _text(body.get("messages")) + \
        _text(body.get("input")) + _text(body.get("prompt"))
    tools = json.dumps(body.get("tools") or [])
    return text, tools


def load_tokenizer(model: str) -> Any:
    if model == "-":
        return None
    from transformers import AutoTokenizer

    if model == "default":  # the embedded default model's tokenizer, trained here in about a second
        from agentrl.config import DefaultModelConfig
        from agentrl.models.default import build_tokenizer

        tok = build_tokenizer(DefaultModelConfig(), Path(tempfile.mkdtemp(prefix="cli-requests-tok-")))
        tok.model_max_length = 1 << 30  # counting only: no "longer than the maximum" warning
        return tok
    if not Path(model).exists():  # a named model (python -m agentrl.models list), prepared in the cache
        from agentrl.models.named import prepare

        model = str(prepare(model))
    return AutoTokenizer.from_pretrained(model, model_max_length=1 << 30)


NOTABLE_FIELDS = ("model", "stream", "max_tokens", "max_output_tokens", "temperature", "tool_choice",
                  "parallel_tool_calls", "thinking", "reasoning", "metadata", "store", "include",
                  "prompt_cache_key", "text", "stream_options", "context_management", "service_tier")


def _short(value: Any, n: int = 60) -> str:
    s = json.dumps(value)
    return s if len(s) <= n else s[:n - 3] + "..."


def summarize(records: list[dict[str, Any]], tokenizer: Any = None) -> str:
    lines = []
    head = f"{'#':>2}  {'method':6} {'path':34} {'prompt chars':>12} {'tool chars':>10} {'tokens':>7} {'tools':>5}  fields"
    lines += [head, "-" * len(head)]
    for i, rec in enumerate(records):
        body = rec["body"] if isinstance(rec["body"], dict) else {}
        text, tools = prompt_parts(body)
        ntools = len(body.get("tools") or [])
        tokens = "-"
        if tokenizer is not None and body:
            tokens = str(len(tokenizer.encode(text + (tools if ntools else ""), add_special_tokens=False)))
        lines.append(f"{i:>2}  {rec['method']:6} {rec['path'][:34]:34} {len(text):>12} "
                     f"{len(tools) if ntools else 0:>10} {tokens:>7} {ntools:>5}  {','.join(sorted(body))}")
    if any("status" in rec for rec in records):
        lines.append("")
        lines.append("answers (status, then the start of the body):")
        for i, rec in enumerate(records):
            answer = " ".join(str(rec.get("answer", "")).split())
            lines.append(f"  #{i}: {rec.get('status', '-')} {answer[:400]}")
    lines.append("")
    lines.append("fields a server may refuse (value per request):")
    for i, rec in enumerate(records):
        body = rec["body"] if isinstance(rec["body"], dict) else {}
        notable = {k: body[k] for k in NOTABLE_FIELDS if k in body}
        cache = json.dumps(body).count('"cache_control"')
        if cache:
            notable["cache_control blocks"] = cache
        if notable:
            lines.append(f"  #{i}: " + "; ".join(f"{k}={_short(v)}" for k, v in notable.items()))
    lines.append("")
    lines.append("headers (beyond the usual):")
    seen: dict[str, str] = {}
    skip = {"host", "content-length", "accept", "accept-encoding", "connection", "content-type"}
    for rec in records:
        for k, v in rec["headers"].items():
            if k.lower() not in skip:
                seen.setdefault(k.lower(), v)
    for k, v in sorted(seen.items()):
        lines.append(f"  {k}: {_short(v, 100)}")
    return "\n".join(lines)


async def scripted_endpoint() -> Any:
    """agentrl's own endpoint (OpenAIServer: every API, the ledger, its refusals) on an engine that answers
    every request with REPLY at once, with no context limit: what a CLI's requests meet apart from the
    model's context length. The embedded default model's tokenizer and chat template, hermes tool calls."""
    from agentrl.config import DefaultModelConfig, ServerConfig
    from agentrl.data.chat import ChatFormat
    from agentrl.models.default import build_tokenizer
    from agentrl.rollout.openai_server import OpenAIServer
    from agentrl.rollout.session import Limits
    from agentrl.rollout.tools import get_tool_format
    from tests.fake_engine import ScriptedEngine

    tok = build_tokenizer(DefaultModelConfig(), Path(tempfile.mkdtemp(prefix="cli-requests-tok-")))
    engine = ScriptedEngine(tok, lambda prompt_ids, index: REPLY)
    server = OpenAIServer(ChatFormat(tok), ServerConfig(port=0), get_tool_format("hermes"),
                          Limits(1 << 24, 1 << 24, 1_000_000), engine=engine)
    await server.start()
    return server


async def ledger_summary(session_url: str) -> str:
    """What the session's ledger (GET /sessions/<id>) recorded: tokens, turns' generated tokens, segments."""
    import aiohttp

    async with aiohttp.ClientSession() as http:
        async with http.get(session_url) as r:
            if r.status != 200:
                return f"ledger: GET {session_url} -> {r.status}"
            book = await r.json()
    segments = book["segments"]
    return (f"ledger: {len(book['tokens'])} tokens ({sum(book['loss_mask'])} generated), "
            f"{len(book['messages'])} messages; {len(segments)} earlier segment(s)"
            + "".join(f"\n  segment {i}: {len(seg['tokens'])} tokens, split because: {seg['reason']}"
                      for i, seg in enumerate(segments)))


async def record_one(name: str, bin_dir: Path, prompt: str, log_path: Path, timeout_s: float,
                     upstream: str | None = None, flags: list[str] | None = None,
                     session: bool = False, more_env: dict[str, str] | None = None,
                     ) -> tuple[subprocess.CompletedProcess, str]:
    scripted = await scripted_endpoint() if upstream == "scripted" else None
    if scripted is not None:
        upstream = scripted.url
    session_url = None
    if session and upstream is not None:
        import aiohttp

        async with aiohttp.ClientSession() as http:
            async with http.post(upstream.rstrip("/") + "/sessions", json={}) as r:
                opened = await r.json()
                if r.status != 200:
                    raise SystemExit(f"cli_requests: POST {upstream}/sessions -> {r.status}: {opened}")
        session_url = f"{upstream.rstrip('/')}/sessions/{opened['id']}"
    runner, port = await start_recorder(log_path, 0, session_url or upstream)
    try:
        proc = await asyncio.to_thread(run_cli, name, bin_dir, f"http://127.0.0.1:{port}", prompt, timeout_s, flags,
                                       more_env)
        return proc, (await ledger_summary(session_url) if session_url else "")
    finally:
        await runner.cleanup()
        if scripted is not None:
            await scripted.stop()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(usage="%(prog)s {codex,claude,opencode,serve} [options] [-- CLI flags]",
                                 description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    ap.add_argument("cli", choices=["codex", "claude", "opencode", "serve"])
    ap.add_argument("--bin", default="/tmp/clis/node_modules/.bin", help="folder holding the CLIs' executables")
    ap.add_argument("--prompt", default=PROMPT)
    ap.add_argument("--model", default="default", help="tokenizer to count prompt tokens with ('-': none)")
    ap.add_argument("--log", default=None, help="JSONL file of the requests (default: a temporary file)")
    ap.add_argument("--port", type=int, default=8799, help="serve: the recorder's port")
    ap.add_argument("--timeout", type=float, default=120.0)
    ap.add_argument("--from-log", action="store_true", help="print the table of --log without running the CLI")
    ap.add_argument("--upstream", default=None, help="forward every request to this server (agentrl.serve's "
                    "http://127.0.0.1:8000) and record its answers; 'scripted': agentrl's endpoint in this process "
                    "on an engine that answers 'Done.' with no context limit (the protocol without the model)")
    ap.add_argument("--session", action="store_true", help="with --upstream: open a session there, send the "
                    "CLI's requests into it, and print what its ledger recorded")
    ap.add_argument("--env", action="append", default=[], metavar="NAME=VALUE", help="another variable for the CLI")
    argv = sys.argv[1:] if argv is None else argv
    flags = argv[argv.index("--") + 1:] if "--" in argv else []  # everything after -- goes to the CLI
    args = ap.parse_args(argv[:argv.index("--")] if "--" in argv else argv)
    args.flags = flags
    log_path = Path(args.log or tempfile.mktemp(prefix="cli-requests-", suffix=".jsonl"))
    if args.cli == "serve":
        print(f"recording to {log_path} on http://127.0.0.1:{args.port}", flush=True)
        web.run_app(recorder_app(log_path), host="127.0.0.1", port=args.port, print=None, access_log=None)
        return 0
    if args.from_log:
        records = [json.loads(line) for line in Path(args.log).read_text().splitlines()]
        print(summarize(records, load_tokenizer(args.model)))
        return 0
    exe = Path(args.bin) / args.cli
    if not exe.exists():
        print(f"cli_requests: {exe} not found. Install the CLIs outside the repo first:\n" +
              __doc__.split("install them outside the repo:\n\n")[1].split("\n\nand pass")[0], file=sys.stderr)
        return 2
    proc, book = asyncio.run(record_one(args.cli, Path(args.bin), args.prompt, log_path, args.timeout, args.upstream,
                                        args.flags, args.session, dict(e.split("=", 1) for e in args.env)))
    records = [json.loads(line) for line in log_path.read_text().splitlines()] if log_path.exists() else []
    print(f"{args.cli}: exit {proc.returncode}; {len(records)} requests (log: {log_path})")
    out = (proc.stdout or "").strip()
    if out:
        print("stdout (last 400 chars):", out[-400:])
    err = (proc.stderr or "").strip()
    if err:
        print("stderr (last 800 chars):", err[-800:])
    if book:
        print(book)
    print()
    print(summarize(records, load_tokenizer(args.model)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
