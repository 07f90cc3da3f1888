"""`python -m agentrl.check`: the dry run's report against hand-built conversations, its failures
(a broken env, tasks that are not JSON), and one run on the real engine."""

from __future__ import annotations

import io
import os
import re
import sys
from pathlib import Path

import pytest

from agentrl.check import main
from agentrl.data.task_json import json_problem
from agentrl.data.chat import ChatFormat, load_tokenizer
from agentrl.rollout.round_trip import RoundTrip, round_trip
from agentrl.types import Episode, Turn
from envs.guess_number import GuessNumberEnv, prompt_text
import warm_python

ROOT = Path(__file__).resolve().parents[1]
SPAN = re.compile(r"^  (prompt|turn (\d+) (trained|env))\s+(\d+) tok(.*?)\s*\| (.*)$")
MORE = re.compile(r"^ {42}\| (.*)$")  # a span's next line
HEADER = re.compile(r"^=== (episode .*?): (\w+), .*; (\d+) turns?, (\d+) tokens, (\d+) trained$")


def parse(report: str) -> list[dict]:
    """Each episode of a report: its header fields and spans (kind, turn, tokens, extra, text as shown)."""
    episodes: list[dict] = []
    for line in report.splitlines():
        if m := HEADER.match(line):
            episodes.append({"label": m[1], "status": m[2], "turns": int(m[3]), "tokens": int(m[4]),
                             "trained": int(m[5]), "spans": []})
        elif episodes and (m := SPAN.match(line)):
            kind = "prompt" if m[1] == "prompt" else m[3]
            episodes[-1]["spans"].append({"kind": kind, "turn": int(m[2] or 0), "n": int(m[4]), "extra": m[5],
                                          "text": m[6]})
        elif episodes and episodes[-1]["spans"] and (m := MORE.match(line)):
            episodes[-1]["spans"][-1]["text"] += m[1]
    return episodes


def run_check(args: list[str]) -> tuple[int, str]:
    out = io.StringIO()
    return main(args, out=out), out.getvalue()


def guess_number_conversation(target: int, replies: list[str], max_turns: int = 4) -> list[dict]:
    """The default env's conversation for scripted `replies`, played by hand (envs/guess_number.py)."""
    messages = [{"role": "user", "content": prompt_text(1, 15)}]
    for turn in range(1, max_turns + 1):
        reply = replies[(turn - 1) % len(replies)]
        messages.append({"role": "assistant", "content": reply})
        if reply == str(target) or turn == max_turns:
            break
        feedback = "Reply with one number." if not reply.isdigit() else "Higher." if int(reply) < target else "Lower."
        messages.append({"role": "user", "content": feedback})
    return messages


def test_scripted_report_counts_match_the_tokenizer(tiny_model):
    replies = ["7", "no idea, sorry"]
    rc, report = run_check(["--policy", "scripted", "--tasks", "3", "--reply", replies[0], "--reply", replies[1],
                            f"model.path={tiny_model}", "data.train_tasks=16", "data.eval_tasks=4"])
    assert rc == 0, report
    assert report.splitlines()[-1].startswith("check passed")
    tok = load_tokenizer(tiny_model)
    targets = [t["target"] for t in GuessNumberEnv.make_tasks(3, 0, "train")]
    episodes = parse(report)
    assert [e["label"] for e in episodes] == [f"episode {i}.0 (task train-{i})" for i in range(3)]
    for ep, target in zip(episodes, targets):
        messages = guess_number_conversation(target, replies)
        asst = [m["content"] for m in messages if m["role"] == "assistant"]
        trained = [s for s in ep["spans"] if s["kind"] == "trained"]
        assert [s["n"] for s in trained] == [len(tok.encode(a, add_special_tokens=False)) + 1 for a in asst]
        assert [s["text"] for s in trained] == [f"[[{a}<|im_end|>]]" for a in asst]
        ends_open = messages[-1]["role"] != "assistant"
        whole = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=ends_open)
        assert ep["tokens"] == len(tok.encode(whole, add_special_tokens=False)) - (0 if ends_open else 1)  # "\n"
        assert ep["tokens"] == sum(s["n"] for s in ep["spans"])
        assert ep["trained"] == sum(s["n"] for s in trained)
        assert ep["status"] == "ok" and ep["turns"] == len(asst)
        env_steps = [s for s in ep["spans"] if s["kind"] == "env"]
        assert len(env_steps) == len(asst) and all(", step " in s["extra"] and " ms" in s["extra"] for s in env_steps)
    assert "round trip : ok in 3 of 3 compared episodes" in report
    n_turns = sum(e["turns"] for e in episodes)
    assert f"turns      : {n_turns}, 0 cut at rollout.max_tokens_per_turn=16" in report


