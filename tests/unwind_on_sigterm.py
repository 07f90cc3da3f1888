"""A pytest plugin (loaded by conftest.py): SIGTERM unwinds a test run the way Ctrl-C does, so the engines,
training runs and servers its fixtures and tests started are stopped by their `finally` blocks and teardowns
instead of being left running, holding cores and ports, after the run is gone.

Two defaults leave them otherwise: SIGTERM kills Python outright (no `finally` runs), and pytest-xdist does
not pass a signal to its workers (the controller tears them down with SIGKILL after a timeout, and their
children live on, re-parented to init). So the controller forwards SIGTERM to its children, the workers,
and every process then raises KeyboardInterrupt from it, which pytest treats as an interruption: the
current test stops, fixtures tear down, `subprocess.run` kills its child. A worker still starting up when
the signal comes dies of it as before; it has started nothing yet.

An in-process training run installs its own SIGTERM handler on its event loop and, when that loop closes,
asyncio resets SIGTERM to the default action; the handler is therefore put back around every test.
"""

from __future__ import annotations

import os
import signal
import threading
from pathlib import Path
from types import FrameType

import pytest


def children() -> list[int]:
    """This process's child pids (Linux /proc; none elsewhere)."""
    pids: list[int] = []
    for listing in Path("/proc/self/task").glob("*/children"):
        try:
            pids += [int(pid) for pid in listing.read_text().split()]
        except OSError:  # the thread ended while we looked
            continue
    return pids


def _interrupt(signum: int, frame: FrameType | None) -> None:
    if not os.environ.get("PYTEST_XDIST_WORKER"):  # the controller (or a run without workers)
        for pid in children():
            try:
                os.kill(pid, signum)
            except ProcessLookupError:
                pass
    raise KeyboardInterrupt(f"signal {signal.Signals(signum).name}: the test run was asked to stop")


def install() -> None:
    """SIGTERM -> KeyboardInterrupt in this process (the main thread only: where Python handles signals)."""
    if threading.current_thread() is threading.main_thread() and signal.getsignal(signal.SIGTERM) is not _interrupt:
        signal.signal(signal.SIGTERM, _interrupt)


def pytest_configure(config: pytest.Config) -> None:
    install()


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    install()


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_teardown(item: pytest.Item) -> None:
    install()
