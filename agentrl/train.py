"""`python -m agentrl.train --config x.yaml [dotted.key=value ...]`: the command line of an RL run.

It checks everything a user's input can get wrong (config keys, YAML, data rows, the env's import
path, the model folder, reward rules) before vLLM or DeepSpeed start, reporting each as one line with
exit code 2 (`agentrl.run.startup.prepare`), then hands the run to `agentrl.run.rl_run.RLRun` (set-up, the
loop, checkpoints, clean-up). `cluster.backend: local` runs the engines and the one learner rank in
this process; `ray` runs each engine and each learner rank as a Ray actor (`agentrl.run.cluster`).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import sys
from typing import Any

from agentrl.config import Config, ConfigError, load_config
from agentrl.config.inert import inert_settings
from agentrl.telemetry.metrics import print_summary, setup_logging
from agentrl.utils.process_exit import run_and_exit
from agentrl.utils.prog import prog
from agentrl.rollout.core_process import prestart_for
from agentrl.run.rl_run import RLRun
from agentrl.run.checkpoint.placement import claim_run, release_run
from agentrl.run.startup import Prepared, input_error, prepare

log = logging.getLogger("agentrl")


def _run_errors() -> tuple[type[Exception], ...]:
    """Failures that end a run with one line and exit code 1 (read only when something was raised)."""
    from agentrl.run.cluster import ClusterError
    from agentrl.rollout.fleet import FleetFailed

    from agentrl.learner.ray_ranks import LearnerRankDied
    from agentrl.telemetry.learning_signal import NoLearningSignal
    from agentrl.rollout.failures import EpisodesFailing

    return ClusterError, FleetFailed, LearnerRankDied, EpisodesFailing, NoLearningSignal


async def run(cfg: Config, prep: Prepared) -> dict[str, Any]:
    """The whole run (`agentrl.run.rl_run.RLRun`): set up, train, clean up; returns the summary."""
    async with RLRun(cfg, prep) as rl:
        await rl.setup()
        return await rl.train()


def main(argv: list[str] | None = None) -> int:
    from agentrl.config.help import keys_help

    parser = argparse.ArgumentParser(prog=prog("train"), description=__doc__.split("\n\n")[0],
                                     epilog=keys_help(Config), formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", help="YAML config file (defaults apply when omitted)")
    parser.add_argument("overrides", nargs="*", help="dotted.key=value overrides, e.g. buffer.max_staleness=2")
    args = parser.parse_intermixed_args(argv)
    setup_logging()
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")  # vLLM warns on every in-place reload
    try:
        cfg = load_config(args.config, args.overrides)
        for sentence in inert_settings(cfg):
            log.warning("%s", sentence)
        prep = prepare(cfg)
    except ConfigError as exc:  # DataError included
        return input_error(exc)
    # last before the engines: a run never writes into another run's folder (docs/durability.md)
    folder = claim_run(prep.place)
    cfg.train.out_dir = str(folder)
    prestart_for(cfg.cluster.backend)
    import uvloop

    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        try:
            summary = runner.run(run(cfg, prep))
        except ConfigError as exc:  # what only the model folder tells (its chat template), before any engine
            release_run(prep.place, folder)
            return input_error(exc)
        except _run_errors() as exc:  # a cluster that cannot hold the run, a dead learner rank, a failed fleet
            print(f"run failed: {type(exc).__name__}: {exc}", file=sys.stderr)
            return 1
    print_summary(summary)
    return 0


if __name__ == "__main__":
    run_and_exit(main)
