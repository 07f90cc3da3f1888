"""The `prm` reward source: a process reward model trained by the prm stage scores episodes step by step.

A synthetic guess_number PRM dataset is written here: the teacher's `demonstration`s, with some later
guesses swapped for numbers the earlier "Higher." / "Lower." replies already ruled out, and the env's
replies replayed. A step is good iff its guess lies in the interval still consistent with the replies
before it. A PRM is trained on it from the session's default model with `agentrl.stage_cli.run("prm")`
and the saved folder is scored by `rewards.prm.PRMScorer`, directly and as a configured reward source.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import random
from pathlib import Path

import pytest
import torch

from agentrl.config import ConfigError, load_config
from agentrl.config.sources import PRMScorerConfig, PRMSource
from agentrl.config.stages import StageConfig
from agentrl.types import Episode
from envs.guess_number import demo_tasks, demonstration
from rewards.prm import PRMScorer
from rewards.sources import RewardCombiner

LOW, HIGH = 1, 15
TRAIN_ROWS = 600
HELD_OUT = 300


def step_labels(messages: list[dict]) -> list[bool]:
    """Per assistant turn: does its guess lie in the interval still consistent with the earlier replies?
    "Higher." after guess g means target > g, "Lower." target < g; the interval is their intersection
    (lo = max(lo, g + 1), hi = min(hi, g - 1)), so a wrong guess's reply never widens it again."""
    lo, hi, labels = LOW, HIGH, []
    for i, message in enumerate(messages):
        if message["role"] != "assistant":
            continue
        guess = int(message["content"])
        labels.append(lo <= guess <= hi)
        reply = messages[i + 1]["content"] if i + 1 < len(messages) else None
        if reply == "Higher.":
            lo = max(lo, guess + 1)
        elif reply == "Lower.":
            hi = min(hi, guess - 1)
    return labels


def noisy_episode(task: dict, rng: random.Random, swap_prob: float = 0.5) -> list[dict]:
    """A `demonstration` whose later guesses are, with `swap_prob`, replaced by a number outside the
    consistent interval (the teacher's own guesses are always inside it: no bad steps to learn from);
    the env's replies are replayed for the guesses actually made."""
    demo = demonstration(task, rng, 0.3)
    planned = [int(m["content"]) for m in demo if m["role"] == "assistant"]
    lo, hi, target = task["low"], task["high"], task["target"]
    messages = [demo[0]]  # the prompt
    for turn, guess in enumerate(planned):
        outside = [x for x in range(task["low"], task["high"] + 1) if not lo <= x <= hi]
        if turn and outside and rng.random() < swap_prob:
            guess = rng.choice(outside)
        messages.append({"role": "assistant", "content": str(guess)})
        if guess == target or turn == len(planned) - 1:
            break
        lo, hi = (max(lo, guess + 1), hi) if guess < target else (lo, min(hi, guess - 1))
        messages.append({"role": "user", "content": "Higher." if guess < target else "Lower."})
    return messages


def conversations(n: int, split: str) -> list[list[dict]]:
    rng = random.Random(f"{split}:noisy")
    return [noisy_episode(task, rng) for task in demo_tasks(n, 0, split)]


def episode(messages: list[dict]) -> Episode:
    return Episode(task_id="t", group_id=0, messages=messages)


@contextlib.contextmanager
def _one_thread():
    old = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny matmuls: one thread is about as fast and leaves the other core free
    try:
        yield
    finally:
        torch.set_num_threads(old)


@pytest.fixture(scope="module")
def prm_dir(model_dir: str, tmp_path_factory: pytest.TempPathFactory) -> str:
    """A PRM trained for 80 steps on the synthetic rows (a few seconds on an idle 2-core machine)."""
    from agentrl.stage_cli import run

    root = tmp_path_factory.mktemp("prm")
    rows = [{"messages": m, "label": step_labels(m)} for m in conversations(TRAIN_ROWS, "prm-train")]
    (root / "steps.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    cfg = load_config(None, [
        f"model.path={model_dir}", f"data.paths=['{root / 'steps.jsonl'}']", "data.messages_key=messages",
        "data.eval_fraction=0.1", "optim.lr=3e-3", "optim.scheduler=constant", "optim.max_steps=80",
        "optim.epochs=10", "optim.batch_size=16", "optim.micro_batch_size=16", f"train.out_dir={root / 'out'}"],
        StageConfig)
    with _one_thread():
        summary = run("prm", cfg, show=False)
    assert summary["steps"] == 80 and Path(summary["saved"]).is_dir()
    return summary["saved"]


