"""Chat-template rendering for the token ledger: the first prompt, then only suffixes.

Earlier turns are never re-tokenised. After the model's turn (which ends with the EOS token it
sampled), the env's new messages are rendered with the chat template and only the text that the
template adds after that EOS is tokenised and appended. The suffix is found by rendering a fixed
dummy conversation with and without the new messages, so any Qwen/ChatML-style template works.

That is exact only for an append-only template: rendering more messages must never change text the
ledger already holds, and the pieces must tokenise as the whole conversation does. `ChatFormat`
checks this once at start-up by playing representative conversations the way rollout builds a
ledger (`check_append_only`), and refuses a template that fails with a one-line ValueError naming
what changes (e.g. Qwen3's, which drops <think>...</think> from earlier assistant turns).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from jinja2 import TemplateError

Message = dict[str, Any]

# tokenizer_config classes that mean "tokenizer.json is the whole tokenizer" (what agentrl saves).
_FILE_BACKED = {"PreTrainedTokenizerFast", "TokenizersBackend"}


def load_tokenizer(path: str | Path) -> Any:
    """Load a model folder's tokenizer exactly as it was saved.

    transformers 5 swaps in its own Qwen2 pre-tokenizer for folders whose config says qwen2 (it
    re-splits digits), so a tokenizer saved as a plain tokenizer.json, like the embedded default's,
    would tokenize differently from how the model was trained. Such folders load from the file;
    everything else goes through AutoTokenizer as usual.
    """
    config = Path(path) / "tokenizer_config.json"
    if config.exists() and json.loads(config.read_text()).get("tokenizer_class") in _FILE_BACKED:
        from transformers import PreTrainedTokenizerFast  # 2 s to import where AutoTokenizer takes 10 (2 cores)

        return PreTrainedTokenizerFast.from_pretrained(path)
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path)

_DUMMY = [{"role": "user", "content": "u"}, {"role": "assistant", "content": "a"}]

# Conversations the start-up check plays as rollout would. They hold what real templates render
# differently: no system message first (SmolLM2 and Qwen2.5 insert a default one), reasoning in an
# earlier assistant turn (Qwen3 drops it once a user message follows), tool calls written in the
# assistant's text, tool results (Qwen2.5 folds consecutive ones into one user block) followed by a
# user reply, and a system message with tools (Qwen2.5 writes its tools header only at the start).
_CALL = '<tool_call>\n{"name": "calculator", "arguments": {"expression": "437 * 89"}}\n</tool_call>'
PROBE = [
    {"role": "user", "content": "What is 437 * 89?"},
    {"role": "assistant", "content": "<think>\nToo big to do in my head.\n</think>\n\nAbout 39000."},
    {"role": "user", "content": "Exactly, please."},
    {"role": "assistant", "content": "38893"},
    {"role": "user", "content": "Sure?"},
    {"role": "assistant", "content": "Yes."},
]
PROBE_WITH_TOOLS = [
    {"role": "system", "content": "Use the calculator."},
    {"role": "user", "content": "What is 437 * 89?"},
    {"role": "assistant", "content": "<think>\nToo big.\n</think>\n\n" + _CALL},
    {"role": "tool", "name": "calculator", "content": "38893"},
    {"role": "assistant", "content": _CALL + "\n" + _CALL},
    {"role": "tool", "name": "calculator", "content": "38893"},
    {"role": "tool", "name": "calculator", "content": "38893"},
    {"role": "assistant", "content": "38893"},
    {"role": "user", "content": "Sure?"},
    {"role": "assistant", "content": "Yes."},
]
PROBE_TOOLS = [{"type": "function", "function": {
    "name": "calculator", "description": "Evaluate an arithmetic expression.",
    "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}, "required": ["expression"]}}}]


def common_prefix_len(a: Sequence, b: Sequence) -> int:
    return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))


def _first_change(old: str, new: str) -> str | None:
    """None if `new` extends `old`; otherwise where they part, for an error message."""
    if new.startswith(old):
        return None
    n = common_prefix_len(old, new)
    return f"at char {n}: {old[n:n + 30]!r} became {new[n:n + 30]!r}"


class ChatFormat:
    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self.eos_id: int = tokenizer.eos_token_id
        self.eos_text: str = tokenizer.eos_token
        try:
            base = self.render(_DUMMY, generation_prompt=False)
            if self.eos_text not in base:
                raise ValueError(f"chat template never emits the EOS token {self.eos_text!r} after a turn")
            self._base = base
            # What the template writes between the assistant's EOS and the next message (ChatML: "\n").
            self._after_eos = base[base.rindex(self.eos_text) + len(self.eos_text):]
            # Fail at start-up, not in every episode.
            self.check_append_only(PROBE)
        except TemplateError as exc:  # a ValueError is what start-up reports as a config error
            raise ValueError(f"chat template fails on a plain user/assistant conversation: {exc}") from None
        # Env tools are only known per episode (an env may discover them at reset): a stand-in tool.
        if self._renders(PROBE_WITH_TOOLS, PROBE_TOOLS):
            self.check_append_only(PROBE_WITH_TOOLS, tools=PROBE_TOOLS)

    @property
    def after_eos(self) -> str:
        """What the template writes after an assistant turn's EOS (ChatML: "\n")."""
        return self._after_eos

    def _renders(self, messages: list[Message], tools: list) -> bool:
        """False for templates that reject system or tool messages (Gemma, Mistral v0.1): they can
        still run envs without tools, and an env with tools fails its episodes with the template's error."""
        try:
            self.render(messages, generation_prompt=False, tools=tools)
        except TemplateError:
            return False
        return True

    def check_append_only(self, messages: list[Message], tools: list | None = None) -> None:
        """Raise ValueError unless the ledger rollout builds for `messages` (the first prompt, each
        assistant turn as content + EOS, the env's replies as `continuation` suffixes, rendered without
        tools) is exactly the template's rendering of the whole conversation with `tools`, tokenised once.
        The message names the first text or token that differs."""
        problem = self._text_change(messages, tools) or self._token_change(messages, tools)
        if problem:
            raise ValueError(problem)

    def _text_change(self, messages: list[Message], tools: list | None) -> str | None:
        held = ""  # text up to the latest model turn's EOS: the ledger never re-tokenises it
        for i, message in enumerate(messages):
            if message["role"] == "assistant":
                prompt = self.render(messages[:i], generation_prompt=True, tools=tools)
                if change := _first_change(held, prompt):
                    return f"chat template is not append-only: adding the generation prompt before message {i} " \
                           f"changes earlier text {change}"
                held = prompt + message["content"] + self.eos_text  # what the model wrote, as it wrote it
            if change := _first_change(held, self.render(messages[:i + 1], generation_prompt=False, tools=tools)):
                return f"chat template is not append-only: adding message {i} ({message['role']}) changes " \
                       f"earlier text {change}"
        return None

    def _token_change(self, messages: list[Message], tools: list | None) -> str | None:
        # Same text, other tokens: a BPE merge across the pieces' boundaries, or a special token that
        # swallows the whitespace next to it.
        ledger, _ = ledger_from_messages(self, messages, tools)
        ends_open = messages[-1]["role"] != "assistant"
        whole = self.encode(self.render(messages, generation_prompt=ends_open, tools=tools))
        n = common_prefix_len(ledger, whole)
        if n == len(ledger):
            return None
        decode = self.tokenizer.decode
        return f"chat template text tokenises differently in pieces than at once at token {n}: the ledger has " \
               f"{decode(ledger[n:n + 6])!r}, the whole conversation {decode(whole[n:n + 6])!r}"

    def render(self, messages: list[Message], generation_prompt: bool, tools: list | None = None) -> str:
        kwargs = {"tools": tools} if tools else {}
        return self.tokenizer.apply_chat_template(
            messages, tokenize=False, add_generation_prompt=generation_prompt, **kwargs)

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def initial(self, messages: list[Message], tools: list | None = None) -> list[int]:
        """Tokens of the first prompt, ending with the assistant generation header."""
        return self.encode(self.render(messages, generation_prompt=True, tools=tools))

    def continuation(self, new_messages: list[Message]) -> list[int]:
        """Tokens to append after an assistant turn that ended with EOS: the template's text after
        the EOS, the new messages, and the next assistant generation header. Rendered without tools:
        templates write tools into the first prompt's header only, which the start-up check holds."""
        full = self.render(_DUMMY + list(new_messages), generation_prompt=True)
        if change := _first_change(self._base, full):  # messages of a kind the start-up probes did not have
            roles = ", ".join(m["role"] for m in new_messages)
            raise ValueError(f"chat template is not append-only: adding {roles} messages changes earlier text {change}")
        return self.encode(self._after_eos + full[len(self._base):])

    def assistant_tokens(self, content: str) -> list[int]:
        """Tokens a model would emit for `content` (used for demonstrations): content then EOS."""
        return self.encode(content) + [self.eos_id]


def ledger_from_messages(fmt: ChatFormat, messages: list[Message],
                         tools: list | None = None) -> tuple[list[int], list[int]]:
    """(tokens, loss_mask) for a finished conversation: assistant turns are trained (mask 1),
    everything else is context (mask 0). Mirrors rollout.episode.run_episode's ledger (`tools` go
    into the first prompt, as the env's do there)."""
    first_asst = next(i for i, m in enumerate(messages) if m["role"] == "assistant")
    tokens = fmt.initial(messages[:first_asst], tools=tools)
    mask = [0] * len(tokens)
    i = first_asst
    while i < len(messages):
        turn = fmt.assistant_tokens(messages[i]["content"])
        tokens += turn
        mask += [1] * len(turn)
        j = i + 1
        while j < len(messages) and messages[j]["role"] != "assistant":
            j += 1
        if i + 1 < j or j < len(messages):  # rollout appends a suffix before every later turn, even for no messages
            suffix = fmt.continuation(messages[i + 1:j])
            tokens += suffix
            mask += [0] * len(suffix)
        i = j
    return tokens, mask
