"""`python -m agentrl.check [--config FILE] [--tasks N] [--policy engine|scripted] [--reply TEXT ...]
[--split train|eval] [dotted.key=value ...]`: a dry run of a config, in seconds, before training on it.

It checks the config as `agentrl.train` does (`prepare`: a user's input error is one line, exit code 2),
builds the chat format, the env and the reward sources, and plays the first N tasks (default 4) of the
split at once, one episode each, with the config's rollout settings and the held-out eval's seeds
(`data.seed * 100_003 + i` for episode i): `--policy engine` (default) on one local vLLM engine,
whatever `cluster` says, and no learner; `--policy scripted` on no engine: turn k of every episode is
the k-th `--reply` (repeatable, cycled; default "42") as the tokenizer writes it, closed with EOS (cut
at the turn's budget, as vLLM cuts), logprob 0, version 0.

Each episode prints a header (label, status, reward, each reward source's status), then its ledger as
the model saw it, span by span: the prompt, each turn's sampled tokens (loss mask 1: trained; in [[ ]],
green on a terminal), the env's reply, each with its token count, and each env step's time; a newline
shows as `\\n` and ends the line. A failed episode adds its error (naming the user's file:line) and
traceback (once per distinct traceback). Only the report goes to stdout; logs go to stderr.

Exit code 0 only when all of these hold, else 1 with a last line naming what failed:
  * every train and eval task is JSON, `json.loads(json.dumps(task)) == task` (checkpoints keep them
    as JSON); the first that is not is named by index, id, key and type;
  * every episode finished (ok / truncated) and every reward source scored it with status ok;
  * the template round-trips: each ledger, built piece by piece as rollout builds it, is the
    tokenizer's encoding of the template's rendering of the whole conversation, with the tools that
    episode's env declared (`agentrl.rollout.round_trip` says exactly how they are compared, and why
    a model's own tokenisation of its text is a note, not a failure).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import os
import sys
import time
from collections import Counter
from typing import Any, TextIO

from agentrl.config import Config, ConfigError, load_config
from agentrl.data.task_json import tasks_problem
from agentrl.rollout.core_process import prestart_for
from agentrl.rollout.engine import Generation
from agentrl.rollout.round_trip import RoundTrip, decode, round_trip
from agentrl.run.startup import Prepared, episode_spec, input_error, load_model_format, prepare, stop_agent_server
from agentrl.types import TRAINABLE_STATUSES, Episode
from agentrl.utils.process_exit import run_and_exit
from agentrl.utils.prog import prog

DEFAULT_REPLY = "42"
LABEL_WIDTH = 40
GREEN, RESET = "\x1b[32m", "\x1b[0m"


@dataclasses.dataclass
class ScriptedPolicy:
    """The engine's stand-in under `--policy scripted`: turn k of an episode is replies[k % len(replies)]."""

    replies: list[str]
    fmt: Any
    turn: int = 0

    @contextlib.asynccontextmanager
    async def lease(self):
        yield dataclasses.replace(self, turn=0)  # each episode counts its own turns

    async def generate(self, prompt_ids: list[int], max_tokens: int, temperature: float = 1.0,
                       top_p: float = 1.0, seed: int | None = None) -> Generation:
        reply = self.replies[self.turn % len(self.replies)]
        self.turn += 1
        ids = (self.fmt.encode(reply) + [self.fmt.eos_id])[:max_tokens]
        return Generation(ids, [0.0] * len(ids), [0] * len(ids), "stop" if ids[-1] == self.fmt.eos_id else "length")


class _Made:
    """One episode's `env_cls`: builds the env as the class does and keeps it, so that the round trip
    renders the conversation with the tools this env declared (an env may set them at reset)."""

    def __init__(self, env_cls: Any) -> None:
        self.env_cls, self.env, self.is_agent = env_cls, None, env_cls.is_agent  # stands in for the class

    def __call__(self, **kwargs: Any) -> Any:
        self.env = self.env_cls(**kwargs)
        return self.env