@pytest.fixture(scope="module")
def scorer(prm_dir: str) -> PRMScorer:
    return PRMScorer(PRMScorerConfig(path=prm_dir))


def test_labels_follow_the_consistent_interval():
    messages = [{"role": "user", "content": "Guess my number from 1 to 15."},
                {"role": "assistant", "content": "8"}, {"role": "user", "content": "Higher."},
                {"role": "assistant", "content": "3"}, {"role": "user", "content": "Higher."},
                {"role": "assistant", "content": "6"}, {"role": "user", "content": "Higher."},
                {"role": "assistant", "content": "12"}]
    assert step_labels(messages) == [True, False, False, True]  # 3 and 6 were ruled out by "Higher." after 8
    rows = conversations(200, "prm-train")
    labels = [lab for m in rows for lab in step_labels(m)]
    assert 0.2 < labels.count(False) / len(labels) < 0.5  # both kinds of step are common
    assert conversations(5, "prm-train") == rows[:5]  # deterministic


def _direct_scores(prm_dir: str, messages: list[dict]) -> list[float]:
    """P(good) from a separately loaded model's full logits at the prm_sample positions."""
    from transformers import AutoModelForCausalLM

    from agentrl.data.chat import ChatFormat, load_tokenizer
    from agentrl.data.steps import prm_sample

    fmt = ChatFormat(load_tokenizer(prm_dir))
    model = AutoModelForCausalLM.from_pretrained(prm_dir, local_files_only=True, dtype=torch.float32).eval()
    sample = prm_sample(fmt, messages, None, "test")
    assert [sample.tokens[p] for p in sample.positions] == [fmt.eos_id] * len(sample.positions)
    good, bad = fmt.encode("+")[0], fmt.encode("-")[0]
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([sample.tokens])).logits[0].double()
    return [torch.softmax(logits[p, [good, bad]], -1)[0].item() for p in sample.positions]


def test_step_scores_are_the_reward_token_softmax_at_the_training_positions(prm_dir, scorer):
    for messages in conversations(6, "prm-held-out"):
        result = asyncio.run(scorer(episode(messages)))
        assert result.ok, result.info
        expected = _direct_scores(prm_dir, messages)
        assert len(result.info["step_scores"]) == sum(m["role"] == "assistant" for m in messages)
        assert result.info["step_scores"] == pytest.approx(expected, abs=1e-6)
        assert result.value == pytest.approx(min(expected), abs=1e-6)  # min is the default aggregate


def test_aggregates_are_min_last_and_mean_of_the_step_scores(prm_dir):
    messages = max(conversations(40, "prm-held-out"), key=lambda m: len(set(step_labels(m))) * len(m))
    results = {}
    for aggregate in ("min", "last", "mean"):
        results[aggregate] = asyncio.run(PRMScorer(PRMScorerConfig(path=prm_dir, aggregate=aggregate))(
            episode(messages)))
    steps = results["min"].info["step_scores"]
    assert len(steps) >= 2 and all(r.info["step_scores"] == steps for r in results.values())
    assert results["min"].value == min(steps) and results["last"].value == steps[-1]
    assert results["mean"].value == pytest.approx(sum(steps) / len(steps))
    assert results["last"].info["aggregate"] == "last"


