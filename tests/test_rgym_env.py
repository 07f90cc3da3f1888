"""reasoning-gym datasets as an env (envs.rgym): tasks are JSON references to dataset items, scoring is the
dataset's own `score_answer`, later attempts are worth less, and a wrong name fails at start-up."""

from __future__ import annotations

import asyncio
import json

import pytest
import reasoning_gym

from agentrl.env import Action, to_messages
from envs.rgym import ReasoningGymEnv, dataset_and_entry

ARITH = {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1}


def play(task: dict, replies: list[str], **kwargs) -> tuple[list, list]:
    async def run():
        env = ReasoningGymEnv(**kwargs)
        transcript = await env.reset(task)
        results = []
        for reply in replies:
            res = await env.step(Action(reply, [], None))
            results.append(res)
            transcript += to_messages(res.observation)
            if res.done:
                break
        return transcript, results

    return asyncio.run(run())


def test_tasks_are_json_and_name_the_same_items_reasoning_gym_builds():
    tasks = ReasoningGymEnv.make_tasks(6, 3, "train", dataset="basic_arithmetic", config=ARITH)
    assert json.loads(json.dumps(tasks)) == tasks
    assert tasks == ReasoningGymEnv.make_tasks(6, 3, "train", dataset="basic_arithmetic", config=ARITH)
    reference = reasoning_gym.create_dataset("basic_arithmetic", seed=3, size=12, **ARITH)
    for i, task in enumerate(tasks):
        assert task["index"] == 2 * i
        assert dataset_and_entry(task)[1] == reference[2 * i]


def test_train_and_eval_never_share_an_item():
    train = ReasoningGymEnv.make_tasks(20, 0, "train", dataset="basic_arithmetic", config=ARITH)
    held = ReasoningGymEnv.make_tasks(20, 0, "eval", dataset="basic_arithmetic", config=ARITH)
    assert {t["index"] for t in train} == set(range(0, 40, 2))
    assert {t["index"] for t in held} == set(range(1, 40, 2))


def test_right_answer_scores_one_with_the_prompt_reasoning_gym_gives():
    task = ReasoningGymEnv.make_tasks(1, 0, "train", dataset="basic_arithmetic", config=ARITH)[0]
    entry = dataset_and_entry(task)[1]
    transcript, results = play(task, [f"Sure. <answer>{entry['answer']}</answer>"])
    assert transcript[0]["role"] == "system" and "<answer>" in transcript[0]["content"]
    assert transcript[1] == {"role": "user", "content": entry["question"]}
    assert [(r.reward, r.done) for r in results] == [(1.0, True)]
    assert results[0].info == {"success": True, "score": 1.0, "attempts": 1, "tagged": True}


def test_a_bare_reply_is_scored_whole_and_a_second_attempt_is_worth_half():
    task = ReasoningGymEnv.make_tasks(1, 0, "train", dataset="basic_arithmetic", config=ARITH)[0]
    answer = dataset_and_entry(task)[1]["answer"]
    transcript, results = play(task, ["banana", answer], attempts=2, attempt_decay=0.5)
    assert [(r.reward, r.done) for r in results] == [(0.0, False), (0.5, True)]
    assert transcript[-1] == {"role": "user", "content": "That is not right. Try again (1 attempt left)."}
    assert results[1].info == {"success": True, "score": 1.0, "attempts": 2, "tagged": False}
    _, results = play(task, ["banana", "apple", answer], attempts=2)
    assert [(r.reward, r.done) for r in results] == [(0.0, False), (0.0, True)]  # out of attempts


def test_a_name_that_does_not_exist_names_the_nearest_ones():
    with pytest.raises(ValueError, match=r"reasoning-gym dataset 'basic_arithmetc' does not exist; did you mean "
                                         r"'basic_arithmetic'"):
        ReasoningGymEnv.make_tasks(2, 0, "train", dataset="basic_arithmetc")
    with pytest.raises(ValueError, match=r"config of 'basic_arithmetic': key 'max_digit' does not exist; did you "
                                         r"mean 'max_digits'"):
        ReasoningGymEnv.make_tasks(2, 0, "train", dataset="basic_arithmetic", config={"max_digit": 1})
    with pytest.raises(ValueError, match=r"config of 'basic_arithmetic'"):  # a value the dataset rejects
        ReasoningGymEnv.make_tasks(2, 0, "train", dataset="basic_arithmetic", config={"min_terms": 5, "max_terms": 2})


def test_shots_are_solved_items_of_their_own_stream_before_the_question():
    task = ReasoningGymEnv.make_tasks(1, 5, "eval", dataset="basic_arithmetic", config=ARITH)[0]
    transcript, _ = play(task, ["x"], shots=2, system_prompt=None)
    shots = reasoning_gym.create_dataset("basic_arithmetic", seed=5 + 1_000_003, size=2, **ARITH)
    assert transcript == [{"role": "user", "content": shots[0]["question"]},
                          {"role": "assistant", "content": f"<answer>{shots[0]['answer']}</answer>"},
                          {"role": "user", "content": shots[1]["question"]},
                          {"role": "assistant", "content": f"<answer>{shots[1]['answer']}</answer>"},
                          {"role": "user", "content": dataset_and_entry(task)[1]["question"]}]