@dataclasses.dataclass
class Played:
    episodes: list[tuple[Episode, list | None]]  # each episode, with the tools its env declared
    start_s: float  # starting the engine
    play_s: float  # playing and scoring the episodes
    is_agent: bool = False  # the run's kind (EpisodeSpec.is_agent): an AgentEnv's ledger is not re-rendered


class EngineDidNotStart(RuntimeError):
    """The one vLLM engine failed to start: the check ends with exit code 1."""


async def play(cfg: Config, prep: Prepared, tasks: list[dict], split: str, model_path: str, fmt: Any,
               replies: list[str] | None, per_episode: list[list[str]] | None = None) -> Played:
    """Play `tasks` on one local engine (on `replies` when given, or episode i on `per_episode[i]`) and
    score them as training does."""
    from agentrl.learner.models import frozen_engine
    from agentrl.rollout.runner import episode_runner
    from agentrl.rollout.fleet import EngineFleet
    from agentrl.rollout.tools.client import aclose_shared
    from rewards.sources import RewardCombiner

    async def one(i: int, task: dict) -> tuple[Episode, list | None]:
        made = _Made(spec.env_cls)
        async with (ScriptedPolicy(per_episode[i], fmt) if per_episode else engine).lease() as leased:
            ep = await episode_runner(spec)(task, leased, dataclasses.replace(spec, env_cls=made),
                                   i if split == "train" else -1 - i, cfg.data.seed * 100_003 + i)
        if ep.status in TRAINABLE_STATUSES:
            await scorer.score(ep)
        return ep, getattr(made.env, "tools", None) or None

    scorer = RewardCombiner(cfg.rewards, engine_factory=frozen_engine)
    fleet = spec = None
    t0 = time.perf_counter()
    try:
        engine = ScriptedPolicy(replies or [DEFAULT_REPLY], fmt) if replies or per_episode else None
        if engine is None:
            engine = fleet = EngineFleet.local(model_path, cfg.engine, fmt.eos_id, cfg.cluster)
            try:
                await fleet.start()
            except Exception as exc:
                raise EngineDidNotStart(f"{type(exc).__name__}: {exc}") from exc
        t1 = time.perf_counter()
        spec = await episode_spec(cfg, prep.env_cls, fmt, engine)
        async with asyncio.TaskGroup() as tg:
            jobs = [tg.create_task(one(i, task)) for i, task in enumerate(tasks)]
        return Played([job.result() for job in jobs], t1 - t0, time.perf_counter() - t1, spec.is_agent)
    finally:
        await aclose_shared()
        await scorer.aclose()
        await stop_agent_server(spec)
        if fleet is not None:
            await fleet.shutdown()


async def replay_teacher(cfg: Config, prep: Prepared, model_path: str, fmt: Any, n: int) -> Played | None:
    """The embedded default's teacher (model.default.task), its best play on `n` demo tasks replayed through
    the env; None when the model is the user's own or the teacher's module is not the env's."""
    from agentrl.models.demos import best_play, teaches_the_env

    default = cfg.model.default
    if cfg.model.path or not teaches_the_env(default.task, prep.env_cls.__module__):
        return None
    tasks, replies = best_play(default.task, default.seed, n, default.demo_max_turns)
    return await play(cfg, prep, tasks, "train", model_path, fmt, None, per_episode=replies)


def teacher_verdict(eps: list[Episode], task: str) -> tuple[str, str | None]:
    """(the report's teacher line, the problem when the env scores a best play 0 or less, or it fails)."""
    shown = " ".join(f"{e.reward:.3f}" if e.status in TRAINABLE_STATUSES else e.status for e in eps)
    line = f"=== teacher ({task}): its best play on {len(eps)} demo tasks, replayed through the env: {shown}"
    bad = [(i, e) for i, e in enumerate(eps) if e.status not in TRAINABLE_STATUSES or e.reward <= 0]
    if not bad:
        return line, None
    i, e = bad[0]
    why = f"reward {e.reward:.3f}" if e.status in TRAINABLE_STATUSES else f"{e.status}: {e.error}"
    return line, (f"the env scores {len(bad)} of {len(eps)} of the teacher's best demonstrations 0 or less (first: "
                  f"demo task {i}, {why}): the warm start would teach what the env does not reward; compare "
                  f"{task}'s demonstration with the env's step")


