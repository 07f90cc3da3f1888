"""Chaos: a fault table. A short job is hit by one fault per row, resumed with `train.resume=auto` until
it finishes, and then accounted for task position by task position (`agentrl.run.checkpoint.audit`).

    python bench/chaos_resume.py [--trials 1] [--seed 0] [--model default] [--only SUBSTRING ...]
                                 [--lock /tmp/agentrl-heavy.lock] [--keep DIR]

Rows (each trial a fresh out_dir; a faulted run, then resumes until one exits 0, at most 3):

    kill -9 at <point>     AGENTRL_CRASH_AT=<point>:<n> (agentrl.utils.faults), a real SIGKILL: startup,
                           generation, learner_step, weight_push, checkpoint_write; n drawn per trial
    SIGTERM at <point>     the same points with :TERM: the run stops at its next safe point with a
                           checkpoint and exits 143
    engine process killed  SIGKILL to the vLLM engine-core process once two steps are recorded
    tool server killed     the calculator job's tool server (rewards.servers.tools) killed after two
                           steps and started again 5 s later
    verifier failing 60 %  every reward from rewards.servers.verifier --fail-rate 0.6 (with retries)
    disk full at a checkpoint  AGENTRL_FAIL_AT=checkpoint_io:2: the second checkpoint write gets ENOSPC
                           half-way (the run logs it and goes on; the next checkpoint is written)
    stranger on the rendezvous port  every TCP port the run's processes listen on gets garbage from a
                           stranger's connection, again and again while the run pushes weights

`bench/_everyday.py` adds the rows of a command typed again (the same command twice, three times,
resume=auto after each, a stage pointed at its own input), counted as runs whose files are all still
there. `bench/_node_faults.py`, when present, adds its rows (`node_fault_rows(trials)`).

Columns: trials; runs that ended by themselves (every process of the trial exited without the
harness killing it for hanging, and the last one with 0); the faulted run's exit status; episodes
lost (task positions below the final checkpoint's cursor that were neither trained, nor dropped and
counted, nor waiting; times the group size) and duplicated; steps missing from or repeated in
metrics.jsonl. Goal: 0 lost, 0 duplicated, every run ends by itself.
"""

from __future__ import annotations

import argparse
import contextlib
import fcntl
import json
import os
import random
import socket
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from agentrl.learner.dist import free_port
from bench._common import MODEL_HELP, ROOT, progress, resolve_model, serve

STEPS, EVERY, GROUP = 6, 2, 4
RUN_TIMEOUT_S = 420
POINTS = ("startup", "generation", "learner_step", "weight_push", "checkpoint_write")


def job(model: str, out: Path, config: str = "examples/agents/arithmetic.yaml") -> list[str]:
    return [sys.executable, "-m", "agentrl.train", "--config", config, f"model.path={model}", f"train.out_dir={out}",
            "train.resume=auto", f"train.steps={STEPS}", f"train.checkpoint_every={EVERY}", "train.checkpoint_keep=0",
            "train.eval_before=false", "train.eval_after=false", "train.save_model=false", "buffer.batch_size=16",
            f"rollout.n_samples={GROUP}", "buffer.max_staleness=1", "data.eval_tasks=8"]


@dataclass
class Trial:
    by_itself: bool
    first_rc: int | None
    lost: int = 0  # episodes
    duplicated: int = 0
    steps_missing: int = 0
    steps_repeated: int = 0
    note: str = ""


@dataclass
class Fault:
    """One row: how to run the faulted job (`extra` overrides, `env`, a `during` action on its process)."""

    name: str
    env: Callable[[random.Random], dict[str, str]] = lambda rng: {}
    extra: list[str] = field(default_factory=list)
    during: Callable[[subprocess.Popen, Path], None] | None = None
    config: str = "examples/agents/arithmetic.yaml"
    server: Callable[[], contextlib.AbstractContextManager] | None = None


def launch(cmd: list[str], env: dict[str, str], log: Path, out: Path,
           during: Callable[[subprocess.Popen, Path], None] | None) -> tuple[int | None, bool]:
    """(exit status, ended by itself): None and False when it hung past RUN_TIMEOUT_S and was killed."""
    with log.open("a") as f:
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=f, stderr=subprocess.STDOUT)
        if during is not None:
            threading.Thread(target=during, args=(proc, out), daemon=True).start()
        try:
            return proc.wait(timeout=RUN_TIMEOUT_S), True
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            return None, False


