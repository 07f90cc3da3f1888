"""Anthropic's Messages API (`POST /v1/messages`) as pure functions over the chat path, so a session's
ledger treats it as it treats chat completions: `system` and `messages` (content blocks: `text`,
`tool_use` on the assistant's side, `tool_result` on the user's) become chat messages, tools with an
`input_schema` become chat tools, and a `Reply` becomes a `message` with `text` and `tool_use` blocks
or, streamed, the Messages API's events (`message_start`, `content_block_start`, `content_block_delta`
with `text_delta` / `input_json_delta`, `content_block_stop`, `message_delta`, `message_stop`).
Field names follow the `anthropic` SDK's `types/message_create_params.py`.

Honoured: `model` (echoed), `max_tokens` (required, as in the API), `messages`, `system` (a string or
text blocks), `stop_sequences` (the reply says which one stopped it), `temperature`, `top_p`, `stream`,
`tools` (custom tools), `tool_choice` `{"type": "auto"}`. Accepted as they change nothing sampled:
`metadata`, `service_tier`, `cache_control` on blocks and tools (nothing is cached, so usage reports 0
cache tokens), `thinking` `{"type": "disabled"}`, `disable_parallel_tool_use: false`, `output_config.effort`
(a hint for Anthropic's models' reasoning; the served model has no such setting). A `system` message
inside `messages` (Claude Code sends reminders so) is a system message at that point of the conversation. Refused by name:
`top_k` (the ledger's behaviour logprobs come from the run's top-p sampler), `thinking` enabled,
other `tool_choice`s and `disable_parallel_tool_use: true` (sampling is not constrained), other
`output_config` keys (`format`: structured output is not constrained either), server tools
(`web_search_*`, `bash_*`, `computer_*` ...), `mcp_servers`, `container`, `context_management`, and
content that is not text (images, documents, thinking blocks, citations).

A tool result with `is_error: true` reaches the model as its text after "Error: " (the chat template's
tool message has no error flag), so the flag changes what the model reads, as it does at Anthropic.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from agentrl.rollout.openai_protocol import ChatRequest, Message, ProtocolError, new_id, parse_chat

MAX_STOP_SEQUENCES = 16
ERROR_PREFIX = "Error: "

# Anthropic's error `type` for each HTTP status (https://docs.anthropic.com/en/api/errors).
ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
               404: "not_found_error", 413: "request_too_large", 415: "invalid_request_error",
               429: "rate_limit_error", 500: "api_error", 504: "api_error", 529: "overloaded_error"}

_REFUSED = {
    "top_k": "this server samples with the run's top-p only (the ledger's behaviour logprobs must come from it)",
    "mcp_servers": "MCP servers are not available here; run the tools in the agent",
    "container": "containers are not available here",
    "context_management": "context editing is not available here: the ledger must hold what the model saw",
}
_STOP = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use"}


@dataclass
class MessagesRequest:
    chat: ChatRequest  # what the session plans and samples
    model: str = ""  # echoed in the reply


def error_body(message: str, status: int) -> dict[str, Any]:
    """An error in the Messages API's shape (the SDK reads `error.type` and `error.message`)."""
    return {"type": "error", "error": {"type": ERROR_TYPES.get(status, "api_error"), "message": message}}


def _check(ok: bool, message: str, where: str) -> None:
    if not ok:
        raise ProtocolError(f"{where}: {message}", where)


def _text_blocks(content: Any, where: str, allowed: tuple[str, ...] = ("text",)) -> str:
    """A string, or a list of text blocks, as one text. `cache_control` is accepted (nothing is cached)."""
    if isinstance(content, str):
        return content
    _check(isinstance(content, list), "must be a string or a list of content blocks", where)
    out = []
    for j, block in enumerate(content):
        at = f"{where}.{j}"
        kind = block.get("type") if isinstance(block, dict) else None
        _check(kind in allowed, f"blocks of type {kind!r} are not supported here: only text", f"{at}.type")
        _check(isinstance(block.get("text"), str), "must carry a string 'text'", f"{at}.text")
        _check(not block.get("citations"), "citations are not supported", f"{at}.citations")
        out.append(block["text"])
    return "".join(out)


