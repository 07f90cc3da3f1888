"""Warm-start tasks of the embedded default model: the calculator teacher writes exactly what
CalculatorEnv produces against the reference tool server, the guess_number cache key is unchanged,
and tool-call success is counted per episode, in the pool's step metrics and in the eval summary.
"""

from __future__ import annotations

import asyncio
import random
from collections import Counter

import pytest
from fake_engine import ScriptedEngine

from agentrl.data.chat import ChatFormat, ledger_from_messages
from agentrl.config import DefaultModelConfig, RolloutConfig
from agentrl.models.default import _key, build_tokenizer, demo_source, demonstration_samples
from agentrl.rollout.tools.client import aclose_shared
from agentrl.telemetry.metrics import print_summary
from agentrl.rollout.episode import EpisodeSpec
from agentrl.rollout.pool import EvalResult, RolloutPool, score_episodes
from agentrl.types import Episode
from envs.calculator import DEMO_TASK_KWARGS, CalculatorEnv, demo_tasks, demonstration
from rewards.servers import serve
from rewards.servers.tools import make_app


def test_default_cache_key_is_unchanged_by_the_new_settings_at_their_defaults():
    # Settings added later leave the key as it was while at their defaults (the teacher's code is in the
    # key: tests/test_newcomer_warm_start.py shows an edit of it changes the key).
    base = _key(DefaultModelConfig())
    keys = {_key(DefaultModelConfig(task="calculator")), _key(DefaultModelConfig(split_digits=True)),
            _key(DefaultModelConfig(task="calculator", split_digits=True)), base,
            _key(DefaultModelConfig(demo_max_turns=16))}
    assert len(keys) == 5
    assert _key(DefaultModelConfig(demo_max_turns=None)) == base == _key(DefaultModelConfig(min_start_reward=None))
    assert demo_source("guess_number")[0](3, 0, "demo") == demo_source("guess_number")[0](3, 0, "demo")


def test_calculator_demonstrations_are_imperfect_in_the_documented_proportions():
    rng = random.Random(0)
    kinds = Counter()
    for task in demo_tasks(2000, 0, "demo"):
        msgs = demonstration(task, rng, 0.4)
        assert msgs[0] == {"role": "system", "content": "Tools: calculator, lookup."}
        assert msgs[1]["content"] == f"What is {task['a']} {task['op']} {task['b']}?"
        if len(msgs) == 3:
            kinds["skip"] += 1
        elif msgs[3]["content"].startswith("error:"):
            kinds["syntax"] += 1
        elif msgs[4]["content"] == str(task["answer"]):
            kinds["tool"] += 1
        else:
            kinds["miscopy"] += 1
            assert msgs[4]["content"] == msgs[3]["content"]  # the wrong result is copied faithfully
    assert kinds.keys() == {"tool", "skip", "miscopy", "syntax"}
    assert abs(kinds["tool"] / 2000 - 0.4) < 0.04 and abs(kinds["skip"] / 2000 - 0.3) < 0.04
    assert all(10 <= t["a"] <= 99 and 10 <= t["b"] <= 99 for t in demo_tasks(200, 0, "demo"))


