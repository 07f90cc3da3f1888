"""The token ledger contract (docs/architecture.md): episodes are built token-in/token-out, append-only.

A scripted fake engine plays GuessNumberEnv against the real (locally trained) tokenizer and its
ChatML-style template, so every expected token list below is spelled out as template text.
"""

from __future__ import annotations

import asyncio
import copy

import pytest
from fake_engine import Reply, ScriptedEngine

from agentrl.data.chat import ChatFormat, ledger_from_messages
from agentrl.config import RolloutConfig
from agentrl.env import Action, Env, StepResult, load_env
from agentrl.rollout.episode import EpisodeSpec, run_episode
from agentrl.types import Turn
from envs.guess_number import demonstration

GuessNumberEnv = load_env("envs.guess_number:GuessNumberEnv")
TASK = {"id": "t7", "low": 1, "high": 15, "target": 11}
PROMPT0 = "<|im_start|>user\nGuess my number from 1 to 15.<|im_end|>\n<|im_start|>assistant\n"


def env_reply(text: str) -> str:
    """What the template adds after the model's EOS for one user message, up to the next assistant header."""
    return f"\n<|im_start|>user\n{text}<|im_end|>\n<|im_start|>assistant\n"


@pytest.fixture
def tok(tiny_tokenizer):
    return tiny_tokenizer


def enc(tok, text: str) -> list[int]:
    return list(tok.encode(text, add_special_tokens=False))


def make_spec(tok, env_cls=GuessNumberEnv, env_kwargs=None, max_model_len=512, **rollout) -> EpisodeSpec:
    return EpisodeSpec(env_cls, env_kwargs or {}, ChatFormat(tok), RolloutConfig(**rollout), max_model_len)


def play(engine, spec, task=TASK, **kw):
    return asyncio.run(asyncio.wait_for(run_episode(task, engine, spec, **kw), timeout=10))


# ---------------------------------------------------------------- ChatFormat


def test_chat_format_renders_known_text(tok):
    fmt = ChatFormat(tok)
    eos = tok.eos_token_id
    assert tok.eos_token == "<|im_end|>"
    assert fmt.eos_id == eos
    first = [{"role": "user", "content": "Guess my number from 1 to 15."}]
    assert fmt.initial(first) == enc(tok, PROMPT0)
    assert fmt.continuation([{"role": "user", "content": "Higher."}]) == enc(tok, env_reply("Higher."))
    assert fmt.assistant_tokens("8") == enc(tok, "8") + [eos]
    two = [{"role": "tool", "content": "a"}, {"role": "user", "content": "b"}]
    assert tok.decode(fmt.continuation(two)) == \
        "\n<|im_start|>tool\na<|im_end|>\n<|im_start|>user\nb<|im_end|>\n<|im_start|>assistant\n"


def test_chat_format_rejects_template_without_eos(tok):
    bad = copy.deepcopy(tok)
    bad.chat_template = "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    with pytest.raises(ValueError, match="never emits the EOS token '<\\|im_end\\|>'"):
        ChatFormat(bad)


def test_chat_format_rejects_template_that_is_not_append_only(tok):
    bad = copy.deepcopy(tok)
    bad.chat_template = "{{ messages | length }}" + tok.chat_template  # a header that depends on later messages
    with pytest.raises(ValueError, match="not append-only"):
        ChatFormat(bad)  # checked once at start-up, not in every episode


# ---------------------------------------------------------------- append-only growth


def test_each_prompt_is_a_prefix_and_earlier_turns_are_never_retokenised(tok):
    one, two, twelve, eos = enc(tok, "1"), enc(tok, "2"), enc(tok, "12"), tok.eos_token_id
    assert len(one) == len(two) == len(twelve) == 1  # "12" is one token; "1","2" is a non-canonical spelling
    engine = ScriptedEngine(tok, ["8", Reply(token_ids=one + two), "11"])
    ep = play(engine, make_spec(tok, env_kwargs={"max_turns": 4}))
    calls = engine.calls
    assert len(calls) == 3
    assert calls[0].prompt_ids == enc(tok, PROMPT0)
    for call in calls:
        assert ep.tokens[:len(call.prompt_ids)] == call.prompt_ids
    for prev, nxt, feedback in zip(calls, calls[1:], ["Higher.", "Lower."]):
        head = prev.prompt_ids + prev.output.token_ids
        assert nxt.prompt_ids[:len(head)] == head
        assert nxt.prompt_ids[len(head):] == enc(tok, env_reply(feedback))
    assert ep.tokens == calls[-1].prompt_ids + calls[-1].output.token_ids
    # The non-canonical "1","2" of turn 2 stays as sampled, in the ledger and in every later prompt;
    # re-encoding the conversation would have produced the single "12" token instead.
    p = len(calls[1].prompt_ids)
    assert ep.tokens[p:p + 3] == one + two + [eos]
    assert calls[2].prompt_ids[p:p + 3] == one + two + [eos]
    assert ep.messages[3] == {"role": "assistant", "content": "12"}
    assert ledger_from_messages(ChatFormat(tok), ep.messages)[0][p:p + 2] == twelve + [eos]


