"""Helpers shared by the benchmarks: model names, a uvloop runner, logged subprocesses, progress lines and
plain-text tables."""

from __future__ import annotations

import asyncio
import contextlib
import os
import platform
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Awaitable, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as `python bench/x.py` from anywhere
    sys.path.insert(0, str(ROOT))

_T0 = time.perf_counter()


def listening(port: int) -> bool:
    with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
        return True
    return False


@contextlib.contextmanager
def serve(module: str, port: int, *args: str, env: dict[str, str] | None = None, timeout_s: float = 60.0):
    """`python -m module --port port *args` on loopback for the block, once it listens; yields the process.
    A port already answering is refused (another process's server, an orphan of a killed bench, would pass the
    wait and the benchmark would silently run against it), and a server that exits before listening raises."""
    if listening(port):
        raise RuntimeError(f"127.0.0.1:{port} is taken by another process; stop it before running {module}")
    env = {"PYTHONPATH": str(ROOT), **(os.environ if env is None else env)}
    proc = subprocess.Popen([sys.executable, "-m", module, "--port", str(port), *args], cwd=ROOT, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + timeout_s
        while not listening(port):
            if proc.poll() is not None:
                raise RuntimeError(f"{module} exited with status {proc.returncode} before listening on {port}")
            if time.monotonic() > deadline:
                raise RuntimeError(f"nothing listens on 127.0.0.1:{port} after {timeout_s:.0f}s")
            time.sleep(0.2)
        yield proc
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


MODEL_HELP = ("default (the embedded model), default:KEY=VALUE,... (the embedded model built with those "
              "model.default settings, e.g. default:hidden_size=256,num_layers=4), a prepared name or a Hugging "
              "Face folder")


def resolve_model(name: str) -> str:
    """'default' -> the embedded default model's folder; 'default:KEY=VALUE,...' -> the embedded default
    model built with those `model.default` settings (`default:hidden_size=256,num_layers=4`: built on first
    use, then cached under its own key); a prepared name (smollm2-135m-instruct) -> its folder; anything
    else is taken as a Hugging Face folder."""
    from agentrl.config import DefaultModelConfig
    from agentrl.models.named import resolve_path

    if name == "default" or name.startswith("default:"):
        return resolve_path(None, default_model_config(name.partition(":")[2]))
    return resolve_path(name, DefaultModelConfig())


def default_model_config(settings: str) -> Any:
    """The `model.default` section `KEY=VALUE,...` gives, validated by the config tree (a misspelt key is
    an error naming the nearest valid one)."""
    from agentrl.config.load import load_config

    pairs = [s.strip() for s in settings.split(",") if s.strip()]
    bad = [s for s in pairs if "=" not in s]
    if bad:
        raise SystemExit(f"--model default:{settings}: {bad[0]!r} is not KEY=VALUE")
    return load_config(None, [f"model.default.{s}" for s in pairs]).model.default


def add_overrides(ap: Any, who: str = "every agentrl.train run") -> None:
    """The positional dotted overrides (`learner.lr=1e-3`) the run-launching benchmarks pass on."""
    ap.add_argument("overrides", nargs="*", help=f"dotted overrides for {who}, e.g. learner.lr=1e-3")


def progress(msg: str) -> None:
    """A timestamped progress line on stderr (the tables go to stdout)."""
    print(f"[{time.perf_counter() - _T0:6.1f}s] {msg}", file=sys.stderr, flush=True)


def run_uvloop(coro: Awaitable[Any]) -> Any:
    """Run on uvloop, the loop train.py uses, so event-loop costs are the ones training pays."""
    import uvloop

    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        return runner.run(coro)


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]], title: str = "") -> str:
    """A left-aligned first column, right-aligned others; floats keep the caller's formatting."""
    cells = [[str(h) for h in headers]] + [[str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]

    def line(r: list[str]) -> str:
        return "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths)))

    out = [title] if title else []
    out += [line(cells[0]), "  ".join("-" * w for w in widths)] + [line(r) for r in cells[1:]]
    return "\n".join(out)


def host_line() -> str:
    """One line naming the CPU, its usable cores and its wide vector units. Printed first by every benchmark:
    the same run moves with them (the 16-turn warm start evaluates 0.743 on one 2-core host and 0.753 on
    one with AVX-512 and AMX, docs/benchmarks.md), so a table says where it was measured."""
    model, flags = platform.processor() or platform.machine(), set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name":
                model = value.strip()
            elif key.strip() == "flags":
                flags = set(value.split())
    except OSError:  # not Linux: the model from platform, no flags
        pass
    wide = [name for name, flag in (("AVX2", "avx2"), ("AVX-512", "avx512f"), ("AVX512-BF16", "avx512_bf16"),
                                    ("AMX", "amx_tile")) if flag in flags]
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return f"host: {model}, {usable} usable cores of {os.cpu_count()}, {' '.join(wide) or 'no AVX2/AVX-512/AMX'}"


def print_host(argv: Sequence[str] | None = None) -> None:
    """Print `host_line` first, unless the command only asks for its --help."""
    if not {"-h", "--help"} & set(sys.argv[1:] if argv is None else argv):
        print(host_line(), flush=True)


def median(xs: Sequence[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def run_logged(cmd: list[str], log: Path, env: dict[str, str] | None = None) -> None:
    """Run `cmd` from the repository root with its output in `log`; RuntimeError with the log's tail if it fails."""
    with log.open("w") as f:
        proc = subprocess.run(cmd, cwd=ROOT, env=env, stdout=f, stderr=subprocess.STDOUT)
    if proc.returncode != 0:
        raise RuntimeError(f"exit {proc.returncode}: {' '.join(cmd)}\n{log.read_text()[-3000:]}")