def records(out: Path) -> list[dict]:
    path = out / "metrics.jsonl"
    if not path.exists():
        return []
    rows = []
    for line in path.read_text().splitlines():
        with contextlib.suppress(ValueError):
            rows.append(json.loads(line))
    return rows


def wait_steps(proc: subprocess.Popen, out: Path, n: int) -> bool:
    while proc.poll() is None:
        if len(records(out)) >= n:
            return True
        time.sleep(0.5)
    return False


def account(out: Path) -> Trial:
    from agentrl.run.checkpoint import audit

    trial = Trial(True, None)
    try:
        report = audit(out)
    except Exception as exc:  # no checkpoint at all: everything trained is unaccounted
        trial.note = f"no audit: {exc}"
        trial.lost = sum(len(r.get("tasks/trained", [])) for r in records(out)) * GROUP
        return trial
    steps = [r["step"] for r in records(out)]
    trial.lost, trial.duplicated = len(report["skipped"]) * GROUP, len(report["duplicated"]) * GROUP
    trial.steps_missing = len(set(range(STEPS)) - set(steps))
    trial.steps_repeated = len(steps) - len(set(steps))
    return trial


def run_trial(fault: Fault, model: str, base: Path, rng: random.Random) -> Trial:
    out = base / "out"
    log = base / "log.txt"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "CI": "true"}
    for var in ("AGENTRL_CRASH_AT", "AGENTRL_FAIL_AT"):
        env.pop(var, None)
    with (fault.server() if fault.server else contextlib.nullcontext()) as server_extra:
        cmd = job(model, out, fault.config) + fault.extra + list(server_extra or [])
        first, alone = launch(cmd, {**env, **fault.env(rng)}, log, out, fault.during)
        rc, runs = first, 1
        while alone and rc != 0 and runs < 4:
            rc, alone = launch(cmd, env, log, out, None)
            runs += 1
    trial = account(out)
    trial.first_rc, trial.by_itself = first, alone and rc == 0
    if not trial.by_itself:
        trial.note = (trial.note + f" last exit {rc}; log {log}").strip()
    return trial


# -- the faults ----------------------------------------------------------------------------------------