def test_scripted_reply_cut_at_the_turn_budget_on_the_eval_split(tiny_model):
    rc, report = run_check(["--policy", "scripted", "--split", "eval", "--tasks", "1", "--reply", "no idea, sorry",
                            f"model.path={tiny_model}", "rollout.max_tokens_per_turn=3", "data.eval_tasks=4"])
    assert rc == 0, report
    (ep,) = parse(report)
    assert ep["label"] == "episode eval 0 (task eval-0)" and ep["turns"] == 4
    tok = load_tokenizer(tiny_model)
    first3 = tok.decode(tok.encode("no idea, sorry", add_special_tokens=False)[:3])
    trained = [s for s in ep["spans"] if s["kind"] == "trained"]
    assert [(s["n"], s["extra"], s["text"]) for s in trained] == [(3, " (cut)", f"[[{first3}]]")] * 4
    env = [s for s in ep["spans"] if s["kind"] == "env"][:3]
    assert all(s["text"].startswith("<|im_end|>") for s in env)  # rollout closes a cut turn with EOS (mask 0)
    assert "turns      : 4, 4 cut at rollout.max_tokens_per_turn=3" in report


BROKEN_ENV = '''\
from agentrl.env import Env, StepResult


class BrokenEnv(Env):
    async def reset(self, task):
        raise TypeError("no reset for a task with keys " + ", ".join(sorted(task)))

    async def step(self, action):
        return StepResult(None, 0.0, True)

    @classmethod
    def make_tasks(cls, n, seed, split):
        if split == "train":
            return [{"id": f"{split}-{i}", "pair": (1, 2)} for i in range(n)]
        return [{"id": f"{split}-{i}", "meta": {"tags": [1, {"a"}]}} for i in range(n)]
'''


def test_broken_env_and_tasks_that_are_not_json(tiny_model, tmp_path, monkeypatch):
    (tmp_path / "check_broken_env.py").write_text(BROKEN_ENV)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "check_broken_env", raising=False)
    rc, report = run_check(["--policy", "scripted", "--tasks", "2", f"model.path={tiny_model}",
                            "env.import_path=check_broken_env:BrokenEnv", "data.train_tasks=4", "data.eval_tasks=2"])
    assert rc == 1
    raise_line = next(i for i, line in enumerate(BROKEN_ENV.splitlines(), 1) if "raise TypeError" in line)
    where = f"check_broken_env.py:{raise_line} in reset"
    for i in range(2):
        assert f"=== episode {i}.0 (task train-{i}): env_error, no reward (sources: not scored); 0 turns" in report
        assert f"  error: TypeError: no reset for a task with keys id, pair (at {tmp_path / 'check_broken_env.py'}:" \
               f"{raise_line} in reset)" in report
    assert report.count(f'File "{tmp_path / "check_broken_env.py"}", line {raise_line}, in reset') == 1
    assert report.count("    (the same traceback as episode 0.0 (task train-0))") == 1  # episode 1.0's
    last = report.splitlines()[-1]
    assert last.startswith("check failed: train task 0 (id 'train-0') is not JSON: key 'pair' holds a tuple "
                           "(JSON gives it back as a list); eval task 0 (id 'eval-0') is not JSON: key "
                           "'meta.tags[1]' holds a set, which JSON cannot write; 2 of 2 episodes failed (env_error 2)")
    assert where in last and "task train-0" in last


def test_json_problem_names_the_key():
    assert json_problem({"id": "a", "x": [1, 2.5, None, {"y": True}]}) is None
    assert json_problem({"id": "a", "scores": {3: 1.0}}) == \
        "key 'scores' has the int key 3 (JSON gives it back as a string)"
    assert json_problem({"x": [0.0, float("nan")]}) == "key 'x[1]' holds nan, which is not JSON"


def rolled_out(fmt: ChatFormat, messages: list[dict], sampled: dict[int, list[int]] | None = None) -> Episode:
    """The episode rollout builds for `messages`, as rollout/episode.py's _play does; `sampled[k]`
    replaces turn k's tokens (a turn without EOS was cut at max_tokens: rollout closes it with one)."""
    first = next(i for i, m in enumerate(messages) if m["role"] == "assistant")
    ep = Episode(task_id="t", group_id=0, messages=list(messages))
    ep.append(fmt.initial(messages[:first]), generated=False)
    ep.prompt_len = len(ep.tokens)
    asst = [i for i, m in enumerate(messages) if m["role"] == "assistant"]
    for k, i in enumerate(asst, 1):
        ids = (sampled or {}).get(k) or fmt.assistant_tokens(messages[i]["content"])
        ep.turns.append(Turn(start=len(ep.tokens), n_generated=len(ids), text=messages[i]["content"]))
        ep.append(ids, generated=True)
        after = messages[i + 1:asst[k] if k < len(asst) else len(messages)]
        if after:
            suffix = ([] if ids[-1] == fmt.eos_id else [fmt.eos_id]) + fmt.continuation(after)
            ep.append(suffix, generated=False)
            ep.turns[-1].env_tokens = len(suffix)
    return ep


