"""Reward-model training (agentrl.learner.reward_training) on synthetic guess_number preferences.

A small embedded default model is built and warm-started, a reward model is trained from it on
(found the number, ran out of turns) episode pairs, and the saved folder is scored with the real
`RewardModelScorer`. A guess_number episode's messages never say whether the last guess was right,
so no scorer ranks every pair: the Bayes-optimal one (`_oracle`) scores an episode that ended before
the last turn as a success, and otherwise P(success) = 1 / (numbers still consistent with the
feedback). A scorer that only counts turns ranks the pairs whose success ended early and flips a coin
on the rest; the checks below separate the two.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math

import pytest
import torch

from agentrl.env import Action, to_messages
from agentrl.learner.reward_training import (RewardTrainingConfig, bradley_terry_loss, encode, main, read_pairs,
                                     sequence_scores, train_reward_model)
from agentrl.types import Episode
from envs.guess_number import GuessNumberEnv, preference_pairs
from rewards.reward_model import RewardModelConfig, RewardModelScorer

N_PAIRS = 800
TRAIN = RewardTrainingConfig(lr=2e-3, steps=250, batch_size=32, eval_frac=0.25, seed=0)


@contextlib.contextmanager
def _one_thread():
    old = torch.get_num_threads()
    torch.set_num_threads(1)  # tiny matmuls: one thread is fastest and leaves the other core free
    try:
        yield
    finally:
        torch.set_num_threads(old)


def _turns(messages) -> int:
    return sum(m["role"] == "assistant" for m in messages)


def _oracle(messages, low: int = 1, high: int = 15, max_turns: int = 4) -> float:
    """P(the episode found the number | its messages), target uniform on the consistent range."""
    guesses = [int(m["content"]) for m in messages if m["role"] == "assistant"]
    if len(guesses) < max_turns:
        return 1.0  # the env ends an episode early only on a correct guess
    for guess, reply in zip(guesses, [m["content"] for m in messages if m["role"] == "user"][1:]):
        low, high = (max(low, guess + 1), high) if reply == "Higher." else (low, min(high, guess - 1))
    return 1.0 / (high - low + 1) if low <= guesses[-1] <= high else 0.0


async def _replay(task, messages) -> tuple[list[dict], float]:
    """The messages and total reward `rollout` records when a policy says the assistant turns."""
    env = GuessNumberEnv()
    recorded, reward = to_messages(await env.reset(task)), 0.0
    for turn in (m["content"] for m in messages if m["role"] == "assistant"):
        recorded.append({"role": "assistant", "content": turn})
        result = await env.step(Action(turn))
        reward += result.reward
        if result.done:
            break
        recorded += to_messages(result.observation)
    return recorded, reward


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory):
    """(base model folder, reward-model folder, metrics, the eval pairs train_reward_model held out)."""
    import random

    from agentrl.config import DefaultModelConfig
    from agentrl.default_model import ensure_default_model

    root = tmp_path_factory.mktemp("rm")
    pairs = preference_pairs(N_PAIRS, seed=0)
    with _one_thread():
        base = ensure_default_model(DefaultModelConfig(
            hidden_size=64, num_layers=2, intermediate_size=128, sft_steps=40, sft_demos=400, cache_dir=str(root)))
        metrics = train_reward_model(base, pairs, root / "rm", TRAIN)
    held_out = list(pairs)
    random.Random(TRAIN.seed).shuffle(held_out)
    return base, root / "rm", metrics, held_out[:math.ceil(TRAIN.eval_frac * N_PAIRS)]


def test_pairs_are_what_rollout_records_and_the_env_rewards():
    tasks = GuessNumberEnv.make_tasks(60, 0, "preferences")
    pairs = preference_pairs(60, seed=0)
    assert pairs == preference_pairs(60, seed=0)  # deterministic
    for task, (chosen, rejected) in zip(tasks, pairs):
        for messages, reward in ((chosen, 1.0), (rejected, 0.0)):
            assert asyncio.run(_replay(task, messages)) == (messages, reward)
    # Some successes take every turn: episode length alone cannot separate the pairs.
    assert any(_turns(c) == 4 for c, _ in pairs)


def test_bradley_terry_loss_matches_the_formula():
    r_chosen, r_rejected = torch.tensor([2.0, -0.5]), torch.tensor([0.5, 1.0])
    expected = (math.log(1 + math.exp(-1.5)) + math.log(1 + math.exp(1.5))) / 2  # -log sigmoid(d) = log(1+e^-d)
    assert abs(bradley_terry_loss(r_chosen, r_rejected).item() - expected) < 1e-6
    assert abs(bradley_terry_loss(torch.zeros(3), torch.zeros(3)).item() - math.log(2)) < 1e-6


def _score_all(path, episodes, **overrides):
    async def main_():
        async with RewardModelScorer(RewardModelConfig(path=str(path), **overrides)) as scorer:
            results = await asyncio.gather(*(scorer(Episode(task_id="t", group_id=0, messages=m)) for m in episodes))
            return scorer, results

    return asyncio.run(main_())


@pytest.fixture(scope="module")
def scored(trained):
    """(scorer on the saved folder, its results for the held-out chosen episodes, then rejected ones)."""
    held_out = trained[3]
    episodes = [c for c, _ in held_out] + [r for _, r in held_out]
    scorer, results = _score_all(trained[1], episodes, max_batch_size=64)
    return scorer, results[:len(held_out)], results[len(held_out):]


def test_held_out_ranking_reads_the_feedback_not_only_the_length(trained, scored):
    _, _, metrics, held_out = trained
    _, chosen, rejected = scored
    wins: dict[str, list[bool]] = {"ended early": [], "forced": [], "other": []}
    for (c, r), rc, rr in zip(held_out, chosen, rejected):
        kind = "ended early" if _turns(c) < 4 else "forced" if _oracle(c) == 1.0 else "other"
        wins[kind].append(rc.value > rr.value)
    odds = [(_oracle(c), _oracle(r)) for c, r in held_out]
    oracle = sum((c > r) + 0.5 * (c == r) for c, r in odds) / len(odds)  # ties: a coin flip
    turns_only = (len(wins["ended early"]) + 0.5 * (len(wins["forced"]) + len(wins["other"]))) / len(held_out)
    report = (metrics, {k: (len(v), sum(v) / len(v)) for k, v in wins.items()}, oracle, turns_only)
    assert metrics["eval_pairs"] == len(held_out) and metrics["train_pairs"] == N_PAIRS - len(held_out)
    assert all(wins["ended early"]), report
    # Both took every turn, the last guess the only one left: a turn counter gets 0.5 here.
    assert sum(wins["forced"]) / len(wins["forced"]) >= 0.7, report
    assert metrics["eval_accuracy"] >= max(0.85, oracle - 0.08), report
    assert metrics["train_loss"] < 0.35 and metrics["eval_loss"] < 0.35, report


def test_the_scorer_sees_what_training_saw_and_ranks_successes_higher(trained, scored):
    _, _, metrics, held_out = trained
    scorer, chosen, rejected = scored
    assert all(r.ok for r in chosen + rejected)
    values_c, values_r = [r.value for r in chosen], [r.value for r in rejected]
    assert sum(values_c) / len(values_c) > sum(values_r) / len(values_r) + 1.0
    episodes = [c for c, _ in held_out] + [r for _, r in held_out]
    with torch.no_grad():
        trained_scores = sequence_scores(scorer.model, *scorer.pad_right([encode(scorer, m) for m in episodes]))
    assert torch.allclose(torch.tensor(values_c + values_r), trained_scores, atol=1e-4)
    wins = sum(c > r for c, r in zip(values_c, values_r)) / len(held_out)
    assert abs(wins - metrics["eval_accuracy"]) <= 1 / len(held_out)  # a near-tie may flip with padding


def test_long_episodes_are_cut_on_the_left_as_the_scorer_cuts_them(trained):
    _, path, _, held_out = trained
    messages = held_out[0][1]
    scorer, (result,) = _score_all(path, [messages], max_length=12)
    full = scorer.tokenizer(scorer.render(messages), add_special_tokens=False)["input_ids"]
    assert len(full) > 12 and encode(scorer, messages) == full[-12:] and result.info["truncated"]
    with torch.no_grad():
        expected = sequence_scores(scorer.model, *scorer.pad_right([full[-12:]])).item()
    assert abs(result.value - expected) < 1e-5


def test_cli_reads_jsonl_and_saves_a_loadable_model(trained, tmp_path):
    base, _, _, held_out = trained
    pairs_file = tmp_path / "pairs.jsonl"
    pairs_file.write_text("".join(json.dumps({"chosen": c, "rejected": r}) + "\n" for c, r in held_out[:8]))
    assert read_pairs(pairs_file) == [tuple(p) for p in held_out[:8]]
    with _one_thread():
        metrics = main(["--base", str(base), "--pairs", str(pairs_file), "--out", str(tmp_path / "out"),
                        "--steps", "2", "--batch-size", "4", "--eval-frac", "0.25"])
    assert metrics["eval_pairs"] == 2 and metrics["train_pairs"] == 6 and math.isfinite(metrics["train_loss"])
    saved = json.loads((tmp_path / "out" / "reward_training.json").read_text())
    assert saved["config"]["steps"] == 2
    RewardModelScorer(RewardModelConfig(path=str(tmp_path / "out")))  # loads: one-output linear head


def test_config_rejects_unknown_keys_and_bad_bounds():
    from pydantic import ValidationError

    for bad in ({"stepz": 3}, {"steps": 0}, {"eval_frac": 1.0}, {"lr": 0.0}):
        with pytest.raises(ValidationError):
            RewardTrainingConfig(**bad)