def _span(label: str, text: str, trained: bool, color: bool) -> list[str]:
    """`text` exactly, as lines: each newline shows as \\n and ends its line; trained text in [[ ]]."""
    parts = text.replace("\r", "\\r").replace("\t", "\\t").split("\n")
    lines = [p + "\\n" for p in parts[:-1]] + ([parts[-1]] if parts[-1] or len(parts) == 1 else [])
    if trained:
        lines[0] = "[[" + lines[0]
        lines[-1] += "]]"
        lines = [GREEN + line + RESET for line in lines] if color else lines
    return [f"  {label if j == 0 else '':<{LABEL_WIDTH}}| {line}" for j, line in enumerate(lines)]


def _label(name: str, n: int, extra: str = "") -> str:
    return f"{name:<15}{n:>5} tok{extra}"


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.2f} ms" if seconds < 1 else f"{seconds:.2f} s"


def _runs(mask: list[int]) -> list[tuple[int, int, bool]]:
    """(start, end, trained) of each maximal run of equal loss-mask values."""
    cuts = [0] + [i for i in range(1, len(mask)) if mask[i] != mask[i - 1]] + [len(mask)]
    return [(a, b, bool(mask[a])) for a, b in zip(cuts, cuts[1:]) if b > a]


def _header(ep: Episode) -> str:
    rewards = ep.info.get("rewards") or {}
    sources = ", ".join(f"{name} ok {r['value']:.3f}" if r["status"] == "ok" else
                        f"{name} {r['status']} ({r.get('error')})" for name, r in rewards.items()) or "not scored"
    reward = f"reward {ep.reward:.3f}" if rewards and ep.status in TRAINABLE_STATUSES else "no reward"
    rows = ep.rows()
    return f"=== {ep.label}: {ep.status}, {reward} (sources: {sources}); {len(ep.turns)} turn" \
           f"{'' if len(ep.turns) == 1 else 's'}, {sum(len(r.tokens) for r in rows)} tokens, " \
           f"{sum(sum(r.loss_mask) for r in rows)} trained"


def episode_lines(ep: Episode, fmt: Any, trip: RoundTrip, is_agent: bool, color: bool,
                  shown: dict[str, str]) -> list[str]:
    """The episode's report; `shown` maps each traceback printed so far to its episode's label."""
    out, k, rows = [_header(ep)], 0, ep.rows()
    for s, row in enumerate(rows, 1):
        if len(rows) > 1:
            out.append(f"  -- segment {s}" + (f", closed: {row.reason}" if row.reason else ""))
        for start, end, gen in _runs(row.loss_mask):
            n, text = end - start, decode(fmt, row.tokens[start:end])
            if gen:
                k += 1
                label = _label(f"turn {k} trained", n, "" if row.tokens[end - 1] == fmt.eos_id else " (cut)")
            elif start == 0:
                label = _label("prompt", n)
            else:
                label = _label(f"turn {k} env", n)
                turn = ep.turns[k - 1] if 0 < k <= len(ep.turns) else None
                if turn is not None and not is_agent:
                    label += f", step {_ms(turn.env_s)}"
                    if end == len(row.tokens) and turn.env_tokens > n:
                        text += f"   (+{turn.env_tokens - n} tokens past engine.max_model_len, dropped)"
            out += _span(label, text, gen, color)
    if ep.turns and not is_agent and ep.loss_mask and ep.loss_mask[-1]:  # the env's step after the last turn
        done = "(the episode ends)" if ep.status in TRAINABLE_STATUSES else "(see the error)"
        step = f", step {_ms(ep.turns[-1].env_s)}" if ep.turns[-1].env_s else ""  # 0: the step raised
        out += _span(_label(f"turn {k} env", 0, step), done, False, color)
    verdict = f"FAILED: {trip.failure}" if trip.failure else "ok" if trip.compared else "not compared"
    out.append(f"  round trip: {verdict}")
    out += [f"    note: {note}" for note in trip.notes]
    if ep.status not in TRAINABLE_STATUSES:
        out.append(f"  error: {ep.error}")
        if ep.traceback in shown:
            out.append(f"    (the same traceback as {shown[ep.traceback]})")
        elif ep.traceback:
            shown[ep.traceback] = ep.label
            out += ["    " + line for line in ep.traceback.splitlines()]
    return out