def test_mask_logprobs_and_versions_per_token(tok):
    eos = tok.eos_token_id
    engine = ScriptedEngine(tok, [
        Reply("8", logprobs=[-0.5, -0.0625], versions=[0, 0]),
        Reply("12", logprobs=[-1.5, -0.125], versions=[3, 4]),  # a weight update landed mid-turn
        Reply("11", logprobs=[-2.0, -0.25], versions=[4, 4]),
    ])
    ep = play(engine, make_spec(tok))
    p0, s_hi, s_lo = enc(tok, PROMPT0), enc(tok, env_reply("Higher.")), enc(tok, env_reply("Lower."))
    assert ep.tokens == p0 + enc(tok, "8") + [eos] + s_hi + enc(tok, "12") + [eos] + s_lo + enc(tok, "11") + [eos]
    assert ep.loss_mask == [0] * len(p0) + [1, 1] + [0] * len(s_hi) + [1, 1] + [0] * len(s_lo) + [1, 1]
    assert ep.logprobs == ([0.0] * len(p0) + [-0.5, -0.0625] + [0.0] * len(s_hi) + [-1.5, -0.125]
                           + [0.0] * len(s_lo) + [-2.0, -0.25])
    assert ep.versions == [-1] * len(p0) + [0, 0] + [-1] * len(s_hi) + [3, 4] + [-1] * len(s_lo) + [4, 4]
    assert ep.prompt_len == len(p0)
    assert ep.n_generated == 6
    assert ep.min_version == 0
    a = len(p0)
    b = a + 2 + len(s_hi)
    c = b + 2 + len(s_lo)
    assert ep.turns == [Turn(a, 2, "8", len(s_hi)), Turn(b, 2, "12", len(s_lo)), Turn(c, 2, "11", 0)]


def test_mask_matches_what_the_engine_returned_with_default_fake_values(tok):
    engine = ScriptedEngine(tok, ["3", "9", "I think 11", "11"])
    ep = play(engine, make_spec(tok, env_kwargs={"max_turns": 5}))
    assert len(ep.tokens) == len(ep.loss_mask) == len(ep.logprobs) == len(ep.versions)
    generated = [(t, lp, v) for t, m, lp, v in zip(ep.tokens, ep.loss_mask, ep.logprobs, ep.versions) if m]
    returned = [x for c in engine.calls for x in zip(c.output.token_ids, c.output.logprobs, c.output.versions)]
    assert generated == returned
    assert all(lp == 0.0 and v == -1 for m, lp, v in zip(ep.loss_mask, ep.logprobs, ep.versions) if not m)
    assert ep.min_version == 0 and max(ep.versions) == 3


# ---------------------------------------------------------------- ledger == template rendering


def test_decoded_ledger_equals_template_rendering_of_messages(tok):
    engine = ScriptedEngine(tok, ["8", "12", "hmm", "11"])
    ep = play(engine, make_spec(tok, env_kwargs={"max_turns": 6}))
    assert ep.status == "ok" and ep.success
    assert ep.messages == [
        {"role": "user", "content": "Guess my number from 1 to 15."},
        {"role": "assistant", "content": "8"},
        {"role": "user", "content": "Higher."},
        {"role": "assistant", "content": "12"},
        {"role": "user", "content": "Lower."},
        {"role": "assistant", "content": "hmm"},
        {"role": "user", "content": "Reply with one number."},
        {"role": "assistant", "content": "11"},
    ]
    rendered = tok.apply_chat_template(ep.messages, tokenize=False)
    # The template writes "\n" after the final <|im_end|>; the model stops at the EOS, so the
    # ledger is the rendering minus that trailing newline.
    assert tok.decode(ep.tokens) + "\n" == rendered
    assert rendered.endswith("<|im_start|>assistant\n11<|im_end|>\n")


def test_decoded_ledger_of_truncated_episode_ends_with_generation_prompt(tok):
    engine = ScriptedEngine(tok, ["1", "2"])
    ep = play(engine, make_spec(tok, max_turns=2))
    assert ep.status == "truncated"
    assert tok.decode(ep.tokens) == tok.apply_chat_template(ep.messages, tokenize=False, add_generation_prompt=True)