def _tool_result(block: dict[str, Any], at: str) -> Message:
    call_id = block.get("tool_use_id")
    _check(isinstance(call_id, str) and bool(call_id), "must be the id of an earlier tool_use block", f"{at}.tool_use_id")
    content = block.get("content", "")
    text = _text_blocks(content, f"{at}.content") if content is not None else ""
    is_error = block.get("is_error", False)
    _check(isinstance(is_error, bool), "must be a boolean", f"{at}.is_error")
    return {"role": "tool", "tool_call_id": call_id, "content": ERROR_PREFIX + text if is_error else text}


def _user(content: Any, where: str) -> list[Message]:
    """One user turn: its tool results as tool messages, its text as a user message, in their order."""
    if isinstance(content, str):
        return [{"role": "user", "content": content}]
    _check(isinstance(content, list) and bool(content), "must be a string or a non-empty list of content blocks",
           where)
    out: list[Message] = []
    for j, block in enumerate(content):
        at = f"{where}.{j}"
        kind = block.get("type") if isinstance(block, dict) else None
        if kind == "tool_result":
            out.append(_tool_result(block, at))
        elif kind == "text":
            text = _text_blocks([block], where)
            if out and out[-1]["role"] == "user":  # adjacent text blocks are one message
                out[-1]["content"] += text
            else:
                out.append({"role": "user", "content": text})
        else:
            raise ProtocolError(f"{at}.type: blocks of type {kind!r} are not supported in a user turn: only text "
                                "and tool_result (images, documents and other media are not served here)",
                                f"{at}.type")
    return out


def _assistant(content: Any, where: str) -> Message:
    """One assistant turn: its text blocks joined, its tool_use blocks as OpenAI-shaped tool calls."""
    if isinstance(content, str):
        return {"role": "assistant", "content": content}
    _check(isinstance(content, list), "must be a string or a list of content blocks", where)
    texts, calls = [], []
    for j, block in enumerate(content):
        at = f"{where}.{j}"
        kind = block.get("type") if isinstance(block, dict) else None
        if kind == "text":
            texts.append(_text_blocks([block], where))
        elif kind == "tool_use":
            cid, name, args = block.get("id"), block.get("name"), block.get("input", {})
            _check(isinstance(cid, str) and isinstance(name, str), "must carry string 'id' and 'name'", at)
            _check(isinstance(args, dict), "must be an object", f"{at}.input")
            calls.append({"id": cid, "type": "function", "function": {"name": name, "arguments": args}})
        else:
            raise ProtocolError(f"{at}.type: blocks of type {kind!r} are not supported in an assistant turn: only "
                                "text and tool_use (thinking is not served here)", f"{at}.type")
    message: Message = {"role": "assistant", "content": "".join(texts)}
    if calls:
        message["tool_calls"] = calls
    return message


def chat_messages(body: dict[str, Any]) -> list[Message]:
    """`system` + `messages` as chat-completions messages (raw, as a chat request would carry them)."""
    raw = body.get("messages")
    _check(isinstance(raw, list) and bool(raw), "must be a non-empty list", "messages")
    out: list[Message] = []
    system = body.get("system")
    if system is not None:
        out.append({"role": "system", "content": _text_blocks(system, "system")})
    for i, m in enumerate(raw):
        where = f"messages.{i}"
        role = m.get("role") if isinstance(m, dict) else None
        if role == "user":
            out += _user(m.get("content"), f"{where}.content")
        elif role == "system":  # Claude Code sends reminders this way: the model reads a system message there
            out.append({"role": "system", "content": _text_blocks(m.get("content"), f"{where}.content")})
        elif role == "assistant":
            out.append(_assistant(m.get("content"), f"{where}.content"))
        else:
            raise ProtocolError(f"{where}.role: must be 'user', 'assistant' or 'system', got {role!r}",
                                f"{where}.role")
    return out