def _counts(counter: Counter) -> str:
    return ", ".join(f"{key} {n}" for key, n in counter.items()) or "-"


def problems(eps: list[Episode], trips: list[RoundTrip], task_problems: list[str]) -> list[str]:
    """What fails the check, one phrase each. A reward source that fails makes its episode reward_error
    (rewards.sources.RewardCombiner), so "every episode finished" includes "scored ok by every source"."""
    found = list(task_problems) + ([] if eps else ["no episode was played: the split has no tasks"])
    failed = [ep for ep in eps if ep.status not in TRAINABLE_STATUSES]
    if failed:
        counts = _counts(Counter(ep.status for ep in failed))
        found.append(f"{len(failed)} of {len(eps)} episodes failed ({counts}); first: {failed[0].label}: "
                     f"{failed[0].error}")
    bad = [(ep, t) for ep, t in zip(eps, trips) if t.failure]
    if bad:
        found.append(f"the template does not round-trip in {len(bad)} of {len(eps)} episodes; first: "
                     f"{bad[0][0].label}: {bad[0][1].failure}")
    return found


def summary_lines(played: Played, trips: list[RoundTrip], found: list[str], prep: Prepared, cfg: Config,
                  eos_id: int, wall_s: float) -> list[str]:
    eps = [ep for ep, _ in played.episodes]
    turns = [ep.tokens[t.start + t.n_generated - 1] for ep in eps if not ep.segments for t in ep.turns if t.n_generated]
    done = [ep for ep in eps if ep.status in TRAINABLE_STATUSES]
    mean = f"mean {sum(e.reward for e in done) / len(done):.3f} over {len(done)} finished" if done else "none finished"
    sources = Counter(f"{name} {r['status']}" for ep in eps for name, r in (ep.info.get("rewards") or {}).items())
    steps = [t.env_s for ep in eps for t in ep.turns if t.env_s > 0]
    timing = f", mean {_ms(sum(steps) / len(steps))}, max {_ms(max(steps))}" if steps else ""
    compared = [t for t in trips if t.compared]
    notes = sum(len(t.notes) for t in compared)
    verdict = ("check failed: " + "; ".join(found)) if found else \
        "check passed: every episode finished and was scored ok by every source, the tasks are JSON, and the " \
        "template round-trips"
    return ["=== summary",
            f"episodes   : {len(eps)} played ({_counts(Counter(e.status for e in eps))})",
            f"reward     : {mean}; sources: {_counts(sources)}",
            f"turns      : {len(turns)}, {sum(t != eos_id for t in turns)} cut at rollout.max_tokens_per_turn="
            f"{cfg.rollout.max_tokens_per_turn}",
            f"env steps  : {len(steps)}{timing}",
            f"tasks      : {len(prep.train_tasks)} train, {len(prep.eval_tasks)} eval",
            f"round trip : ok in {sum(not t.failure for t in compared)} of {len(compared)} compared episodes"
            + (f" ({notes} notes)" if notes else ""),
            f"time       : engine start {played.start_s:.1f} s, episodes {played.play_s:.1f} s, wall {wall_s:.1f} s",
            verdict]


