"""The OpenAI wire format, as pure functions: request bodies in (checked field by field, so a
malformed body is a 400 naming the field), response and stream-chunk bodies out, errors in OpenAI's
shape (`{"error": {"message", "type", "param", "code"}}`).

Only what agentrl can honour exactly is accepted: `logit_bias` and similar fields are refused by
name rather than silently ignored, and `n` > 1 only outside a session (a ledger holds one sample).
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

Message = dict[str, Any]

_ROLES = ("system", "developer", "user", "assistant", "tool")
# Refused by name: honouring them would change what was sampled (or how many samples there are).
_UNSUPPORTED = ("logit_bias", "echo", "suffix", "response_format")
MAX_N = 16


class ProtocolError(ValueError):
    """A request agentrl refuses; `status` is the HTTP status, `param` the offending field."""

    def __init__(self, message: str, param: str | None = None, status: int = 400, code: str | None = None,
                 kind: str = "invalid_request_error") -> None:
        super().__init__(message)
        self.param, self.status, self.code, self.kind = param, status, code, kind


def error_body(message: str, kind: str = "invalid_request_error", param: str | None = None,
               code: str | None = None) -> dict[str, Any]:
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


@dataclass
class Sampling:
    """What a request asks of the sampler; None means the server's default."""

    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    seed: int | None = None
    stop: list[str] = field(default_factory=list)
    n: int = 1  # choices, each its own sample: only outside a session


@dataclass
class ChatRequest:
    messages: list[Message]
    tools: list[dict[str, Any]] | None
    sampling: Sampling
    stream: bool = False


@dataclass
class CompletionRequest:
    prompt: str | list[int]
    sampling: Sampling
    stream: bool = False


def _number(body: dict, key: str, lo: float, hi: float, integer: bool = False) -> Any:
    value = body.get(key)
    if value is None:
        return None
    ok = isinstance(value, int) if integer else isinstance(value, (int, float))
    if isinstance(value, bool) or not ok or not lo <= value <= hi:
        kind = "an integer" if integer else "a number"
        raise ProtocolError(f"'{key}' must be {kind} in [{lo}, {hi}], got {value!r}", key)
    return value


def check_tool_choice(body: dict) -> None:
    """Forcing a tool (`"required"`, a named function) or forbidding one (`"none"`) would need constrained
    sampling, and the ledger must hold what the model sampled from its own distribution (the loss's
    behaviour log-probabilities): refused by name on both APIs rather than ignored, so an agent
    framework that forces a tool for structured output learns at once that it is not honoured here."""
    if body.get("tool_choice") not in (None, "auto"):
        raise ProtocolError(f"'tool_choice' {body.get('tool_choice')!r} is not supported: only 'auto' (this server "
                            "does not constrain sampling, so a forced or forbidden tool call would not be honoured)",
                            "tool_choice")


def _sampling(body: dict) -> Sampling:
    if body.get("best_of", 1) not in (None, 1):
        raise ProtocolError("'best_of' must be 1", "best_of")
    for key in _UNSUPPORTED:
        if body.get(key):
            raise ProtocolError(f"'{key}' is not supported by this server", key)
    max_tokens = body.get("max_completion_tokens", body.get("max_tokens"))
    stop = body.get("stop")
    if isinstance(stop, str):
        stop = [stop]
    if stop is not None and not (isinstance(stop, list) and len(stop) <= 4
                                 and all(isinstance(s, str) and s for s in stop)):
        raise ProtocolError("'stop' must be a non-empty string or a list of at most 4 of them", "stop")
    return Sampling(
        max_tokens=_number({"max_tokens": max_tokens}, "max_tokens", 1, 1 << 20, integer=True),
        temperature=_number(body, "temperature", 0.0, 2.0), top_p=_number(body, "top_p", 0.0, 1.0),
        seed=_number(body, "seed", -(1 << 63), (1 << 63) - 1, integer=True), stop=list(stop or []),
        n=_number(body, "n", 1, MAX_N, integer=True) or 1)


