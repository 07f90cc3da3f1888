"""Engine-core processes forked from a warm fork server instead of spawned cold.

vLLM's CPU platform starts each engine core with `spawn`, so every engine start re-imports torch and
vLLM in a fresh interpreter (about 13 s on a 2-core machine) after this process has already imported
them. `prestart()` starts Python's fork server early with those modules preloaded: it imports them
on the other core while this process does its own start-up (the rest of its imports, the tokenizer,
vLLM's config), and every engine core after that (a restart, a second engine, the next test in the
same process) is a fork of it that starts at once. A 2-step run: 48.2 s -> 36.0 s
(bench/engine_start.py).

What a fork of the server lacks, compared with a spawn, is what changed in this process after the
server started: the environment (vLLM sets the OpenMP settings and its own variables around the
start) and the OpenMP thread count and core binding, which libgomp read when the server imported
torch. `EnvCarryingProcess` carries the environment of the moment of `start()` and applies the thread
count and binding before vLLM's code runs. Used for single-process CPU engines outside Ray actors
(`forked_engine_cores`); everything else starts the way vLLM chooses.
"""

from __future__ import annotations

import atexit
import contextlib
import gc
import multiprocessing
import multiprocessing.context
import multiprocessing.forkserver
import os
import re
import signal
import threading
from typing import Iterator

# What an engine core imports before it serves: vLLM's engine core, its single-process executor and
# CPU worker, and this package's worker extension (which imports the engine module).
PRELOAD = ["vllm.v1.engine.core", "vllm.v1.executor.uniproc_executor", "vllm.v1.worker.cpu_worker",
           "agentrl.rollout.engine"]

_watching = False


def exit_with_parent() -> None:
    """A vLLM general plugin (entry point `vllm.general_plugins` in pyproject.toml), so vLLM runs it in
    its engine-core and worker processes: such a process dies when its parent dies. A driver killed
    with SIGKILL runs no shutdown, and vLLM's engine core would otherwise live on as an orphan holding
    a core (or a GPU) and the run's output pipes. The parent's sentinel becomes ready when the parent
    exits, however it exits. A no-op in a process no multiprocessing parent started (the driver, a
    Ray actor).

    It also freezes the garbage collector's heap at exit (the last exit hook to run, being the first
    registered): an engine-core process exits through the interpreter's full finalization, whose final
    collection scans vLLM's and torch's millions of objects for longer than the 5 s vLLM's shutdown
    waits before it kills the process, so every engine shutdown cost 5 s. ROCm's path in vLLM does the
    same (`gc.freeze()` before a clean exit)."""
    global _watching
    parent = multiprocessing.parent_process()
    if parent is None or _watching:
        return
    _watching = True
    atexit.register(gc.freeze)

    def watch() -> None:
        parent.join()
        os.kill(os.getpid(), signal.SIGKILL)

    threading.Thread(target=watch, name="agentrl-exit-with-parent", daemon=True).start()


_ACCELERATOR_DEVICES = ("/dev/nvidia0", "/dev/kfd", "/dev/accel0")


def prestart() -> bool:
    """Start the fork server now (it imports `PRELOAD` in the background); False where the engines
    will not use it: a machine with an accelerator device, where vLLM starts its engines its own way."""
    if any(os.path.exists(d) for d in _ACCELERATOR_DEVICES):
        return False
    global _stop_at_exit
    multiprocessing.set_forkserver_preload(PRELOAD)
    multiprocessing.forkserver.ensure_running()
    if not _stop_at_exit:
        _stop_at_exit = True
        atexit.register(_stop_server)
    return True


_stop_at_exit = False


def _stop_server() -> None:
    """At exit, the server goes too: one still importing (a command that ended early, on an error)
    would otherwise finish its imports first, holding this command's output pipes open meanwhile."""
    pid = multiprocessing.forkserver._forkserver._forkserver_pid
    if pid is not None:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGTERM)


def prestart_for(backend: str) -> bool:
    """`prestart` where the engines run in this process tree (`cluster.backend: local`). Every CLI that
    starts engines (train, eval, check, serve) calls it as soon as its input is checked: the engine
    core's imports then run on the other core while the command loads the rest, and an input error
    still exits at once, printing only itself."""
    return backend == "local" and prestart()


def _bind_openmp(env: dict[str, str]) -> None:
    """The OpenMP thread count and cores `env` asks for, applied to this fresh fork: torch's thread
    pool does not exist yet, so threads it creates later inherit the binding."""
    import torch

    if "OMP_NUM_THREADS" in env:
        torch.set_num_threads(int(env["OMP_NUM_THREADS"]))
    places = env.get("OMP_PLACES") or env.get("GOMP_CPU_AFFINITY") or ""
    cpus = {int(c) for c in re.findall(r"\d+", places)}
    if cpus:
        os.sched_setaffinity(0, cpus)


class EnvCarryingProcess(multiprocessing.context.ForkServerProcess):
    """A fork-server process that runs with the environment its parent had when it called `start()`."""

    def start(self) -> None:
        self._agentrl_env = dict(os.environ)  # pickled with the process object
        super().start()

    def run(self) -> None:
        # vLLM names the process (`VLLM::EngineCore`) with setproctitle, which finds the room for the
        # title only while the C environment is where the interpreter started it: set up before
        # the environment below moves it.
        with contextlib.suppress(ImportError):
            import setproctitle

            setproctitle.getproctitle()
        os.environ.clear()
        os.environ.update(self._agentrl_env)
        _bind_openmp(self._agentrl_env)
        exit_with_parent()  # vLLM's plugin loader may have run in the server, where it does nothing
        super().run()


class _Context(multiprocessing.context.ForkServerContext):
    Process = EnvCarryingProcess


_CONTEXT = _Context()


@contextlib.contextmanager
def forked_engine_cores() -> Iterator[None]:
    """Within: the engine cores vLLM starts are forks of the warm server (which vLLM's first start
    starts, where no `prestart` did: in a test process, the engines after the first start at once)."""
    import vllm.v1.engine.utils as engine_utils

    multiprocessing.set_forkserver_preload(PRELOAD)  # a no-op once the server runs
    original = engine_utils.get_mp_context
    engine_utils.get_mp_context = lambda: _CONTEXT
    try:
        yield
    finally:
        engine_utils.get_mp_context = original