def _parser() -> argparse.ArgumentParser:
    from agentrl.config.help import keys_help

    parser = argparse.ArgumentParser(prog=prog("check"), description=__doc__.split("\n\n")[0],
                                     epilog=keys_help(Config), formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--config", help="YAML config file (defaults apply when omitted)")
    parser.add_argument("--tasks", type=int, default=4, help="episodes to play: the first N tasks of the split")
    parser.add_argument("--policy", choices=("engine", "scripted"), default="engine",
                        help="engine: one local vLLM engine; scripted: canned replies, no engine")
    parser.add_argument("--reply", action="append",
                        help=f"a scripted turn (repeatable, cycled; default {DEFAULT_REPLY!r})")
    parser.add_argument("--split", choices=("train", "eval"), default="train", help="whose tasks to play")
    parser.add_argument("overrides", nargs="*", help="dotted.key=value overrides, e.g. rollout.max_turns=2")
    return parser


def _intro(args: argparse.Namespace, cfg: Config, model_path: str, replies: list[str] | None, n: int,
           task_problems: list[str]) -> str:
    r = cfg.rollout
    policy = f"scripted, replies {replies!r} cycled" if replies else \
        f"engine (one local vLLM), temperature {r.temperature}, top_p {r.top_p}"
    return "\n".join([f"agentrl check: {args.config or 'the default config'}", f"  env    : {cfg.env.import_path}",
                      f"  model  : {model_path}" + (" (its tokenizer: a scripted check needs no weights)"
                                                    if "default-tokenizer-" in model_path else ""),
                      f"  policy : {policy}; at most {r.max_turns} turns of {r.max_tokens_per_turn} tokens",
                      f"  tasks  : {'; '.join(task_problems) or 'all JSON'}; playing the first {n} {args.split} "
                      f"tasks, seed data.seed * 100003 + i"])


def main(argv: list[str] | None = None, out: TextIO | None = None) -> int:
    """The report goes to `out` (stdout); everything else printed meanwhile, log lines included, to stderr."""
    parser = _parser()
    args = parser.parse_intermixed_args(argv)
    if args.tasks < 1:
        parser.error(f"--tasks must be >= 1, got {args.tasks}")
    out = out or sys.stdout
    with contextlib.redirect_stdout(sys.stderr):
        return check(args, out)


def check(args: argparse.Namespace, out: TextIO) -> int:
    """Load, play, report; the exit code."""
    from agentrl.telemetry.metrics import setup_logging

    t0 = time.perf_counter()
    setup_logging()
    os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
    try:
        cfg = load_config(args.config, args.overrides)
        cfg.cluster.backend, cfg.cluster.engines = "local", 1
        cfg.train.resume = None  # a training setting; the check starts from the model folder
        prep = prepare(cfg)
    except ConfigError as exc:  # DataError included
        return input_error(exc)
    prestart_for(cfg.cluster.backend)
    tasks = (prep.train_tasks if args.split == "train" else prep.eval_tasks)[:args.tasks]
    task_problems = [p for p in (tasks_problem(prep.train_tasks, "train"), tasks_problem(prep.eval_tasks, "eval")) if p]
    replies = (args.reply or [DEFAULT_REPLY]) if args.policy == "scripted" else None
    import uvloop

    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        try:
            # scripted on the embedded default: its tokenizer only, seconds; the weights are built by the first
            # run that needs them (an engine check or training)
            model_path, _, fmt = runner.run(load_model_format(cfg, tokenizer_only=replies is not None))
        except ConfigError as exc:  # what only the model folder tells (its chat template)
            return input_error(exc)
        print(_intro(args, cfg, model_path, replies, len(tasks), task_problems), file=out, flush=True)
        try:
            played = runner.run(play(cfg, prep, tasks, args.split, model_path, fmt, replies))
            teacher = runner.run(replay_teacher(cfg, prep, model_path, fmt, args.tasks))
        except EngineDidNotStart as exc:
            print(f"check failed: the engine did not start: {exc}", file=out)
            return 1
    color = out.isatty() and "NO_COLOR" not in os.environ
    is_agent = played.is_agent
    trips = [round_trip(ep, fmt, tools, is_agent) for ep, tools in played.episodes]
    shown: dict[str, str] = {}
    for (ep, _), trip in zip(played.episodes, trips):
        print("\n".join(episode_lines(ep, fmt, trip, is_agent, color, shown)), file=out)
    found = problems([ep for ep, _ in played.episodes], trips, task_problems)
    if teacher is not None:
        line, problem = teacher_verdict([ep for ep, _ in teacher.episodes], cfg.model.default.task)
        print(line, file=out)
        found += [problem] if problem else []
    print("\n".join(summary_lines(played, trips, found, prep, cfg, fmt.eos_id, time.perf_counter() - t0)), file=out)
    return 1 if found else 0


if __name__ == "__main__":
    run_and_exit(main)
