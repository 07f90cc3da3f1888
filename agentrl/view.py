"""`python -m agentrl.view RUN_DIR [RUN_B] [--port N] [--host 127.0.0.1]`: a run in the browser, offline.

Serves a page over a run folder (finished or still running: new steps appear as the run writes them):
its curves, config and summary; its episodes (`train.save_rollouts`, a sample of each step's groups by
default), filtered and searched; one episode turn by turn with every generated token coloured by its
behaviour log-prob, policy version, staleness or loss mask; and the held-out tasks answered at the first
and the last eval, side by side. Binds 127.0.0.1 unless `--host` says otherwise; nothing is fetched from
the network (every script and style ships in the package). A group's samples side by side, with the
advantages the learner gave them. Two folders: run against run, their curves overlaid, the config keys
that differ, the held-out tasks as both runs answered them.
"""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
from pathlib import Path

from agentrl.telemetry.viewer import Viewer
from agentrl.utils.process_exit import run_and_exit
from agentrl.utils.prog import prog


async def serve(run_dirs: list[Path], host: str, port: int) -> None:
    viewer = Viewer(*run_dirs)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    try:
        url = await viewer.start(host, port)
        print(f"viewing {' against '.join(map(str, run_dirs))} at {url}/ (Ctrl-C stops)", flush=True)
        await stop.wait()
    finally:
        await viewer.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=prog("view"), description=__doc__.splitlines()[0])
    parser.add_argument("run_dir", nargs="+", help="a run's train.out_dir (metrics.jsonl, rollouts.jsonl, summary.json); "
                        "two: run against run")
    parser.add_argument("--port", type=int, default=8500, help="TCP port (default 8500; 0 = any free port)")
    parser.add_argument("--host", default="127.0.0.1", help="bind address (default 127.0.0.1)")
    args = parser.parse_args(argv)
    run_dirs = [Path(d) for d in args.run_dir]
    if len(run_dirs) > 2:
        print(f"view: {len(run_dirs)} run folders: give one, or two to set them against each other", file=sys.stderr)
        return 2
    for run_dir in run_dirs:
        if not (run_dir / "metrics.jsonl").is_file():
            print(f"view: {run_dir} has no metrics.jsonl: give the train.out_dir of a run (one that has made a "
                  "step)", file=sys.stderr)
            return 2
    from agentrl.telemetry.metrics import setup_logging

    setup_logging()
    try:
        asyncio.run(serve(run_dirs, args.host, args.port))
    except OSError as exc:  # the port is taken, the host is not ours
        print(f"view failed: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    run_and_exit(main)
