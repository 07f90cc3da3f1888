"""SIGTERM and SIGINT (a scheduler's pre-emption, Ctrl-C) as a request to stop at the run's next safe
point, with a checkpoint.

The handlers are on the run's event loop from the moment its engines and learner are up (a signal
before that has its default effect: nothing is trained yet). The first signal sets the `StopRequest`. The run (agentrl.run.rl_run) stops waiting for a batch, or lets the
learner step in progress finish (with its weight push, whose deadline bounds it), writes a checkpoint
of the steps trained so far (also when `train.checkpoint_every` is 0: pre-emption is exactly what a
checkpoint is for), and exits with status 128 + the signal's number (143 for SIGTERM, 130 for
SIGINT), as a shell reports a process ended by that signal: a scheduler sees a run that did not
finish, and `train.resume=auto` continues it with no step missing or repeated. How long that takes
is bounded by one learner step, one weight push and one checkpoint write. A second signal exits at
once (status 128 + its number, no checkpoint; the engine processes follow their parent,
`agentrl.rollout.core_process.exit_with_parent`).

`RunStopped` is a SystemExit so that it passes every `except Exception` on its way out, through the
run's clean-up (engines, servers, trackers) and the asyncio runner, to the process's exit status,
without a traceback.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal

log = logging.getLogger("agentrl")

SIGNALS = (signal.SIGTERM, signal.SIGINT)


class RunStopped(SystemExit):
    """The run stopped on a signal, after its checkpoint; the exit status is 128 + the signal's number."""

    def __init__(self, signum: int) -> None:
        super().__init__(128 + signum)
        self.signum = signum


class StopRequest:
    """Set by the first SIGTERM/SIGINT once `install`ed on the running loop; the run polls `requested`
    at its safe points and awaits `wait()` beside its waits."""

    def __init__(self) -> None:
        self.signum: int | None = None
        self._event: asyncio.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    @property
    def requested(self) -> bool:
        return self.signum is not None

    @property
    def name(self) -> str:
        return signal.Signals(self.signum).name if self.signum is not None else ""

    def install(self) -> None:
        """Handle SIGTERM and SIGINT on the running loop (only the main thread can; elsewhere, e.g. a
        run driven from a test's thread, the signals keep their default action)."""
        loop = asyncio.get_running_loop()
        self._event = asyncio.Event()
        try:
            for sig in SIGNALS:
                loop.add_signal_handler(sig, self._on_signal, sig)
        except (ValueError, RuntimeError, NotImplementedError) as exc:
            log.debug("SIGTERM/SIGINT not handled (%s): a signal ends the run without a checkpoint", exc)
            return
        self._loop = loop

    def uninstall(self) -> None:
        if self._loop is not None and not self._loop.is_closed():
            for sig in SIGNALS:
                self._loop.remove_signal_handler(sig)
        self._loop = None

    def _on_signal(self, sig: int) -> None:
        name = signal.Signals(sig).name
        if self.signum is not None:
            log.error("second signal (%s) while stopping on %s: exiting now, without a checkpoint", name, self.name)
            logging.shutdown()
            os._exit(128 + sig)
        self.signum = sig
        log.warning("%s received: stopping at the next safe point (after the learner step in progress) with a "
                    "checkpoint; a second signal exits at once without one", name)
        if self._event is not None:
            self._event.set()

    async def wait(self) -> None:
        if self._event is None:
            await asyncio.Event().wait()  # never set: not installed
        await self._event.wait()
