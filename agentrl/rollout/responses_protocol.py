"""The Responses API (`POST /v1/responses`) as pure functions over the chat path, so a session's
ledger treats both APIs alike: a request's `instructions` and `input` items become chat messages
(`function_call` items -> the assistant message's `tool_calls`, `function_call_output` -> a tool
message), its flat function tools become chat tools, and a `Reply` becomes output items (a
`message` with one `output_text` part, then one `function_call` per parsed tool call) or, streamed,
Responses' typed events with sequence numbers. Field names follow `openai/types/responses`.

Accepted and honoured: `input`, `instructions`, function `tools`, `temperature`, `top_p`,
`max_output_tokens`, `stream`. Accepted and echoed or ignored, as they change nothing that is
sampled: `model`, `include`, `metadata`, `parallel_tool_calls`, `store` (nothing is stored),
`reasoning`, `truncation`, `user`, `safety_identifier`, `prompt_cache_*`, `service_tier`,
`stream_options`, a tool's `strict`, `text.verbosity`, `tool_choice: "auto"`. Refused by name:
`previous_response_id` and `conversation` (send the whole conversation; the session keeps the
ledger), stored `prompt`s, `background`, structured `text.format`, other `tool_choice`s (sampling
is not constrained), hosted tools, and input that is not text (images, files, reasoning items).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any

from agentrl.rollout.openai_protocol import ChatRequest, Message, ProtocolError, check_tool_choice, new_id, parse_chat

_REFUSED = {
    "previous_response_id": "send the whole conversation as 'input' (the session keeps the ledger)",
    "conversation": "send the whole conversation as 'input' (the session keeps the ledger)",
    "prompt": "stored prompts are not available here; send 'instructions' and 'input'",
    "background": "background responses are not supported",
    "top_logprobs": "top logprobs are not returned by this server",
    "n": "the Responses API has no 'n'; use chat completions outside a session",
}
_TEXT_PARTS = ("input_text", "output_text", "text")


@dataclass
class ResponsesRequest:
    chat: ChatRequest  # what the session plans and samples
    echo: dict[str, Any] = field(default_factory=dict)  # request fields the response object repeats


def _text(content: Any, where: str) -> str:
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise ProtocolError(f"'{where}' must be a string or a list of text parts", where)
    out = []
    for j, part in enumerate(content):
        if not (isinstance(part, dict) and part.get("type") in _TEXT_PARTS and isinstance(part.get("text"), str)):
            kind = part.get("type") if isinstance(part, dict) else type(part).__name__
            raise ProtocolError(f"'{where}[{j}]' is {kind!r}: only text parts ({', '.join(_TEXT_PARTS)}) "
                                "are supported", f"{where}[{j}]")
        out.append(part["text"])
    return "".join(out)


def input_messages(body: dict[str, Any]) -> list[Message]:
    """`instructions` + `input` as chat-completions messages (raw, as a chat request would carry them)."""
    raw = body.get("input")
    items = [{"role": "user", "content": raw}] if isinstance(raw, str) else raw
    if not isinstance(items, list) or not items:
        raise ProtocolError("'input' must be a non-empty string or a non-empty list of items", "input")
    messages: list[Message] = []
    instructions = body.get("instructions")
    if instructions is not None:
        if not isinstance(instructions, str):
            raise ProtocolError("'instructions' must be a string", "instructions")
        messages.append({"role": "system", "content": instructions})
    names: dict[str, str] = {}
    for i, item in enumerate(items):
        where = f"input[{i}]"
        kind = item.get("type", "message") if isinstance(item, dict) else None
        if kind == "message":
            role = item.get("role")
            if role not in ("user", "system", "developer", "assistant"):
                raise ProtocolError(f"'{where}.role' must be user, system, developer or assistant, got {role!r}",
                                    f"{where}.role")
            messages.append({"role": role, "content": _text(item.get("content"), f"{where}.content")})
        elif kind == "function_call":
            call_id, name, args = item.get("call_id"), item.get("name"), item.get("arguments", "{}")
            if not (isinstance(call_id, str) and isinstance(name, str) and isinstance(args, str)):
                raise ProtocolError(f"'{where}' must carry string 'call_id', 'name' and 'arguments'", where)
            names[call_id] = name
            call = {"id": call_id, "type": "function", "function": {"name": name, "arguments": args}}
            # One model turn's items (its text, then its calls) are one assistant message.
            if messages and messages[-1]["role"] == "assistant":
                messages[-1].setdefault("tool_calls", []).append(call)
            else:
                messages.append({"role": "assistant", "content": "", "tool_calls": [call]})
        elif kind == "function_call_output":
            call_id = item.get("call_id")
            if not isinstance(call_id, str):
                raise ProtocolError(f"'{where}.call_id' must be a string", f"{where}.call_id")
            tool = {"role": "tool", "tool_call_id": call_id, "content": _text(item.get("output"), f"{where}.output")}
            if call_id in names:
                tool["name"] = names[call_id]
            messages.append(tool)
        else:
            raise ProtocolError(f"'{where}' is an item of type {kind!r}: only message, function_call and "
                                "function_call_output items are supported", f"{where}.type")
    return messages


def chat_tools(tools: Any) -> list[dict[str, Any]] | None:
    """Flat Responses function tools as chat tools; `strict` is dropped (sampling is not constrained)."""
    if tools is None or tools == []:
        return None
    if not isinstance(tools, list):
        raise ProtocolError("'tools' must be a list", "tools")
    out = []
    for i, t in enumerate(tools):
        if not (isinstance(t, dict) and t.get("type") == "function" and isinstance(t.get("name"), str)):
            kind = t.get("type") if isinstance(t, dict) else None
            raise ProtocolError(f"'tools[{i}]' must be a function tool {{'type': 'function', 'name': ...}}; "
                                f"hosted tools ({kind!r}) are not available here", f"tools[{i}]")
        fn = {k: t[k] for k in ("name", "description", "parameters") if t.get(k) is not None}
        out.append({"type": "function", "function": fn})
    return out


def _check_refused(body: dict[str, Any]) -> None:
    for key, why in _REFUSED.items():
        if body.get(key) not in (None, False):
            raise ProtocolError(f"'{key}' is not supported: {why}", key)
    check_tool_choice(body)
    text = body.get("text") or {}
    fmt = text.get("format") if isinstance(text, dict) else None
    if fmt not in (None, {}) and not (isinstance(fmt, dict) and fmt.get("type") == "text"):
        raise ProtocolError("'text.format' must be {'type': 'text'}: structured output is not supported",
                            "text.format")
    if body.get("max_output_tokens") is not None and body.get("max_tokens") is not None:
        raise ProtocolError("give 'max_output_tokens' only", "max_tokens")


def parse_responses(body: Any) -> ResponsesRequest:
    if not isinstance(body, dict):
        raise ProtocolError("the request body must be a JSON object")
    _check_refused(body)
    chat_body = {"messages": input_messages(body), "tools": chat_tools(body.get("tools")),
                 "stream": bool(body.get("stream", False)), "max_tokens": body.get("max_output_tokens")}
    for key in ("temperature", "top_p"):
        chat_body[key] = body.get(key)
    try:
        chat = parse_chat(chat_body)
    except ProtocolError as exc:  # name the Responses field, not the chat one
        param = {"max_tokens": "max_output_tokens"}.get(exc.param or "", "input")
        raise ProtocolError(str(exc).replace("'max_tokens'", "'max_output_tokens'"), param) from None
    echo = {"instructions": body.get("instructions"), "metadata": body.get("metadata") or {},
            "parallel_tool_calls": body.get("parallel_tool_calls", True), "temperature": body.get("temperature"),
            "top_p": body.get("top_p"), "max_output_tokens": body.get("max_output_tokens"),
            "tool_choice": "auto", "tools": body.get("tools") or [], "user": body.get("user"),
            "text": {"format": {"type": "text"}}, "truncation": "disabled", "store": False, "reasoning": None}
    return ResponsesRequest(chat, echo)


# ---------------------------------------------------------------- output


def message_item(item_id: str, text: str, status: str = "completed") -> dict[str, Any]:
    content = [] if status == "in_progress" else [_part(text)]
    return {"type": "message", "id": item_id, "role": "assistant", "status": status, "content": content}


def _part(text: str) -> dict[str, Any]:
    return {"type": "output_text", "text": text, "annotations": [], "logprobs": []}


def call_item(item_id: str, call_id: str, name: str, args: dict[str, Any], status: str = "completed") -> dict:
    return {"type": "function_call", "id": item_id, "call_id": call_id, "name": name,
            "arguments": "" if status == "in_progress" else json.dumps(args), "status": status}


def output_items(reply: Any) -> list[dict[str, Any]]:
    """A `Reply` as output items: its text (absent when the turn is only tool calls), then its calls."""
    items = [] if reply.content is None and reply.tool_calls else [message_item(new_id("msg", "_"), reply.content or "")]
    return items + [call_item(new_id("fc", "_"), cid, name, args) for cid, name, args in reply.tool_calls]


def response_object(rid: str, model: str, echo: dict[str, Any], output: list[dict[str, Any]],
                    reply: Any = None) -> dict[str, Any]:
    """The response; `reply` None: still in progress. A turn cut at the token budget is `incomplete`."""
    body = {"id": rid, "object": "response", "created_at": time.time(), "model": model, "output": output,
            "status": "in_progress", "error": None, "incomplete_details": None, "usage": None, **echo}
    if reply is not None:
        cut = reply.finish_reason == "length"
        body["status"] = "incomplete" if cut else "completed"
        body["incomplete_details"] = {"reason": "max_output_tokens"} if cut else None
        body["completed_at"] = None if cut else time.time()
        body["usage"] = {"input_tokens": reply.prompt_tokens, "output_tokens": reply.completion_tokens,
                         "total_tokens": reply.prompt_tokens + reply.completion_tokens,
                         "input_tokens_details": {"cached_tokens": 0, "cache_write_tokens": 0},
                         "output_tokens_details": {"reasoning_tokens": 0}}
    return body


class ResponseEvents:
    """The event stream of one response: `text(delta)` as text arrives, `finish(reply)` at the end.
    Leading whitespace is held back, so a turn that is only tool calls opens no message item."""

    def __init__(self, rid: str, model: str, echo: dict[str, Any]) -> None:
        self.rid, self.model, self.echo = rid, model, echo
        self.seq = 0
        self.items: list[dict[str, Any]] = []
        self.msg_id: str | None = None
        self.shown, self.pending = "", ""

    def _event(self, kind: str, **fields: Any) -> dict[str, Any]:
        self.seq += 1
        return {"type": kind, "sequence_number": self.seq - 1, **fields}

    def _start(self) -> list[dict[str, Any]]:
        if self.seq:
            return []
        opening = response_object(self.rid, self.model, self.echo, [])
        return [self._event("response.created", response=opening), self._event("response.in_progress", response=opening)]

    def _open_message(self) -> list[dict[str, Any]]:
        self.msg_id = new_id("msg", "_")
        at = {"item_id": self.msg_id, "output_index": 0}
        return [self._event("response.output_item.added", output_index=0,
                            item=message_item(self.msg_id, "", "in_progress")),
                self._event("response.content_part.added", **at, content_index=0, part=_part(""))]

    def _delta(self, text: str) -> dict[str, Any]:
        self.shown += text
        return self._event("response.output_text.delta", item_id=self.msg_id, output_index=0, content_index=0,
                           delta=text, logprobs=[])

    def text(self, delta: str) -> list[dict[str, Any]]:
        self.pending += delta
        if self.msg_id is None and not self.pending.strip():
            return []
        events = self._start() + ([] if self.msg_id else self._open_message()) + [self._delta(self.pending)]
        self.pending = ""
        return events

    def finish(self, reply: Any) -> list[dict[str, Any]]:
        events = self._start()
        content = reply.content
        if self.msg_id is None and (content is not None or not reply.tool_calls):
            events += self._open_message()
        if self.msg_id is not None:
            rest = (content or "")[len(self.shown):] if (content or "").startswith(self.shown) else ""
            events += [self._delta(rest)] if rest else []
            at = {"item_id": self.msg_id, "output_index": 0, "content_index": 0}
            item = message_item(self.msg_id, self.shown)
            events += [self._event("response.output_text.done", **at, text=self.shown, logprobs=[]),
                       self._event("response.content_part.done", **at, part=_part(self.shown)),
                       self._event("response.output_item.done", output_index=0, item=item)]
            self.items.append(item)
        for cid, name, args in reply.tool_calls:
            events += self._call(call_item(new_id("fc", "_"), cid, name, args))
        done = response_object(self.rid, self.model, self.echo, self.items, reply)
        kind = "response.incomplete" if done["status"] == "incomplete" else "response.completed"
        return events + [self._event(kind, response=done)]

    def _call(self, item: dict[str, Any]) -> list[dict[str, Any]]:
        index = len(self.items)
        at = {"item_id": item["id"], "output_index": index}
        self.items.append(item)
        return [self._event("response.output_item.added", output_index=index, item={**item, "arguments": "",
                                                                                    "status": "in_progress"}),
                self._event("response.function_call_arguments.delta", **at, delta=item["arguments"]),
                self._event("response.function_call_arguments.done", **at, arguments=item["arguments"],
                            name=item["name"]),
                self._event("response.output_item.done", output_index=index, item=item)]