def test_held_out_correct_steps_score_higher_than_wrong_ones(scorer):
    held_out = conversations(HELD_OUT, "prm-held-out")

    async def score_all():  # concurrent calls, as rollouts make them
        return await asyncio.gather(*(scorer(episode(m)) for m in held_out))

    results = asyncio.run(score_all())
    assert all(r.ok for r in results)
    good, bad = [], []
    for messages, result in zip(held_out, results):
        for label, score in zip(step_labels(messages), result.info["step_scores"], strict=True):
            (good if label else bad).append(score)
    mean_good, mean_bad = sum(good) / len(good), sum(bad) / len(bad)
    print(f"held-out steps: {len(good)} correct, mean P(good) {mean_good:.3f}; "
          f"{len(bad)} wrong, mean P(good) {mean_bad:.3f}; margin {mean_good - mean_bad:.3f}")
    assert mean_good > mean_bad + 0.1, (mean_good, mean_bad)


def test_configured_prm_source_scores_through_the_combiner(prm_dir):
    cfg = load_config(None, [f"rewards.sources=[{{name: prm, type: prm, prm: {{path: '{prm_dir}', "
                             f"aggregate: last}}, weight: 2.0}}]"])
    source = cfg.rewards.sources[0]
    assert isinstance(source, PRMSource) and (source.prm.aggregate, source.prm.reward_tokens) == ("last", ["+", "-"])
    combiner = RewardCombiner(cfg.rewards)
    assert isinstance(combiner.sources[0][1], PRMScorer)
    ep = episode(conversations(1, "prm-held-out")[0])
    asyncio.run(combiner.score(ep))
    last = asyncio.run(combiner.sources[0][1](ep)).info["step_scores"][-1]
    assert ep.status == "ok" and ep.reward == pytest.approx(2.0 * last)
    assert ep.info["rewards"]["prm"]["status"] == "ok"


def test_prm_config_errors_are_one_line_and_name_the_key(tmp_path):
    from agentrl.run.startup import prepare

    bad = {
        "{name: p, type: prm, prm: {path: x, aggregate: max}}":
            "invalid config: rewards.sources.0.prm.aggregate: Input should be 'min', 'last' or 'mean'",
        "{name: p, type: prm, prm: {path: x, agregate: min}}":
            "unknown config key 'rewards.sources.0.prm.agregate'; did you mean 'rewards.sources.0.prm.aggregate'?",
        "{name: p, type: prm}": "invalid config: rewards.sources.0.prm: Field required",
    }
    for entry, message in bad.items():
        with pytest.raises(ConfigError) as err:
            load_config(None, [f"rewards.sources=[{entry}]"])
        assert str(err.value) == message
    missing = str(tmp_path / "no-prm")
    cfg = load_config(None, [f"rewards.sources=[{{name: p, type: prm, prm: {{path: '{missing}'}}}}]"])
    with pytest.raises(ConfigError) as err:
        prepare(cfg)  # start-up checks the folder before anything is built
    assert str(err.value) == f"rewards.sources.0.prm.path={missing!r}: no such folder"


def test_a_reward_token_of_several_tokens_is_a_config_error(prm_dir):
    with pytest.raises(ConfigError, match=r"prm\.reward_tokens: 'Higher\.' is \d+ tokens"):
        PRMScorer(PRMScorerConfig(path=prm_dir, reward_tokens=["+", "Higher."]))


def test_unscorable_episodes_are_error_results_never_zero(prm_dir, scorer, monkeypatch):
    cases = {"no messages": [], "no assistant turn": [{"role": "user", "content": "Guess my number from 1 to 15."}]}
    for name, messages in cases.items():
        result = asyncio.run(scorer(episode(messages)))
        assert result.status == "error" and math.isnan(result.value), name
        assert result.info["error"] == "episode has no assistant turn to score"
    messages = conversations(1, "prm-held-out")[0]
    short = asyncio.run(PRMScorer(PRMScorerConfig(path=prm_dir, max_length=8))(episode(messages)))
    assert short.status == "error" and "over prm.max_length=8" in short.info["error"]

    def broken(sample):
        raise RuntimeError("CUDA out of memory")

    monkeypatch.setattr(scorer, "step_scores", broken)
    failed = asyncio.run(scorer(episode(messages)))
    assert failed.status == "error" and math.isnan(failed.value)
    assert failed.info["error"] == "PRM forward failed: RuntimeError: CUDA out of memory"