def content_text(content: Any, param: str) -> str:
    """A message's content as text: a string, None, or a list of text parts."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for j, part in enumerate(content):
            if not (isinstance(part, dict) and part.get("type") == "text" and isinstance(part.get("text"), str)):
                raise ProtocolError(f"'{param}[{j}]' must be a text part {{'type': 'text', 'text': ...}}", f"{param}[{j}]")
            parts.append(part["text"])
        return "".join(parts)
    raise ProtocolError(f"'{param}' must be a string, a list of text parts or null", param)


def _message(m: Any, i: int) -> Message:
    where = f"messages[{i}]"
    if not isinstance(m, dict):
        raise ProtocolError(f"'{where}' must be an object", where)
    role = m.get("role")
    if role not in _ROLES:
        raise ProtocolError(f"'{where}.role' must be one of {list(_ROLES)}, got {role!r}", f"{where}.role")
    out: Message = {"role": "system" if role == "developer" else role,
                    "content": content_text(m.get("content"), f"{where}.content")}
    calls = m.get("tool_calls")
    if calls:
        if role != "assistant" or not isinstance(calls, list):
            raise ProtocolError(f"'{where}.tool_calls' must be a list on an assistant message", f"{where}.tool_calls")
        out["tool_calls"] = [_tool_call(c, f"{where}.tool_calls[{j}]") for j, c in enumerate(calls)]
    for key in ("name", "tool_call_id"):
        if isinstance(m.get(key), str):
            out[key] = m[key]
    return out


def _tool_call(c: Any, where: str) -> dict[str, Any]:
    fn = c.get("function") if isinstance(c, dict) else None
    if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
        raise ProtocolError(f"'{where}.function.name' must be a string", f"{where}.function.name")
    args = fn.get("arguments", "{}")
    if isinstance(args, str):
        try:
            args = json.loads(args or "{}")
        except json.JSONDecodeError:
            raise ProtocolError(f"'{where}.function.arguments' is not valid JSON", f"{where}.function.arguments") from None
    return {"id": c.get("id"), "name": fn["name"], "arguments": args}


def parse_chat(body: Any) -> ChatRequest:
    if not isinstance(body, dict):
        raise ProtocolError("the request body must be a JSON object")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise ProtocolError("'messages' must be a non-empty list", "messages")
    parsed = [_message(m, i) for i, m in enumerate(messages)]
    if parsed[-1]["role"] == "assistant":
        raise ProtocolError("the last message is an assistant message: continuing a partial assistant "
                            "turn is not supported", f"messages[{len(parsed) - 1}].role")
    check_tool_choice(body)
    tools = body.get("tools")
    if tools is not None and not (isinstance(tools, list) and all(
            isinstance(t, dict) and isinstance(t.get("function"), dict) and t["function"].get("name") for t in tools)):
        raise ProtocolError("'tools' must be a list of {'type': 'function', 'function': {'name': ...}}", "tools")
    return ChatRequest(parsed, tools or None, _sampling(body), bool(body.get("stream", False)))


def parse_completion(body: Any) -> CompletionRequest:
    if not isinstance(body, dict):
        raise ProtocolError("the request body must be a JSON object")
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]  # a batch of one
    ok = (isinstance(prompt, str) and prompt) or (
        isinstance(prompt, list) and prompt and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt))
    if not ok:
        raise ProtocolError("'prompt' must be a non-empty string or a list of token ids (one prompt)", "prompt")
    return CompletionRequest(prompt, _sampling(body), bool(body.get("stream", False)))


# ---------------------------------------------------------------- responses


def new_id(prefix: str, sep: str = "-") -> str:
    """A fresh object id as OpenAI writes them: "chatcmpl-…" for chat, "resp_…" / "msg_…" for Responses."""
    return f"{prefix}{sep}{uuid.uuid4().hex[:24]}"


def openai_tool_calls(calls: list[tuple[str, str, dict[str, Any]]]) -> list[dict[str, Any]]:
    """[(id, name, arguments)] in OpenAI's shape (arguments as a JSON string)."""
    return [{"id": cid, "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}
            for cid, name, args in calls]


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


def chat_response(rid: str, model: str, choices: list[tuple[Message, str]], use: dict[str, int]) -> dict[str, Any]:
    """`choices`: (message, finish_reason) per choice, indexed in order."""
    return {"id": rid, "object": "chat.completion", "created": int(time.time()), "model": model,
            "choices": [{"index": i, "message": message, "finish_reason": finish, "logprobs": None}
                        for i, (message, finish) in enumerate(choices)], "usage": use}


def chat_chunk(rid: str, model: str, delta: dict[str, Any], finish_reason: str | None = None,
               use: dict[str, int] | None = None) -> dict[str, Any]:
    chunk = {"id": rid, "object": "chat.completion.chunk", "created": int(time.time()), "model": model,
             "choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason, "logprobs": None}]}
    if use is not None:
        chunk["usage"] = use
    return chunk


def completion_response(rid: str, model: str, text: str | list[str], finish_reason: str | None | list[str],
                        use: dict[str, int] | None) -> dict[str, Any]:
    """One choice, or one per text when `text` and `finish_reason` are lists."""
    texts, finishes = (text, finish_reason) if isinstance(text, list) else ([text], [finish_reason])
    body = {"id": rid, "object": "text_completion", "created": int(time.time()), "model": model,
            "choices": [{"index": i, "text": t, "finish_reason": f, "logprobs": None}
                        for i, (t, f) in enumerate(zip(texts, finishes))]}
    if use is not None:
        body["usage"] = use
    return body


def models_response(model: str) -> dict[str, Any]:
    return {"object": "list", "data": [{"id": model, "object": "model", "created": 0, "owned_by": "agentrl"}]}
