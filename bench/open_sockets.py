"""Listening sockets of a default run: what `python -m agentrl.train` leaves open, and where.

    python bench/open_sockets.py [--steps 2] [--config examples/agents/guess_number.yaml] [-- key=value ...]

Starts the README's default command (the guess-the-number config: local backend, one engine, the
collective weight push) for a few steps in a scratch out_dir, and every second lists every listening
TCP socket of the run's process tree (the command and all its descendants: the engine core, the fork
server, the receivers' gloo listeners) with its address. Prints each second's list when it changes,
then every socket seen and the count of those on a non-loopback address (goal: 0; the wildcard
0.0.0.0 / :: counts as non-loopback).
"""

from __future__ import annotations

import argparse
import contextlib
import ipaddress
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

from _common import ROOT


def listening(root: psutil.Process) -> set[tuple[str, str, int]]:
    """(process, address, port) of each listening TCP socket of `root` and its descendants; the process
    as name/pid."""
    seen = set()
    try:
        procs = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return seen
    for p in procs:
        try:
            name = f"{p.name()}/{p.pid}"
            seen |= {(name, c.laddr.ip, c.laddr.port) for c in p.net_connections("inet")
                     if c.status == psutil.CONN_LISTEN}
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            pass
    return seen


def is_loopback(address: str) -> bool:
    return ipaddress.ip_address(address.split("%")[0]).is_loopback


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default="examples/agents/guess_number.yaml")
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--max-s", type=float, default=300.0, help="stop the run (its whole process tree) after this")
    ap.add_argument("overrides", nargs="*", help="more key=value settings")
    args = ap.parse_args()
    out = tempfile.mkdtemp(prefix="agentrl-open-sockets-")
    cmd = [sys.executable, "-m", "agentrl.train", "--config", args.config, f"train.steps={args.steps}",
           "data.eval_tasks=8", "train.eval_every=0", f"train.out_dir={out}", *args.overrides]
    print("$", " ".join(cmd[1:]), flush=True)
    t0 = time.monotonic()
    log = Path(out) / "run.log"  # a file, not a pipe: a pipe nobody reads fills up and stalls the run
    run = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=log.open("w"))
    root, everything, last = psutil.Process(run.pid), set(), None
    try:
        while run.poll() is None and time.monotonic() - t0 < args.max_s:
            now = listening(root)
            everything |= now
            if now != last:
                shown = ", ".join(f"{n}:{a}:{p}" for n, a, p in sorted(now)) or "(none)"
                print(f"t={time.monotonic() - t0:5.0f}s listening: {shown}", flush=True)
                last = now
            time.sleep(1.0)
    finally:
        stopped = run.poll() is None
        if stopped:
            for p in [*root.children(recursive=True), root]:
                with contextlib.suppress(psutil.NoSuchProcess):
                    p.kill()
        run.wait()
    err = log.read_text(errors="replace")
    ended = f"stopped at --max-s {args.max_s:.0f}" if stopped else f"exited {run.returncode}"
    print(f"run {ended} after {time.monotonic() - t0:.0f}s")
    if run.returncode and not stopped:
        print(err[-3000:])
    for line in err.splitlines():  # how the weights went (the collective group, or files after a failure)
        if "weight" in line.lower() and "transport" in line.lower():
            print("run's log:", line.strip()[:300])
    print("every listening socket seen (process, address, port):")
    for n, a, p in sorted(everything):
        print(f"  {n:28s} {a:>15s}:{p:<6d} {'loopback' if is_loopback(a) else 'NON-LOOPBACK'}")
    beyond = [s for s in everything if not is_loopback(s[1])]
    print(f"listening sockets of the run: {len(everything)}; on a non-loopback address: {len(beyond)}")


if __name__ == "__main__":
    main()