def test_calculator_demonstrations_replay_exactly_through_the_env_and_reference_server(tmp_path):
    """Each demonstration's assistant turns, played by a scripted engine through CalculatorEnv against the
    reference server, give back the demonstration message for message, and the same token ledger."""
    tok = build_tokenizer(DefaultModelConfig(task="calculator", split_digits=True), tmp_path)
    fmt = ChatFormat(tok)
    rng = random.Random(3)
    tasks = demo_tasks(24, 5, "replay")
    demos = [demonstration(t, rng, 0.3) for t in tasks]

    def script(prompt_ids: list[int], index: int) -> str:
        text = tok.decode(prompt_ids)
        i = next(k for k, t in enumerate(tasks) if f"What is {t['a']} {t['op']} {t['b']}?" in text)
        turn = text.count("<|im_start|>assistant") - 1
        return [m["content"] for m in demos[i] if m["role"] == "assistant"][turn]

    async def go():
        try:
            async with serve(make_app()) as url:
                spec = EpisodeSpec(CalculatorEnv, {"tool_url": url, "compact_tools": True, "max_turns": 3}, fmt,
                                   RolloutConfig(max_tokens_per_turn=64, max_turns=3), 512)
                pool = RolloutPool(ScriptedEngine(tok, script), spec)
                episodes = await asyncio.gather(*(pool.episode(t, i) for i, t in enumerate(tasks)))
                return pool, episodes
        finally:
            await aclose_shared()

    pool, episodes = asyncio.run(go())
    for task, demo, ep in zip(tasks, demos, episodes):
        assert ep.status == "ok" and ep.messages == demo
        assert ep.tokens == ledger_from_messages(fmt, demo)[0]
        called_ok = len(demo) == 5 and not demo[3]["content"].startswith("error:")
        assert ep.info["env"]["tool_success"] is called_ok
        assert ep.reward == (1.0 if demo[-1]["content"] == str(task["answer"]) else 0.0)
    rate = sum(e.info["env"]["tool_success"] for e in episodes) / len(episodes)
    assert 0 < rate < 1
    assert pool.tool_stats.metrics()["tools/call_success_rate"] == rate
    assert score_episodes(episodes).tool_call_success_rate == rate


def test_tool_call_success_rate_is_none_without_tool_reports_and_printed_only_with_them(capsys):
    plain = [Episode(task_id="a", group_id=0, reward=1.0), Episode(task_id="b", group_id=0)]
    assert score_episodes(plain).tool_call_success_rate is None
    tooled = [Episode(task_id=str(i), group_id=0, info={"env": {"tool_success": i < 3}}) for i in range(4)]
    tooled.append(Episode(task_id="x", group_id=0, status="env_error", info={"env": {"tool_success": True}}))
    res = score_episodes(tooled)
    assert (res.tool_call_success_rate, res.n, res.failed) == (0.75, 4, {"env_error": 1})
    print_summary({"eval_before": EvalResult(0.1, 0.1, 4).__dict__, "eval_after": EvalResult(0.2, 0.2, 4).__dict__})
    assert "tool-call success" not in capsys.readouterr().out
    print_summary({"eval_before": {**EvalResult(0.1, 0.1, 4).__dict__, "tool_call_success_rate": 0.25},
                   "eval_after": res.__dict__})
    out = capsys.readouterr().out
    assert "tool-call success, warm start" in out and ": 0.250" in out and ": 0.750" in out


@pytest.mark.parametrize("task_kwargs", [DEMO_TASK_KWARGS])
def test_example_config_uses_the_demo_task_ranges(task_kwargs):
    from agentrl.config import load_config

    cfg = load_config("examples/agents/calculator.yaml", [])
    assert cfg.data.task_kwargs == task_kwargs
    assert cfg.model.default.task == "calculator" and cfg.model.default.split_digits
    assert cfg.env.kwargs["compact_tools"] is True
    assert CalculatorEnv.make_tasks(4, 0, "eval", **cfg.data.task_kwargs)[0]["a"] <= 99


def test_warm_start_caps_torch_threads_at_the_usable_cores_and_restores_them(monkeypatch, tmp_path):
    import os

    import torch

    import agentrl.models.default as dm
    import agentrl.learner.dist as dist
    import agentrl.learner.stage as stage
    from agentrl.config import DefaultModelConfig

    assert 1 <= dist.usable_cores() <= (os.cpu_count() or 1)
    seen = {}

    def fake_run_stage(kind, cfg, model_path, train, held_out, tokenizer, *rest, **kw):
        seen.update(threads=torch.get_num_threads(), cfg=cfg, n=len(train), kind=kind.name)

    monkeypatch.setattr(stage, "run_stage", fake_run_stage)
    monkeypatch.setattr(dist, "usable_cores", lambda: 1)
    cfg = DefaultModelConfig(sft_demos=32, sft_steps=10, sft_batch_size=8)
    tokenizer = dm.build_tokenizer(cfg, tmp_path / "tok")
    old = torch.get_num_threads()
    torch.set_num_threads(3)
    try:
        dm.warm_start(tmp_path / "init", tmp_path / "out", tokenizer, cfg)
        assert seen["threads"] == 1 and torch.get_num_threads() == 3  # trained with 1 thread, then restored
    finally:
        torch.set_num_threads(old)
    # One loop, one schedule: the SFT stage with 10 % warmup and cosine decay, as `python -m agentrl.sft`.
    optim = seen["cfg"].optim
    assert (seen["kind"], seen["n"], optim.max_steps, optim.warmup_steps, optim.scheduler) == ("sft", 32, 10, 1, "cosine")
    assert optim.epochs * 32 >= 10 * 8 and optim.lr == cfg.sft_lr and optim.min_lr_ratio == 0.0


