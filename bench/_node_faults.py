"""Node faults on Ray's multi-node test cluster (`ray.cluster_utils.Cluster`: a head and three worker
raylets on this host, each its own node), for `bench/chaos_resume.py`'s fault table.

    from bench._node_faults import node_fault_rows; node_fault_rows(trials)

Layout: the driver on the head (one spare CPU), the learner rank on node L (`learner_node`), engine 0 and
1 spread over E1 (one `engine_node`) and E2 (two: room for E1's engine when E1 goes). Weights reach the
engines through the collective path. Each trial removes a node with SIGKILL (no drain) at a step drawn
at random, on a fresh cluster:

- engine node removed: E1 goes; the run must finish by itself (its engine restarted on E2).
- engine node removed, none to hold it: E2 offers one `engine_node` only, so E1's engine has nowhere to
  go; the run must finish by itself on the one engine left, saying it goes on with fewer.
- learner node removed: L goes; the run must end by itself (exit 1, LearnerRankDied naming
  train.resume=auto) within the bound, then the same command with train.resume=auto (the learner on
  the head) must finish it.

Episodes and steps lost or duplicated come from `agentrl.run.checkpoint.audit` over the run's folder: task
positions skipped or seen twice, steps missing or repeated in metrics.jsonl.
"""

from __future__ import annotations

import os
import random
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench._common import ROOT, progress, resolve_model

CONFIG = "examples/agents/guess_number.yaml"
FAULTS = ("engine node removed", "engine node removed, none to hold it", "learner node removed")
END_BOUND_S = 600  # a run that has not ended this long after the fault did not end by itself
ARGS = ("train.checkpoint_every=1", "train.eval_before=false", "data.eval_tasks=16", "buffer.batch_size=16",
        "rollout.n_samples=4", "buffer.max_staleness=1000", "buffer.max_ahead_batches=null",
        "cluster.backend=ray", "cluster.engines=2",
        "weight_sync.transport=collective", "cluster.engine_resources={engine_node: 1}",
        "cluster.interface=lo")  # every node is this host: lo is the interface the nodes reach each other on


class Run:
    """A train command in its own process, its output read as it comes."""

    def __init__(self, out: Path, model: str, *extra: str) -> None:
        cmd = [sys.executable, "-m", "agentrl.train", "--config", CONFIG, f"model.path={model}",
               f"train.out_dir={out}", *ARGS, *extra]
        env = {**os.environ, "PYTHONPATH": str(ROOT), "CI": "true"}
        self.out, self.lines = out, []
        self.proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                     text=True)
        self.reader = threading.Thread(target=lambda: self.lines.extend(iter(self.proc.stdout.readline, "")),
                                       daemon=True)
        self.reader.start()

    def steps(self) -> int:
        path = self.out / "metrics.jsonl"
        return len(path.read_text().splitlines()) if path.exists() else 0

    def wait(self, until, timeout_s: float = END_BOUND_S) -> bool:
        """Until `until()` holds (True) or the process ends or the time is up (False)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and self.proc.poll() is None:
            if until():
                return True
            time.sleep(0.5)
        return until()

    def end(self, timeout_s: float = END_BOUND_S) -> int | None:
        """The exit status, or None when the run did not end within `timeout_s` (then it is killed)."""
        try:
            code = self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            code = None
        self.reader.join(timeout=30)
        return code

    def said(self, *texts: str) -> list[str]:
        return [line.rstrip() for line in self.lines if any(t in line for t in texts)]


def start_cluster(spare: int = 1):
    """A head and nodes L, E1 (one engine) and E2 (one engine and `spare` more)."""
    from ray._private.authentication.authentication_token_setup import (enable_token_auth_by_default,
                                                                        ensure_token_if_auth_enabled)
    from ray.cluster_utils import Cluster

    enable_token_auth_by_default()
    ensure_token_if_auth_enabled({}, create_token_if_missing=True)
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1})
    nodes = {"L": cluster.add_node(num_cpus=1, resources={"learner_node": 1}),
             "E1": cluster.add_node(num_cpus=1, resources={"engine_node": 1}),
             "E2": cluster.add_node(num_cpus=1 + spare, resources={"engine_node": 1 + spare})}
    return cluster, nodes


def one_trial(fault: str, model: str, steps: int, kill_at: int, out: Path) -> dict:
    """One run with `fault` at step `kill_at`: whether it ended by itself, and the audit of its folder."""
    from agentrl.run.checkpoint import audit

    cluster, nodes = start_cluster(spare=0 if "none to hold" in fault else 1)
    try:
        address = f"cluster.address={cluster.address}"
        run = Run(out, model, address, f"train.steps={steps}", "cluster.learner_resources={learner_node: 1}")
        if not run.wait(lambda: run.steps() >= kill_at):
            raise RuntimeError("the run ended before the fault:\n" + "".join(run.lines)[-4000:])
        cluster.remove_node(nodes.pop("E1" if fault.startswith("engine") else "L"), allow_graceful=False)
        code = run.end()
        said = run.said("died", "restarted in", "run failed", "going on with")
        if fault.startswith("engine"):
            ended = code == 0 and ("none to hold" not in fault or any("going on with 1 of 2" in x for x in said))
        else:
            ended = code == 1 and any("LearnerRankDied" in line for line in said)
            again = Run(out, model, address, f"train.steps={steps}", "cluster.learner_resources={}",
                        "train.resume=auto")
            ended = again.end() == 0 and ended
            said += again.said("resumed from")
        report = audit(out)
    finally:
        cluster.shutdown()
    return {"ended": ended, "report": report, "said": said}


def node_fault_rows(trials: int, model: str = "default", steps: int = 30, seed: int = 0,
                    only: tuple[str, ...] = ()) -> list[dict]:
    """One row per node fault (those whose name contains one of `only`, all when empty) over `trials`
    runs each, in bench/chaos_resume.py's columns (the run's own log lines of each fault are printed)."""
    model, rng, rows = resolve_model(model), random.Random(seed), []
    for fault in [f for f in FAULTS if not only or any(o in f for o in only)]:
        row = {"fault": fault, "trials": trials, "ended by itself": 0, "episodes lost": 0, "episodes duplicated": 0,
               "steps lost": 0, "steps duplicated": 0}
        for trial in range(trials):
            kill_at = rng.randint(2, steps // 3)
            progress(f"{fault}, trial {trial + 1}/{trials}: at step {kill_at}")
            with tempfile.TemporaryDirectory() as tmp:
                got = one_trial(fault, model, steps, kill_at, Path(tmp) / "run")
            print("\n".join(f"    {line}" for line in got["said"]), file=sys.stderr)
            report = got["report"]
            row["ended by itself"] += got["ended"]
            row["episodes lost"] += len(report["skipped"])
            row["episodes duplicated"] += len(report["duplicated"])
            row["steps lost"] += len(report.get("steps_missing", []))
            row["steps duplicated"] += len(report.get("steps_repeated", []))
        rows.append(row)
    return rows


if __name__ == "__main__":
    for r in node_fault_rows(int(sys.argv[1]) if len(sys.argv) > 1 else 1, only=tuple(sys.argv[2:])):
        print(r)
