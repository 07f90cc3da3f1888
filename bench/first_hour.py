"""A newcomer's first hour, timed from a clean clone: the README's install, the main job (split into its
phases), and the first-Env tutorial's commands.

    python bench/first_hour.py                          # HEAD: install, main job, tutorial
    python bench/first_hour.py --revs 369e4ca,HEAD      # before and after, one after the other
    python bench/first_hour.py --revs HEAD --skip tutorial --keep /tmp/fh   # keep the clones

Each revision is `git clone`d from this repository into a fresh folder and checked out there, with an
empty pip cache (PIP_CACHE_DIR, UV_CACHE_DIR) and an empty model cache (AGENTRL_CACHE) of its own, so
nothing a developer's machine holds is reused. Then, as the README gives them:

  * install:   `./scripts/install.sh` (its own .venv)
  * main job:  `.venv/bin/python -m agentrl.train --config examples/agents/guess_number.yaml`, its output
               read line by line as it comes and split at the run's own log lines: `imports` (the command's
               start to its first line), `warm start` (building the embedded default model: tokenizer,
               SFT), `start-up` (vLLM and the learner up, to the first eval), `evals` (the held-out evals'
               own seconds from summary.json, the in-run ones inside RL), `RL` (summary.json's train
               seconds), `end` (saving, the summary, the plot, stopping engines and processes);
  * tutorial:  every command of docs/tutorials/first-env.md's ```bash blocks, in order, at the size the page
               gives (the collector is the doc test's, tests/doc_blocks.py; a server command such as the
               viewer is started, left up for 5 s and stopped), timed one by one. Only for revisions that
               have the page.

The goals (issue 73, 2 cores): install <= 120 s, main job <= 180 s with held-out >= 0.93, the tutorial's
compute <= 8 minutes. The tables go to stdout; progress to stderr. Runs one thing at a time: two at once on
2 cores each take about twice as long.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from _common import ROOT, print_host, progress, table

JOB = ["-m", "agentrl.train", "--config", "examples/agents/guess_number.yaml"]
TUTORIAL = "docs/tutorials/first-env.md"
# The run's own log lines that end one phase of the main job and start the next.
WARM_START = re.compile(r"building the embedded default model|using cached default model")
VLLM = re.compile(r"; starting vLLM")
EVAL_BEFORE = re.compile(r"eval before RL: (\{.*\})")
GOALS = {"install": 120.0, "job": 180.0, "held-out": 0.93, "tutorial": 480.0}


@dataclass
class Timed:
    """What one revision measured: seconds by phase, held-out scores, the tutorial's commands."""

    rev: str
    commit: str = ""
    install_s: float = float("nan")
    job_s: float = float("nan")
    phases: dict[str, float] = field(default_factory=dict)
    before: float = float("nan")
    after: float = float("nan")
    tutorial: list[tuple[str, float, int]] = field(default_factory=list)  # (command, seconds, exit status)


def clean_env(work: Path) -> dict[str, str]:
    """The environment of a newcomer's shell: empty caches of this run's own, no suite or venv leftovers."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("VIRTUAL_ENV", "PYTHONPATH", "WARM_PYTHON", "VLLM_", "AGENTRL_", "CI"))}
    for name in ("PIP_CACHE_DIR", "UV_CACHE_DIR", "AGENTRL_CACHE", "XDG_CACHE_HOME"):
        (work / name.lower()).mkdir(parents=True, exist_ok=True)
        env[name] = str(work / name.lower())
    return env


def clone(rev: str, dest: Path) -> str:
    subprocess.run(["git", "clone", "-q", str(ROOT), str(dest)], check=True)
    subprocess.run(["git", "-C", str(dest), "checkout", "-q", rev], check=True)
    return subprocess.run(["git", "-C", str(dest), "rev-parse", "--short", "HEAD"], check=True,
                          capture_output=True, text=True).stdout.strip()


def run_timed(cmd: list[str] | str, cwd: Path, env: dict[str, str], log: Path,
              on_line=None, shell: bool = False) -> tuple[float, int]:
    """Run `cmd`, its output (stdout and stderr) into `log`, each line handed to `on_line(seconds, line)`
    as it arrives; returns (wall seconds, exit status)."""
    t0 = time.perf_counter()
    with log.open("w") as f:
        proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True, errors="replace", shell=shell, executable="/bin/bash" if shell else None)
        for line in proc.stdout:
            f.write(line)
            if on_line is not None:
                on_line(time.perf_counter() - t0, line)
        rc = proc.wait()
    return time.perf_counter() - t0, rc


def job_phases(marks: dict[str, float], summary: dict, wall: float) -> dict[str, float]:
    """The main job's wall time split at its log lines (`marks`: first line, warm start, vLLM, eval before)."""
    eval_s = [summary.get(k, {}).get("seconds") or 0.0 for k in ("eval_before", "eval_after")]
    rl = summary.get("train", {}).get("seconds", float("nan"))
    first = marks.get("first", 0.0)
    warm = marks.get("vllm", first) - marks.get("warm", marks.get("vllm", first))
    startup = marks.get("eval_before", first) - eval_s[0] - marks.get("vllm", first)
    phases = {"imports": first + (marks.get("warm", first) - first), "warm start": warm, "start-up": startup,
              "evals": sum(eval_s), "RL": rl}
    phases["end"] = wall - sum(phases.values())
    return phases