# ---------------------------------------------------------------- turns cut at max_tokens


def test_turn_cut_at_max_tokens_gets_an_unmasked_eos_before_the_env_reply(tok):
    eos = tok.eos_token_id
    long_ids = enc(tok, "I guess 8 maybe")
    assert len(long_ids) > 3
    engine = ScriptedEngine(tok, ["I guess 8 maybe", "11"])
    ep = play(engine, make_spec(tok, max_tokens_per_turn=3))
    p0, s = enc(tok, PROMPT0), enc(tok, env_reply("Reply with one number."))
    cut = long_ids[:3]
    assert [c.max_tokens for c in engine.calls] == [3, 3]
    assert engine.calls[0].output.token_ids == cut
    assert engine.calls[1].prompt_ids == p0 + cut + [eos] + s
    assert ep.tokens == p0 + cut + [eos] + s + enc(tok, "11") + [eos]
    assert ep.loss_mask == [0] * len(p0) + [1, 1, 1] + [0] + [0] * len(s) + [1, 1]
    lps = engine.calls[0].output.logprobs
    assert ep.logprobs[len(p0):len(p0) + 4] == lps + [0.0]
    assert ep.versions[len(p0):len(p0) + 4] == [0, 0, 0, -1]
    assert ep.messages[1] == {"role": "assistant", "content": tok.decode(cut)}
    assert ep.turns[0].n_generated == 3
    assert ep.turns[1].start == len(p0) + 3 + 1 + len(s)
    assert ep.status == "ok" and ep.success and ep.reward == 1.0
    assert tok.decode(ep.tokens) + "\n" == tok.apply_chat_template(ep.messages, tokenize=False)


def test_final_turn_cut_at_max_tokens_gets_no_eos(tok):
    long_ids = enc(tok, "I guess 8 maybe")
    engine = ScriptedEngine(tok, ["I guess 8 maybe"])
    ep = play(engine, make_spec(tok, env_kwargs={"max_turns": 1}, max_tokens_per_turn=4))
    assert ep.tokens == enc(tok, PROMPT0) + long_ids[:4]
    assert ep.loss_mask[-4:] == [1, 1, 1, 1]
    assert ep.status == "ok" and not ep.success and ep.reward == 0.0


def test_turn_budget_is_capped_by_max_model_len(tok):
    p0, s_hi = enc(tok, PROMPT0), enc(tok, env_reply("Higher."))
    max_len = len(p0) + 2 + len(s_hi) + 1  # room for exactly one token in turn 2
    engine = ScriptedEngine(tok, ["8", "11"])
    ep = play(engine, make_spec(tok, max_model_len=max_len, max_tokens_per_turn=16))
    assert [c.max_tokens for c in engine.calls] == [2 + len(s_hi) + 1, 1]
    assert ep.tokens == p0 + enc(tok, "8") + [tok.eos_token_id] + s_hi + enc(tok, "11")  # "11" cut before its EOS
    assert len(ep.tokens) == max_len
    assert ep.status == "ok" and ep.success  # the env judges the text, which was complete


def test_running_out_of_context_truncates(tok):
    p0, s_hi = enc(tok, PROMPT0), enc(tok, env_reply("Higher."))
    engine = ScriptedEngine(tok, ["8", "9", "11"])
    ep = play(engine, make_spec(tok, max_model_len=len(p0) + 2 + len(s_hi) + 1))
    assert len(engine.calls) == 2  # no third call: no budget left after the env's reply
    assert ep.status == "truncated" and not ep.success and ep.reward == 0.0
    assert ep.trainable


def test_prompt_longer_than_context_truncates_without_generating(tok):
    engine = ScriptedEngine(tok, ["8"])
    ep = play(engine, make_spec(tok, max_model_len=len(enc(tok, PROMPT0))))
    assert engine.calls == []
    assert ep.status == "truncated" and ep.n_generated == 0 and not ep.trainable


# ---------------------------------------------------------------- reward, success, status


def test_successful_game(tok):
    engine = ScriptedEngine(tok, ["8", "12", "11"])
    ep = play(engine, make_spec(tok), group_id=5)
    assert (ep.status, ep.reward, ep.success, ep.error) == ("ok", 1.0, True, "")
    assert (ep.task_id, ep.group_id, ep.info["task"]) == ("t7", 5, TASK)
    assert [t.text for t in ep.turns] == ["8", "12", "11"]
    assert ep.trainable