def _visit(point: str, rng: random.Random) -> int:
    return {"startup": 1, "generation": rng.randint(1, STEPS * 16 // 2), "learner_step": rng.randint(2, STEPS - 1),
            "weight_push": rng.randint(2, STEPS - 1), "checkpoint_write": rng.randint(1, STEPS // EVERY - 1)}[point]


def _descendants(pid: int):
    import psutil

    with contextlib.suppress(psutil.Error):
        root = psutil.Process(pid)
        return [root, *root.children(recursive=True)]
    return []


def kill_engine(proc: subprocess.Popen, out: Path) -> None:
    if not wait_steps(proc, out, 2):
        return
    for p in _descendants(proc.pid):
        with contextlib.suppress(Exception):
            if "EngineCore" in p.name() or any("EngineCore" in part for part in p.cmdline()):
                p.kill()
                return


def stranger(proc: subprocess.Popen, out: Path) -> None:
    """Connect to every port the run listens on and write garbage, until it exits."""
    if not wait_steps(proc, out, 1):
        return
    junk = random.Random(0).randbytes(4096)
    while proc.poll() is None:
        ports = set()
        for p in _descendants(proc.pid):
            with contextlib.suppress(Exception):
                ports |= {c.laddr.port for c in p.net_connections(kind="tcp") if c.status == "LISTEN"}
        for port in ports:
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1) as s:
                s.sendall(junk)
        time.sleep(0.5)


class ToolServer:
    """The calculator job's tool server, killed mid-run and started again."""

    def __init__(self) -> None:
        self.port = free_port()

    @contextlib.contextmanager
    def __call__(self):
        self.stack = contextlib.ExitStack()
        with self.stack:
            self.stack.enter_context(serve("rewards.servers.tools", self.port))
            yield [f"tools.servers.calculator.url=http://127.0.0.1:{self.port}"]

    def kill_and_restart(self, proc: subprocess.Popen, out: Path) -> None:
        if not wait_steps(proc, out, 2):
            return
        self.stack.close()  # kills it
        time.sleep(5)
        self.stack.enter_context(serve("rewards.servers.tools", self.port))


@contextlib.contextmanager
def flaky_verifier():
    port = free_port()
    with serve("rewards.servers.verifier", port, "--fail-rate", "0.6"):
        yield [f"rewards.sources=[{{name: verifier, type: http, http: {{url: 'http://127.0.0.1:{port}/verify', "
               f"max_retries: 6, backoff_base_s: 0.05}}}}]"]


def faults() -> list[Fault]:
    rows = [Fault(f"kill -9 at {p}", env=lambda rng, p=p: {"AGENTRL_CRASH_AT": f"{p}:{_visit(p, rng)}"})
            for p in POINTS]
    rows += [Fault(f"SIGTERM at {p}", env=lambda rng, p=p: {"AGENTRL_CRASH_AT": f"{p}:{_visit(p, rng)}:TERM"})
             for p in POINTS]
    tools = ToolServer()
    rows += [Fault("engine process killed", during=kill_engine),
             Fault("tool server killed", during=tools.kill_and_restart, config="examples/agents/calculator.yaml",
                   server=tools),
             Fault("verifier failing 60 %", server=flaky_verifier),
             Fault("disk full at a checkpoint", env=lambda rng: {"AGENTRL_FAIL_AT": "checkpoint_io:2"}),
             Fault("stranger on the rendezvous port", during=stranger)]
    return rows


def row(name: str, trials: list[Trial]) -> dict:
    return {"fault": name, "trials": len(trials), "ended by itself": sum(t.by_itself for t in trials),
            "first exit": ",".join(str(t.first_rc) for t in trials),
            "episodes lost": sum(t.lost for t in trials), "episodes duplicated": sum(t.duplicated for t in trials),
            "steps lost": sum(t.steps_missing for t in trials), "steps duplicated": sum(t.steps_repeated for t in trials),
            "note": "; ".join(t.note for t in trials if t.note)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="default", help=MODEL_HELP)
    ap.add_argument("--trials", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--only", nargs="*", default=[], help="run only the rows whose name contains one of these")
    ap.add_argument("--lock", help="hold this file's lock (flock) during each trial, as the test suite's heavy jobs do")
    ap.add_argument("--keep", help="keep every trial's folder here instead of a temporary folder")
    args = ap.parse_args()
    model, rng = resolve_model(args.model), random.Random(args.seed)
    chosen = [f for f in faults() if not args.only or any(s in f.name for s in args.only)]
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(args.keep or tmp)
        for i, fault in enumerate(chosen):
            trials = []
            for t in range(args.trials):
                folder = base / f"{i:02d}-{t}"
                folder.mkdir(parents=True, exist_ok=True)
                progress(f"{fault.name}: trial {t + 1}/{args.trials}")
                with _locked(args.lock):
                    trials.append(run_trial(fault, model, folder, rng))
            rows.append(row(fault.name, trials))
            progress(markdown(rows[-1:]).splitlines()[-1])  # each row as it is done
    from bench._everyday import everyday_rows  # a command typed again: nothing of any run lost

    with _locked(args.lock):
        rows += everyday_rows(args.trials, args.model, job, STEPS, EVERY, only=tuple(args.only))
    with contextlib.suppress(ImportError):
        from bench._node_faults import node_fault_rows  # another helper's rows (several nodes)

        with _locked(args.lock):
            rows += node_fault_rows(args.trials, args.model, seed=args.seed, only=tuple(args.only))
    print(markdown(rows))


@contextlib.contextmanager
def _locked(path: str | None):
    if path is None:
        yield
        return
    with open(path, "a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def markdown(rows: list[dict]) -> str:
    heads = ["fault", "trials", "ended by itself", "first exit", "episodes lost", "episodes duplicated", "steps lost",
             "steps duplicated", "note"]
    for r in rows:  # columns of other rows' own (bench/_node_faults.py) after these
        heads += [k for k in r if k not in heads]
    lines = ["| " + " | ".join(heads) + " |", "|" + "|".join("---" for _ in heads) + "|"]
    lines += ["| " + " | ".join(str(r.get(h, "")) for h in heads) + " |" for r in rows]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