def chat_tools(tools: Any) -> list[dict[str, Any]] | None:
    """Custom tools (`name`, `description`, `input_schema`) as chat tools."""
    if tools is None or tools == []:
        return None
    _check(isinstance(tools, list), "must be a list", "tools")
    out = []
    for i, t in enumerate(tools):
        at = f"tools.{i}"
        kind = t.get("type", "custom") if isinstance(t, dict) else None
        _check(kind in ("custom", None), f"server tools ({kind!r}) are not available here: give custom tools with "
               "an 'input_schema' and run them in the agent", f"{at}.type")
        _check(isinstance(t.get("name"), str) and bool(t["name"]), "must carry a string 'name'", f"{at}.name")
        schema = t.get("input_schema")
        _check(isinstance(schema, dict), "must be a JSON schema object", f"{at}.input_schema")
        fn = {"name": t["name"], "parameters": schema}
        if isinstance(t.get("description"), str):
            fn["description"] = t["description"]
        out.append({"type": "function", "function": fn})
    return out


def _check_refused(body: dict[str, Any]) -> None:
    for key, why in _REFUSED.items():
        if body.get(key) not in (None, [], {}):
            raise ProtocolError(f"{key}: not supported: {why}", key)
    output = body.get("output_config")
    if output is not None:
        _check(isinstance(output, dict), "must be an object", "output_config")
        for key in output:
            _check(key == "effort", "not supported: structured output and other output settings are not "
                   "available here (only 'effort', which changes nothing this server samples)", f"output_config.{key}")
    thinking = body.get("thinking")
    if thinking is not None and not (isinstance(thinking, dict) and thinking.get("type") == "disabled"):
        raise ProtocolError("thinking: only {'type': 'disabled'} is supported (the model's turns are sampled as "
                            "they come, with no thinking budget)", "thinking")
    choice = body.get("tool_choice")
    if choice is not None:
        kind = choice.get("type") if isinstance(choice, dict) else None
        _check(kind == "auto", f"{kind!r} is not supported: only {{'type': 'auto'}} (this server does not constrain "
               "sampling, so a forced or forbidden tool call would not be honoured)", "tool_choice")
        _check(choice.get("disable_parallel_tool_use") in (None, False), "true is not supported (sampling is not "
               "constrained: the model may call several tools in a turn)", "tool_choice.disable_parallel_tool_use")


def _stop_sequences(body: dict[str, Any]) -> list[str]:
    stop = body.get("stop_sequences")
    if stop is None:
        return []
    _check(isinstance(stop, list) and len(stop) <= MAX_STOP_SEQUENCES and all(isinstance(s, str) and s for s in stop),
           f"must be a list of at most {MAX_STOP_SEQUENCES} non-empty strings", "stop_sequences")
    return list(stop)


def _number(body: dict[str, Any], key: str, lo: float, hi: float) -> Any:
    value = body.get(key)
    if value is not None:
        _check(isinstance(value, (int, float)) and not isinstance(value, bool) and lo <= value <= hi,
               f"must be a number in [{lo}, {hi}], got {value!r}", key)
    return value


def parse_messages(body: Any) -> MessagesRequest:
    if not isinstance(body, dict):
        raise ProtocolError("the request body must be a JSON object")
    _check_refused(body)
    max_tokens = body.get("max_tokens")
    _check(isinstance(max_tokens, int) and not isinstance(max_tokens, bool) and max_tokens >= 1,
           f"required, an integer >= 1 (got {max_tokens!r})", "max_tokens")
    model = body.get("model", "")
    _check(isinstance(model, str), "must be a string", "model")
    chat_body = {"messages": chat_messages(body), "tools": chat_tools(body.get("tools")),
                 "stream": bool(body.get("stream", False)), "max_tokens": max_tokens,
                 "temperature": _number(body, "temperature", 0.0, 1.0), "top_p": _number(body, "top_p", 0.0, 1.0)}
    try:
        chat = parse_chat(chat_body)
    except ProtocolError as exc:  # name the Messages field, not the chat one (whose indices differ)
        where = "messages"
        if exc.param == "max_tokens":
            where = "max_tokens"
        elif (exc.param or "").startswith(f"messages[{len(chat_body['messages']) - 1}]"):
            where = f"messages.{len(body['messages']) - 1}"  # the last chat message is the last one sent
        raise ProtocolError(f"{where}: {exc}", where) from None
    chat.sampling.stop = _stop_sequences(body)
    return MessagesRequest(chat, model)


# ---------------------------------------------------------------- output