def main_job(clone_dir: Path, env: dict[str, str], logs: Path, timed: Timed) -> None:
    marks: dict[str, float] = {}

    def on_line(t: float, line: str) -> None:
        marks.setdefault("first", t)
        if WARM_START.search(line):
            marks.setdefault("warm", t)
        elif VLLM.search(line):
            marks.setdefault("vllm", t)
        elif EVAL_BEFORE.search(line):
            marks.setdefault("eval_before", t)

    progress(f"{timed.rev}: the main job")
    wall, rc = run_timed([".venv/bin/python", *JOB], clone_dir, env, logs / f"{timed.rev}-job.log", on_line)
    if rc != 0:
        raise RuntimeError(f"{timed.rev}: the main job exited {rc}; see {logs / f'{timed.rev}-job.log'}")
    summary = json.loads((clone_dir / "runs/guess_number/summary.json").read_text())
    timed.job_s, timed.phases = wall, job_phases(marks, summary, wall)
    timed.before, timed.after = summary["eval_before"]["score"], summary["eval_after"]["score"]


def tutorial_commands(clone_dir: Path) -> list:
    """The page's commands as the doc test collects them (tests/doc_blocks.py of that clone)."""
    sys.path.insert(0, str(clone_dir / "tests"))
    try:
        import doc_blocks
        return [c for c in doc_blocks.collect_markdown(clone_dir / TUTORIAL, clone_dir) if c.skip is None]
    finally:
        sys.path.pop(0)
        sys.modules.pop("doc_blocks", None)


def tutorial(clone_dir: Path, env: dict[str, str], logs: Path, timed: Timed) -> None:
    venv = {**env, "PATH": f"{clone_dir / '.venv/bin'}:{env['PATH']}", "VIRTUAL_ENV": str(clone_dir / ".venv")}
    for i, cmd in enumerate(tutorial_commands(clone_dir)):
        text = re.sub(r"(?:(?<=^)|(?<=[\s($;&|]))python3?(?=\s)", ".venv/bin/python", cmd.text)
        progress(f"{timed.rev}: tutorial command {i + 1}: {text}")
        log = logs / f"{timed.rev}-tutorial-{i + 1}.log"
        if cmd.background or re.search(r"agentrl[. ]view", text):  # a server: up for 5 s, then stopped
            t0 = time.perf_counter()
            with log.open("w") as f:
                proc = subprocess.Popen(text.rstrip("& "), cwd=clone_dir, env=venv, shell=True, stdout=f,
                                        stderr=subprocess.STDOUT, executable="/bin/bash", start_new_session=True)
                time.sleep(5)
                rc = proc.poll()
                if rc is None:
                    os.killpg(proc.pid, 15)
                    proc.wait()
                    rc = 0
            timed.tutorial.append((text, time.perf_counter() - t0, rc))
            continue
        wall, rc = run_timed(text, clone_dir, venv, log, shell=True)
        timed.tutorial.append((text, wall, rc))


def measure(rev: str, work: Path, skip: set[str]) -> Timed:
    timed = Timed(rev)
    clone_dir = work / f"clone-{rev}"
    logs = work / "logs"
    logs.mkdir(exist_ok=True)
    timed.commit = clone(rev, clone_dir)
    env = clean_env(work / f"env-{rev}")
    progress(f"{rev} ({timed.commit}): ./scripts/install.sh from an empty pip cache")
    timed.install_s, rc = run_timed(["./scripts/install.sh"], clone_dir, env, logs / f"{rev}-install.log")
    if rc != 0:
        raise RuntimeError(f"{rev}: ./scripts/install.sh exited {rc}; see {logs / f'{rev}-install.log'}")
    if "job" not in skip:
        main_job(clone_dir, env, logs, timed)
    if "tutorial" not in skip and (clone_dir / TUTORIAL).exists():
        tutorial(clone_dir, env, logs, timed)
    return timed


def fmt(x: float, digits: int = 0) -> str:
    return "-" if x != x else f"{x:.{digits}f}"


def report(results: list[Timed]) -> None:
    phases = ["imports", "warm start", "start-up", "evals", "RL", "end"]
    rows = [[f"{r.rev} ({r.commit})", fmt(r.install_s), fmt(r.job_s), *(fmt(r.phases.get(p, float("nan"))) for p in phases),
             fmt(r.before, 3), fmt(r.after, 3), fmt(r.install_s + r.job_s)] for r in results]
    print(table(["revision", "install s", "main job s", *phases, "held-out before", "after", "command 1 s"], rows,
                "The first hour: seconds from a clean clone and empty caches"))
    print(f"goals: install <= {GOALS['install']:.0f} s, main job <= {GOALS['job']:.0f} s, "
          f"held-out after >= {GOALS['held-out']}")
    for r in results:
        if not r.tutorial:
            continue
        total = sum(s for _, s, _ in r.tutorial)
        print()
        print(table(["command", "seconds", "exit"], [[c, fmt(s, 1), rc] for c, s, rc in r.tutorial] +
                    [["(all of them)", fmt(total, 1), ""]], f"{TUTORIAL} at {r.rev} ({r.commit})"))
        print(f"goal: <= {GOALS['tutorial']:.0f} s of compute: {'met' if total <= GOALS['tutorial'] else 'not met'}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--revs", default="HEAD", help="revisions to measure, one after the other (comma-separated)")
    ap.add_argument("--skip", default="", help="parts to leave out: job, tutorial (comma-separated)")
    ap.add_argument("--keep", default=None, help="a folder for the clones and logs (default: a temporary one, removed)")
    args = ap.parse_args(argv)
    print_host(argv)
    work = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="first-hour-"))
    work.mkdir(parents=True, exist_ok=True)
    skip = {s for s in args.skip.split(",") if s}
    results = [measure(rev, work, skip) for rev in args.revs.split(",")]  # a failure keeps `work` and its logs
    report(results)
    if not args.keep:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
