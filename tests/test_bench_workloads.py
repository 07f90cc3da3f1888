"""The benchmarks' workloads and methods are valid configs: a renamed key or estimator would otherwise surface
only after a benchmark's first run had built its model and started its engines."""

from __future__ import annotations

from pathlib import Path

import pytest

from agentrl.config import load_config
from bench.staleness import METHODS, WORKLOADS

CONFIG = Path(__file__).resolve().parents[1] / "examples/agents/guess_number.yaml"


@pytest.mark.parametrize("workload", sorted(WORKLOADS))
@pytest.mark.parametrize("method", sorted(METHODS))
def test_every_workload_and_method_loads(workload, method):
    cfg = load_config(str(CONFIG), [*WORKLOADS[workload], *METHODS[method]])
    if workload == "long16":
        # the 16-turn task with PPO's critic, four optimizer steps a batch, each bounded in KL (docs/benchmarks.md,
        # "Staleness"); its off-policy settings are the method's
        assert cfg.env.kwargs["max_turns"] == 16 and cfg.rollout.max_turns == 16
        assert cfg.algo.advantage.type == "gae"
        assert cfg.learner.freeze_actor_steps == 5 and cfg.learner.mini_batches == 4
        assert cfg.learner.max_step_kl == 0.05