def stop_reason(reply: Any) -> tuple[str, str | None]:
    """(stop_reason, stop_sequence) of a reply."""
    if getattr(reply, "stop_sequence", None):
        return "stop_sequence", reply.stop_sequence
    return _STOP.get(reply.finish_reason, "end_turn"), None


def usage(input_tokens: int, output_tokens: int) -> dict[str, Any]:
    return {"input_tokens": input_tokens, "output_tokens": output_tokens, "cache_creation_input_tokens": 0,
            "cache_read_input_tokens": 0, "server_tool_use": None, "service_tier": "standard"}


def content_blocks(reply: Any) -> list[dict[str, Any]]:
    """A reply's text (absent when the turn is only tool calls), then a tool_use block per parsed call."""
    blocks = [] if reply.content is None and reply.tool_calls else [{"type": "text", "text": reply.content or ""}]
    return blocks + [{"type": "tool_use", "id": cid, "name": name, "input": args} for cid, name, args in reply.tool_calls]


def message(mid: str, model: str, reply: Any) -> dict[str, Any]:
    reason, sequence = stop_reason(reply)
    return {"id": mid, "type": "message", "role": "assistant", "model": model, "content": content_blocks(reply),
            "stop_reason": reason, "stop_sequence": sequence, "usage": usage(reply.prompt_tokens, reply.completion_tokens)}


class MessageEvents:
    """The event stream of one message: `text(delta)` as text arrives, `finish(reply)` at the end.
    Leading whitespace is held back, so a turn that is only tool calls opens no text block (as the
    non-streamed body has none). `input_tokens` is set by the server once the prompt is planned."""

    def __init__(self, mid: str, model: str) -> None:
        self.mid, self.model = mid, model
        self.input_tokens = 0
        self.started = False
        self.index = -1  # the open text block, or -1
        self.shown, self.pending = "", ""
        self.blocks = 0

    def _start(self) -> list[dict[str, Any]]:
        if self.started:
            return []
        self.started = True
        opening = {"id": self.mid, "type": "message", "role": "assistant", "model": self.model, "content": [],
                   "stop_reason": None, "stop_sequence": None, "usage": usage(self.input_tokens, 0)}
        return [{"type": "message_start", "message": opening}, {"type": "ping"}]

    def _open_text(self) -> list[dict[str, Any]]:
        self.index, self.blocks = self.blocks, self.blocks + 1
        return [{"type": "content_block_start", "index": self.index, "content_block": {"type": "text", "text": ""}}]

    def _delta(self, text: str) -> dict[str, Any]:
        self.shown += text
        return {"type": "content_block_delta", "index": self.index, "delta": {"type": "text_delta", "text": text}}

    def text(self, delta: str) -> list[dict[str, Any]]:
        self.pending += delta
        if self.index < 0 and not self.pending.strip():
            return []
        events = self._start() + ([] if self.index >= 0 else self._open_text()) + [self._delta(self.pending)]
        self.pending = ""
        return events

    def finish(self, reply: Any) -> list[dict[str, Any]]:
        events = self._start()
        content = reply.content
        if self.index < 0 and (content is not None or not reply.tool_calls):
            events += self._open_text()
        if self.index >= 0:
            rest = (content or "")[len(self.shown):] if (content or "").startswith(self.shown) else ""
            events += [self._delta(rest)] if rest else []
            events.append({"type": "content_block_stop", "index": self.index})
        for cid, name, args in reply.tool_calls:
            index, self.blocks = self.blocks, self.blocks + 1
            events += [{"type": "content_block_start", "index": index,
                        "content_block": {"type": "tool_use", "id": cid, "name": name, "input": {}}},
                       {"type": "content_block_delta", "index": index,
                        "delta": {"type": "input_json_delta", "partial_json": json.dumps(args)}},
                       {"type": "content_block_stop", "index": index}]
        reason, sequence = stop_reason(reply)
        out = usage(reply.prompt_tokens, reply.completion_tokens)
        return events + [{"type": "message_delta", "delta": {"stop_reason": reason, "stop_sequence": sequence},
                          "usage": {"output_tokens": out["output_tokens"], "input_tokens": out["input_tokens"],
                                    "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0}},
                         {"type": "message_stop"}]


def new_message_id() -> str:
    return new_id("msg", "_")