def test_game_out_of_rollout_turns_is_truncated(tok):
    engine = ScriptedEngine(tok, ["1", "2", "3"])
    ep = play(engine, make_spec(tok, env_kwargs={"max_turns": 4}, max_turns=3))
    assert (ep.status, ep.reward, ep.success, ep.error) == ("truncated", 0.0, False, "")
    assert len(engine.calls) == 3
    assert ep.messages[-1] == {"role": "user", "content": "Higher."}
    assert tok.decode(ep.tokens).endswith(env_reply("Higher."))
    assert ep.trainable


def test_game_lost_when_env_runs_out_of_turns_finishes_ok(tok):
    # The env itself ends the game (done=True) after its max_turns: a finished, lost episode.
    engine = ScriptedEngine(tok, ["1", "2"])
    ep = play(engine, make_spec(tok, env_kwargs={"max_turns": 2}, max_turns=16))
    assert (ep.status, ep.reward, ep.success) == ("ok", 0.0, False)
    assert len(engine.calls) == 2
    assert ep.messages[-1] == {"role": "assistant", "content": "2"}


def test_midgame_task_replays_its_history_as_context_and_has_spent_those_turns(tok):
    # History 3 then 13 (target 11): the prompt holds both guesses and replies, untrained (mask 0);
    # found at the model's second guess = game turn 4, so the 1/16 penalty takes 3/16.
    task = {**TASK, "history": [3, 13]}
    engine = ScriptedEngine(tok, ["9", "11"])
    ep = play(engine, make_spec(tok, env_kwargs={"max_turns": 16, "turn_penalty": 1 / 16}), task=task)
    assert (ep.status, ep.reward, ep.success, ep.info["env"]["turns"]) == ("ok", 1 - 3 / 16, True, 4)
    prompt = ("<|im_start|>user\nGuess my number from 1 to 15.<|im_end|>\n<|im_start|>assistant\n3<|im_end|>\n"
              "<|im_start|>user\nHigher.<|im_end|>\n<|im_start|>assistant\n13<|im_end|>\n"
              "<|im_start|>user\nLower.<|im_end|>\n<|im_start|>assistant\n")
    assert ep.tokens[:ep.prompt_len] == enc(tok, prompt) and not any(ep.loss_mask[:ep.prompt_len])
    assert [t.text for t in ep.turns] == ["9", "11"]
    # the history's turns count against max_turns: 2 spent of 3 leaves one guess
    engine = ScriptedEngine(tok, ["9", "10"])
    ep = play(engine, make_spec(tok, env_kwargs={"max_turns": 3}), task=task)
    assert (ep.status, ep.reward, len(engine.calls)) == ("ok", 0.0, 1)


@pytest.mark.parametrize("history, why", [([3, 5, 7, 9], "leaves no turn of max_turns=4"),
                                           ([11], "must hold wrong integer guesses"),
                                           (["3"], "must hold wrong integer guesses")])
def test_bad_midgame_history_ends_the_episode_as_an_env_error_naming_the_task(tok, history, why):
    ep = play(ScriptedEngine(tok, ["1"]), make_spec(tok), task={**TASK, "history": history})
    assert ep.status == "env_error" and "task t7" in ep.error and why in ep.error and not ep.trainable


def test_range_penalty_is_paid_for_each_guess_the_replies_ruled_out_or_no_number(tok):
    # target 11, history [3] leaves 4..15 open: 2 (ruled out), 13 (in range), 14 (ruled out by 13),
    # "x" (no number), 12 (in range), then 11 found at game turn 7 with penalty 1/16.
    task = {**TASK, "history": [3], "range_penalty": 0.25}
    engine = ScriptedEngine(tok, ["2", "13", "14", "x", "12", "11"])
    ep = play(engine, make_spec(tok, env_kwargs={"max_turns": 16, "turn_penalty": 1 / 16}), task=task)
    assert ep.success and ep.reward == pytest.approx(1 - 6 / 16 - 3 * 0.25, abs=1e-12)
    # a task without the key (every held-out task) pays nothing for the same guesses
    engine = ScriptedEngine(tok, ["2", "13", "14", "x", "12", "11"])
    spec = make_spec(tok, env_kwargs={"max_turns": 16, "turn_penalty": 1 / 16})
    ep = play(engine, spec, task={**TASK, "history": [3]})
    assert ep.reward == pytest.approx(1 - 6 / 16, abs=1e-12)
    train = GuessNumberEnv.make_tasks(20, 1, "train", range_penalty=0.25)
    assert all(t["range_penalty"] == 0.25 for t in train)
    assert GuessNumberEnv.make_tasks(20, 1, "eval", range_penalty=0.25) == GuessNumberEnv.make_tasks(20, 1, "eval")