def test_round_trip_cut_turns_and_a_trimmed_ledger(tiny_tokenizer):
    fmt = ChatFormat(tiny_tokenizer)
    messages = [{"role": "user", "content": "Guess my number from 1 to 15."}, {"role": "assistant", "content": "12"},
                {"role": "user", "content": "Lower."}, {"role": "assistant", "content": "8"}]
    cut = {1: fmt.encode("12"), 2: fmt.encode("8")}  # both turns cut at max_tokens, before their EOS
    assert round_trip(rolled_out(fmt, messages, cut), fmt, None, False) == RoundTrip()
    open_ended = messages + [{"role": "user", "content": "Higher."}]  # out of turns: ends on the env's reply
    ep = rolled_out(fmt, open_ended)
    assert round_trip(ep, fmt, None, False) == RoundTrip()
    for seq in (ep.tokens, ep.loss_mask):
        del seq[-3:]  # trim_to_context
    trimmed = RoundTrip(notes=["compared up to max_model_len, where the ledger was cut"])
    assert round_trip(ep, fmt, None, False) == trimmed
    ep = rolled_out(fmt, messages)
    ep.tokens[-1] = fmt.encode("7")[0]  # turn 2's tokens are not the text the conversation holds
    assert round_trip(ep, fmt, None, False).failure == "turn 2's tokens decode to '87', the conversation holds '8'"


def test_round_trip_finds_the_first_difference(tiny_tokenizer):
    fmt = ChatFormat(tiny_tokenizer)
    messages = [{"role": "user", "content": "Guess my number from 1 to 15."},
                {"role": "assistant", "content": "Higher"},
                {"role": "user", "content": "Reply with one number."}, {"role": "assistant", "content": "8"}]
    assert round_trip(rolled_out(fmt, messages), fmt, None, False).failure == ""
    assert round_trip(rolled_out(fmt, messages), fmt, None, False).notes == []

    by_char = [t for c in "Higher" for t in fmt.encode(c)] + [fmt.eos_id]  # the model's own tokenisation
    assert len(by_char) - 1 > len(fmt.encode("Higher"))
    trip = round_trip(rolled_out(fmt, messages, {1: by_char}), fmt, None, False)
    assert trip.failure == ""
    assert trip.notes == [f"turn 1: the model sampled {len(by_char)} tokens for text the tokenizer writes in "
                          f"{len(fmt.encode('Higher')) + 1}; the ledger keeps the sampled ones"]

    ep = rolled_out(fmt, messages)
    env_start = ep.turns[0].start + ep.turns[0].n_generated
    reply = fmt.encode("Reply")
    at = next(i for i in range(env_start, len(ep.tokens)) if ep.tokens[i:i + len(reply)] == reply)
    answer = fmt.encode("Answer")
    wrong = ep.tokens[:at] + answer + ep.tokens[at + len(reply):]
    ep.tokens, ep.loss_mask = wrong, ep.loss_mask[:at] + [0] * len(answer) + ep.loss_mask[at + len(reply):]
    ep.turns[1].start += len(answer) - len(reply)
    trip = round_trip(ep, fmt, None, False)
    char = len(fmt.tokenizer.decode(wrong[:at]))
    assert trip.failure.startswith(f"the template renders other text than the ledger holds at char {char} (in the "
                                   f"env's reply after turn 1): the ledger has 'Answer with one number.")

    ep = rolled_out(fmt, messages)  # the same text in other tokens: "Reply" one byte at a time
    split = [t for c in "Reply" for t in fmt.encode(c)]
    assert len(split) > len(reply)
    ep.tokens = ep.tokens[:at] + split + ep.tokens[at + len(reply):]
    ep.loss_mask = ep.loss_mask[:at] + [0] * len(split) + ep.loss_mask[at + len(reply):]
    ep.turns[1].start += len(split) - len(reply)
    trip = round_trip(ep, fmt, None, False)
    assert trip.failure.startswith(f"the template's pieces tokenise differently than the whole conversation at token "
                                   f"{at} (in the env's reply after turn 1): the ledger has ")


@pytest.mark.e2e
def test_engine_dry_run(tiny_model):
    """The real engine on an untrained model: every turn's count is what it printed, within the budget."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "NO_COLOR": "1"}
    proc = warm_python.run([sys.executable, "-m", "agentrl.check", "--tasks", "2", f"model.path={tiny_model}",
                           "data.train_tasks=8", "data.eval_tasks=2", "rollout.max_tokens_per_turn=12"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    assert "INFO" not in proc.stdout  # logs go to stderr
    episodes = parse(proc.stdout)
    assert len(episodes) == 2
    for ep in episodes:
        trained = [s for s in ep["spans"] if s["kind"] == "trained"]
        assert len(trained) == ep["turns"] > 0
        assert ep["trained"] == sum(s["n"] for s in trained)
        assert ep["tokens"] == sum(s["n"] for s in ep["spans"])
        for s in trained:
            assert 1 <= s["n"] <= 12
            assert (s["n"] == 12) if "(cut)" in s["extra"] else s["text"].endswith("<|im_end|>]]")
    assert proc.stdout.splitlines()[-1].startswith("check passed")