def test_a_users_env_module_is_a_warm_start_task_and_its_teacher_replays_through_the_env():
    from agentrl.env import Action, to_messages
    from agentrl.config import load_config
    from agentrl.config.load import ConfigError
    from examples.agents.custom_env import RepeatAfterMeEnv

    make, teach = demo_source("examples.agents.custom_env")
    rng = random.Random(0)
    rewards = []
    for task in make(200, 0, "demo"):
        msgs = teach(task, rng, 0.5)

        async def replay():  # every assistant turn through the env gives back the teacher's next user turn
            env = RepeatAfterMeEnv(retries=1)
            seen, total = to_messages(await env.reset(task)), 0.0
            for i, m in enumerate(msgs):
                if m["role"] == "assistant":
                    res = await env.step(Action(m["content"]))
                    total += res.reward
                    seen += [m] + ([] if res.done else to_messages(res.observation))
                    assert res.done == (i == len(msgs) - 1)
            return seen, total

        seen, total = asyncio.run(replay())
        assert seen == msgs
        rewards.append(total)
    assert 0.2 < sum(rewards) / len(rewards) < 0.8  # imperfect, as a warm start should be
    with pytest.raises(ValueError, match="module envs.quiz has no demo_tasks or demonstration"):
        demo_source("quiz")
    with pytest.raises(ConfigError, match="'quz' is neither a built-in warm-start task"):
        load_config(None, ["model.default.task=quz"])
    assert load_config("examples/agents/custom_env.yaml", []).model.default.task == "examples.agents.custom_env"


def test_arithmetic_teacher_is_right_at_its_rate_and_otherwise_off_by_at_most_three():
    make, teach = demo_source("arithmetic")
    rng, right = random.Random(0), 0
    for task in make(2000, 0, "demo"):
        question, reply = teach(task, rng, 0.4)
        assert question == {"role": "user", "content": f"What is {task['a']} {task['op']} {task['b']}?"}
        off = abs(int(reply["content"]) - task["answer"])
        assert reply["role"] == "assistant" and off <= 3
        right += off == 0
    assert abs(right / 2000 - 0.4) < 0.04


def test_demo_max_turns_lets_guess_number_demonstrations_run_past_four_turns(tmp_path):
    """guess_number's demonstrations stop at 4 guesses unless `demo_max_turns` says otherwise. With 16, the
    imperfect teacher (uniform among the possible numbers 70 % of the time, on 1-15) needs more than 4
    guesses in a good share of episodes (51 of 200 when written), and never more than 16; a task whose
    teacher takes no `max_turns` is refused by name."""
    cfg = DefaultModelConfig(sft_demos=200)
    tok = build_tokenizer(cfg, tmp_path)
    fmt = ChatFormat(tok)
    start = tok.convert_tokens_to_ids("<|im_start|>")

    def turns(c: DefaultModelConfig) -> Counter[int]:
        # user prompt + one <|im_start|> per assistant guess and per feedback reply: guesses = (starts + 1) // 2
        return Counter((s.tokens.count(start) + 1) // 2 for s in demonstration_samples(c, fmt))

    short, long = turns(cfg), turns(cfg.model_copy(update={"demo_max_turns": 16}))
    assert max(short) == 4 and sum(short.values()) == 200
    assert max(long) <= 16 and sum(n for t, n in long.items() if t > 4) >= 20, long
    with pytest.raises(ValueError, match=r"demo_max_turns=16: arithmetic's demonstration"):
        demonstration_samples(DefaultModelConfig(task="arithmetic", demo_max_turns=16), fmt)
