"""`python -m agentrl.serve --model DIR [--port P]`: the OpenAI-compatible endpoint standing alone.

For evaluating or debugging an agent against a trained model (a run's `<out_dir>/model`, a Hugging
Face folder, a named model, or `default` for the embedded one) with the same server, tool parser and
token ledger training uses:

    python -m agentrl.serve --model runs/calculator/model --port 8000
    client = openai.AsyncOpenAI(base_url="http://127.0.0.1:8000/v1", api_key="unused")

`POST /sessions` opens a session whose ledger `GET /sessions/<id>` shows (tokens, loss mask, behaviour
logprobs, segments and why each split). Binds 127.0.0.1 unless `--host` says otherwise;
`--api-key-env NAME` / `--api-key-file PATH` (or `server.api_key: env:NAME | file:PATH`) make every
request carry `Authorization: Bearer <key>`. The key itself is never taken from the command line, which
every user of the machine reads in `ps`: `--api-key KEY` is refused. Without a key a non-loopback `--host`
is warned about (anyone who reaches the port generates with the model). A request whose Host is not a name
of the bound address (`--allow-host NAME` adds one), or from a web page (Origin), is a 403, a POST that is
not JSON a 415. Any config key applies as a dotted
override, e.g. `engine.max_model_len=2048 rollout.tool_format=hermes`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import signal
import sys

from agentrl.config import ConfigError, load_config
from agentrl.rollout.core_process import prestart_for
from agentrl.run.startup import check_model, input_error, load_model_format
from agentrl.utils.process_exit import run_and_exit
from agentrl.utils.prog import prog

log = logging.getLogger("agentrl")

API_KEY_ON_ARGV = ("config error: --api-key puts the key on the command line, where every user of this machine "
                   "reads it (ps); use --api-key-env NAME (an environment variable holding the key) or "
                   "--api-key-file PATH (a file holding it), or server.api_key: env:NAME in the config file")


async def serve(cfg, ready: asyncio.Event | None = None, stop: asyncio.Event | None = None) -> None:
    """Serve until `stop` is set (or SIGINT / SIGTERM)."""
    from agentrl.rollout.fleet import EngineFleet
    from agentrl.rollout.openai_server import OpenAIServer
    from agentrl.rollout.session import Limits
    from agentrl.rollout.tools import get_tool_format

    model_path, _, fmt = await load_model_format(cfg)
    log.info("model %s: starting vLLM", model_path)
    fleet = EngineFleet.local(model_path, cfg.engine, fmt.eos_id, cfg.cluster)
    server = None
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        await fleet.start()
        # Requests choose their own sampling here; the per-request cap is the whole context.
        limits = Limits(cfg.engine.max_model_len, cfg.engine.max_model_len, 1_000_000)
        server = OpenAIServer(fmt, cfg.server, get_tool_format(cfg.rollout.tool_format), limits, engine=fleet)
        await server.start()
        print(f"serving {model_path} as {cfg.server.model_name!r} at {server.url}/v1", flush=True)
        if ready is not None:
            ready.set()
        await stop.wait()
    finally:
        if server is not None:
            await server.stop()
        await fleet.shutdown()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=prog("serve"), description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="model folder, named model, or 'default' (the embedded one)")
    parser.add_argument("--port", type=int, help="TCP port (default: server.port; 0 = any free port)")
    parser.add_argument("--host", help="bind address (default 127.0.0.1)")
    parser.add_argument("--api-key-env", metavar="NAME", help="environment variable holding the bearer token "
                                                               "every request must carry")
    parser.add_argument("--api-key-file", metavar="PATH", help="file holding the bearer token (e.g. chmod 600)")
    parser.add_argument("--allow-host", action="append", default=[], metavar="NAME",
                        help="a Host name to answer besides the bound address's own (repeatable)")
    parser.add_argument("--api-key", help=argparse.SUPPRESS)  # refused with what to use instead
    parser.add_argument("--config", help="YAML config file (engine, server, rollout.tool_format, model.default)")
    parser.add_argument("overrides", nargs="*", help="dotted.key=value overrides, e.g. engine.max_model_len=2048")
    args = parser.parse_intermixed_args(argv)
    if args.api_key is not None:
        print(API_KEY_ON_ARGV, file=sys.stderr)
        return 2
    if args.api_key_env is not None and args.api_key_file is not None:
        parser.error("give --api-key-env or --api-key-file, not both")
    from agentrl.telemetry.metrics import setup_logging

    setup_logging()
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    key = (f"env:{args.api_key_env}" if args.api_key_env is not None else
           f"file:{args.api_key_file}" if args.api_key_file is not None else None)
    key = key and "'" + key.replace("'", "''") + "'"  # YAML-quoted: a path may hold ': ' or '#'
    flags = {"server.port": args.port, "server.host": args.host, "server.api_key": key,
             "server.allow_hosts": json.dumps(args.allow_host) if args.allow_host else None}
    overrides = [f"{k}={v}" for k, v in flags.items() if v is not None] + list(args.overrides)
    try:
        cfg = load_config(args.config, overrides)
        cfg.model.path = None if args.model == "default" else args.model
        check_model(cfg.model)
    except ConfigError as exc:
        return input_error(exc)
    prestart_for(cfg.cluster.backend)
    import uvloop

    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        try:
            runner.run(serve(cfg))
        except ConfigError as exc:  # the model folder's chat template
            return input_error(exc)
        except OSError as exc:  # the port is taken, the host is not ours
            print(f"serve failed: {exc}", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    run_and_exit(main)