def test_midgame_share_is_for_training_tasks_only_and_keeps_their_targets():
    plain = GuessNumberEnv.make_tasks(2000, 3, "train")
    mid = GuessNumberEnv.make_tasks(2000, 3, "train", midgame=0.25, midgame_turns=5)
    assert [t["target"] for t in mid] == [t["target"] for t in plain]
    histories = [t["history"] for t in mid if "history" in t]
    # 2000 draws at p=0.25: sd = sqrt(2000 * 0.25 * 0.75) = 19.4, so 500 +- 5 sd
    assert abs(len(histories) - 500) < 97
    assert {len(h) for h in histories} == {1, 2, 3, 4, 5}
    assert all(g != t["target"] and 1 <= g <= 15 for t in mid for g in t.get("history", []))
    assert GuessNumberEnv.make_tasks(50, 3, "eval", midgame=1.0) == GuessNumberEnv.make_tasks(50, 3, "eval")
    with pytest.raises(ValueError, match="midgame must be in"):
        GuessNumberEnv.make_tasks(5, 3, "train", midgame=1.5)


class StepRewardEnv(Env):
    """Pays 0.25, 0.5, 1.25 over three steps; says success only on the first step."""

    async def reset(self, task):
        self.n = 0
        return "go"

    async def step(self, action: Action) -> StepResult:
        self.n += 1
        reward = {1: 0.25, 2: 0.5, 3: 1.25}[self.n]
        info = {"success": True} if self.n == 1 else {}
        return StepResult("more", reward, self.n == 3, info)


def test_episode_reward_sums_step_rewards_and_success_persists(tok):
    engine = ScriptedEngine(tok, ["a", "b", "c"])
    ep = play(engine, make_spec(tok, env_cls=StepRewardEnv))
    assert ep.reward == 2.0
    assert ep.success is True  # later steps did not report "success", so the earlier value stands
    assert ep.messages[0] == {"role": "user", "content": "go"}


def test_sampling_arguments_and_per_turn_seeds(tok):
    engine = ScriptedEngine(tok, ["8", "12", "11"])
    play(engine, make_spec(tok, temperature=0.7, top_p=0.9), seed=3)
    assert [(c.temperature, c.top_p, c.seed) for c in engine.calls] == [(0.7, 0.9, 3000), (0.7, 0.9, 3001),
                                                                        (0.7, 0.9, 3002)]
    engine = ScriptedEngine(tok, ["8", "12", "11"])
    play(engine, make_spec(tok))
    assert [c.seed for c in engine.calls] == [None, None, None]


# ---------------------------------------------------------------- SFT uses the same ledger


@pytest.mark.parametrize("script, rollout", [
    (["8", "12", "11"], {}),  # success, ends with the model's EOS
    (["1", "x", "3"], {"max_turns": 3}),  # truncated, ends with the env's reply and the generation header
])
def test_sft_ledger_matches_rollout_ledger(tok, script, rollout):
    engine = ScriptedEngine(tok, script)
    spec = make_spec(tok, **rollout)
    ep = play(engine, spec)
    tokens, mask = ledger_from_messages(spec.fmt, ep.messages)
    assert tokens == ep.tokens
    assert mask == ep.loss_mask


def test_sft_ledger_of_demonstrations_renders_the_template(tok):
    import random

    fmt = ChatFormat(tok)
    rng = random.Random(0)
    for task in GuessNumberEnv.make_tasks(20, 0, "demo"):
        msgs = demonstration(task, rng, 0.3)
        tokens, mask = ledger_from_messages(fmt, msgs)
        assert tok.decode(tokens) + "\n" == tok.apply_chat_template(msgs, tokenize=False)
        trained = [t for t, m in zip(tokens, mask) if m]
        expected = [t for m in msgs if m["role"] == "assistant" for t in fmt.assistant_tokens(m["content"])]
        assert trained == expected


def test_saved_default_tokenizer_reloads_with_identical_tokens(tok, tmp_path):
    """A model folder's tokenizer must tokenize as the one the warm start used (transformers 5
    would otherwise substitute Qwen2's digit-splitting pre-tokenizer for a qwen2 folder)."""
    from agentrl.data.chat import load_tokenizer

    tok.save_pretrained(tmp_path)
    (tmp_path / "config.json").write_text('{"model_type": "qwen2"}')
    text = tok.apply_chat_template([{"role": "user", "content": "Guess my number from 1 to 15."},
                                    {"role": "assistant", "content": "12"}], tokenize=False)
    reloaded = load_tokenizer(tmp_path)
    assert reloaded.encode(text, add_special_tokens=False) == tok.encode(text, add_special_tokens=False)
