"""Row fields -> (tokens, mask), exactly as rollouts tokenise, so a trained model is trained on the
tokens it will generate and scored on the tokens it is scored on.

A conversation goes through `ledger_from_messages` (the first prompt rendered by the chat template,
each assistant turn as its content + EOS, the rest as suffixes): the ledger an episode builds. A prompt
and a response string become, with `apply_chat_template`, the conversation [user: prompt, assistant:
response]; else the prompt's text (through `input_template` if set) followed by the response's tokens as
the model emits them (`ChatFormat.assistant_tokens`: content then EOS).
"""

from __future__ import annotations

import json
from typing import Any

from jinja2 import TemplateError

from agentrl.data.chat import ChatFormat, ledger_from_messages
from agentrl.config.stages import StageDataConfig
from agentrl.data.errors import DataError
from agentrl.data.rows import Row, field

Tokens = tuple[list[int], list[int]]  # (tokens, mask)


def _without_nulls(value: Any) -> Any:
    """Arrow (parquet, datasets) stores a list of objects as structs with the union of their keys, filling
    the absent ones with null: dropping null values gives back the objects that were written."""
    if isinstance(value, dict):
        return {k: _without_nulls(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_without_nulls(v) for v in value]
    return value


def messages_of(row: Row, key: str) -> list[dict[str, Any]]:
    """The chat messages at `row[key]`: objects with a string role and content, one an assistant's."""
    messages = _without_nulls(field(row, key, (list,), "a list of messages"))
    for i, message in enumerate(messages):
        if not (isinstance(message, dict) and isinstance(message.get("role"), str)
                and isinstance(message.get("content"), str)):
            raise DataError(f"{row.at}: key {key!r} item {i} must be a message, an object with string 'role' "
                            f"and 'content', got {json.dumps(message)[:80]}")
    if not any(m["role"] == "assistant" for m in messages):
        raise DataError(f"{row.at}: key {key!r} has no assistant message to train on (roles: "
                        f"{[m['role'] for m in messages]})")
    return messages


def tools_of(row: Row, cfg: StageDataConfig) -> list[Any] | None:
    """The row's tool schemas (`tools_key`): a list, or a JSON string of one (how datasets often store
    schemas whose shapes differ row to row); None when tools_key is unset or the row has none."""
    if cfg.tools_key is None or row.data.get(cfg.tools_key) is None:
        return None
    tools = field(row, cfg.tools_key, (list, str), "a list of tool schemas (or one as a JSON string)")
    if isinstance(tools, str):
        try:
            tools = json.loads(tools)
        except json.JSONDecodeError as exc:
            raise DataError(f"{row.at}: key {cfg.tools_key!r} is not valid JSON ({exc.msg})") from None
        if not isinstance(tools, list):
            raise DataError(f"{row.at}: key {cfg.tools_key!r} must be a list of tool schemas, got {type(tools).__name__}")
    return _without_nulls(tools) or None


def conversation(fmt: ChatFormat, messages: list[dict[str, Any]], tools: list | None, at: str) -> Tokens:
    """The rollout ledger of a finished conversation: assistant turns trained (mask 1), the rest context.
    A template that cannot render the row is that row's DataError (`at` names it)."""
    try:
        return ledger_from_messages(fmt, messages, tools)
    except (ValueError, TemplateError) as exc:
        raise DataError(f"{at}: the chat template cannot render this conversation: {exc}") from None


def prompt_response(fmt: ChatFormat, cfg: StageDataConfig, prompt: str, response: str, tools: list | None,
                    at: str) -> Tokens:
    """A prompt and a response string, rendered by `apply_chat_template`, `input_template` or as raw text;
    mask 1 on the response (with its EOS) only."""
    if cfg.apply_chat_template:
        messages = [{"role": "user", "content": prompt}, {"role": "assistant", "content": response}]
        return conversation(fmt, messages, tools, at)
    if tools is not None:
        raise DataError(f"{at}: key {cfg.tools_key!r} holds tools, but a prompt string is rendered into the "
                        "first prompt only by the chat template: set data.apply_chat_template")
    head = fmt.encode(template_text(cfg, prompt, at))
    tail = fmt.assistant_tokens(response)
    return head + tail, [0] * len(head) + [1] * len(tail)


def template_text(cfg: StageDataConfig, text: str, at: str) -> str:
    """`input_template` applied to `text` (str.format, as OpenRLHF does), or `text` itself."""
    if cfg.input_template is None:
        return text
    try:
        return cfg.input_template.format(text)
    except (IndexError, KeyError, ValueError) as exc:
        raise DataError(f"{at}: data.input_template {cfg.input_template!r} fails str.format ({exc!r}); "
                        "write literal braces as '{{' and '}}'") from None
