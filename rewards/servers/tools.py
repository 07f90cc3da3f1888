"""Reference tool server: a safe calculator and a fixed lookup table over HTTP.

Run it with `python -m rewards.servers.tools --port 8765` and point `agentrl.rollout.tools.client.RemoteToolClient` (or
`envs.calculator:CalculatorEnv`'s `tool_url`) at `http://127.0.0.1:8765`.

    GET  /tools    -> 200 {"tools": [<OpenAI function spec>, ...]}        (calculator, lookup)
    POST /call     {"name": str, "arguments": {...}}
                   -> 200 {"content": str, "is_error": false}            the tool ran
                   -> 200 {"content": "error: ...", "is_error": true}    bad arguments: the model's mistake
                   -> 404 {"error": ...} unknown tool; 400 {"error": ...} body not {"name", "arguments"}
                   -> 500 {"error": "... error id ..."} only for the server's own failure (logged)
    GET  /health   -> 200 {"status": "ok"}
    GET  /stats    -> 200 {"calls": {tool name: count}, "listed": GET /tools count}

The calculator parses with `ast` and evaluates only numbers, + - * / (unary + -) and parentheses,
exactly with fractions; `eval` is never used.
"""

from __future__ import annotations

import ast
import json
import math
import operator
from collections import Counter
from fractions import Fraction
from typing import Any, Callable

from aiohttp import web

from rewards.servers import errors, read_json, run_server

MAX_EXPRESSION_CHARS = 200  # bounds parse time and the size of exact intermediate results
MAX_MAGNITUDE = Fraction(10) ** 100

LOOKUP_TABLE: dict[str, str] = {
    "pi": "3.14159265358979",
    "e": "2.71828182845905",
    "speed_of_light_m_per_s": "299792458",
    "seconds_per_day": "86400",
    "days_per_leap_year": "366",
    "boiling_point_water_c": "100",
}

TOOL_SPECS: list[dict[str, Any]] = [
    {"type": "function", "function": {
        "name": "calculator",
        "description": "Evaluate an arithmetic expression with + - * / and parentheses, e.g. '37 * (89 - 4)'.",
        "parameters": {"type": "object", "properties": {"expression": {"type": "string"}},
                       "required": ["expression"]}}},
    {"type": "function", "function": {
        "name": "lookup",
        "description": f"Look up a constant by key; keys: {', '.join(LOOKUP_TABLE)}.",
        "parameters": {"type": "object", "properties": {"key": {"type": "string"}}, "required": ["key"]}}},
]

_BINARY: dict[type, Callable[[Fraction, Fraction], Fraction]] = {
    ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv}
_UNARY: dict[type, Callable[[Fraction], Fraction]] = {ast.UAdd: operator.pos, ast.USub: operator.neg}


class ToolArgumentError(ValueError):
    """The arguments are the caller's mistake; answered as content with is_error: true."""


def _eval(node: ast.AST) -> Fraction:
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):  # type(): bool is not a number here
        if not math.isfinite(node.value):  # "1e999" parses to inf
            raise ToolArgumentError(f"number {node.value} out of range")
        return Fraction(node.value)
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _eval(node.left), _eval(node.right)
        if isinstance(node.op, ast.Div) and right == 0:
            raise ToolArgumentError("division by zero")
        return _BINARY[type(node.op)](left, right)
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _UNARY[type(node.op)](_eval(node.operand))
    what = type(getattr(node, "op", node)).__name__  # "Pow" for 2 ** 3, "Call" for f(x), ...
    raise ToolArgumentError(f"unsupported syntax {what}: only numbers, + - * / and parentheses")


def format_number(value: Fraction) -> str:
    """An integer exactly; otherwise 12 significant digits."""
    if abs(value) >= MAX_MAGNITUDE:  # past float range, and past int -> str limits
        raise ToolArgumentError("result out of range")
    return str(value.numerator) if value.denominator == 1 else format(float(value), ".12g")


def calculate(expression: str) -> str:
    """The value of an arithmetic expression; raises ToolArgumentError for anything else."""
    if len(expression) > MAX_EXPRESSION_CHARS:
        raise ToolArgumentError(f"expression longer than {MAX_EXPRESSION_CHARS} characters")
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except SyntaxError as exc:
        raise ToolArgumentError(f"cannot parse {expression!r}: {exc.msg}") from None
    except (ValueError, MemoryError, RecursionError) as exc:  # a null byte; the parser's own limits
        raise ToolArgumentError(f"cannot parse {expression!r}: {type(exc).__name__}") from None
    return format_number(_eval(tree.body))


def _string_arg(arguments: dict[str, Any], key: str) -> str:
    value = arguments.get(key)
    if not isinstance(value, str):
        raise ToolArgumentError(f"argument {key!r} must be a string, got {json.dumps(value)[:80]}")
    return value


def _lookup(arguments: dict[str, Any]) -> str:
    key = _string_arg(arguments, "key")
    if key not in LOOKUP_TABLE:
        raise ToolArgumentError(f"unknown key {key!r}; keys: {', '.join(LOOKUP_TABLE)}")
    return LOOKUP_TABLE[key]


TOOLS: dict[str, Callable[[dict[str, Any]], str]] = {
    "calculator": lambda arguments: calculate(_string_arg(arguments, "expression")),
    "lookup": _lookup,
}

CALLS = web.AppKey("calls", Counter)
LISTED = web.AppKey("listed", Counter)


async def list_tools(request: web.Request) -> web.Response:
    request.app[LISTED]["tools"] += 1
    return web.json_response({"tools": TOOL_SPECS})


async def call(request: web.Request) -> web.Response:
    body = await read_json(request)  # not JSON: a 400 from the `errors` middleware
    if not isinstance(body, dict) or not isinstance(body.get("name"), str) or \
            not isinstance(body.get("arguments", {}), dict):
        return web.json_response({"error": 'body must be {"name": str, "arguments": object}'}, status=400)
    tool = TOOLS.get(body["name"])
    if tool is None:
        name = body["name"] if len(body["name"]) <= 80 else body["name"][:80] + "..."
        return web.json_response({"error": f"unknown tool {name!r}; tools: {sorted(TOOLS)}"}, status=404)
    request.app[CALLS][body["name"]] += 1
    try:
        return web.json_response({"content": tool(body.get("arguments", {})), "is_error": False})
    except ToolArgumentError as exc:
        return web.json_response({"content": f"error: {exc}", "is_error": True})


async def health(request: web.Request) -> web.Response:
    return web.json_response({"status": "ok"})


async def stats(request: web.Request) -> web.Response:
    return web.json_response({"calls": dict(request.app[CALLS]), "listed": request.app[LISTED]["tools"]})


def make_app() -> web.Application:
    app = web.Application(middlewares=[errors])
    app[CALLS], app[LISTED] = Counter(), Counter()
    app.router.add_get("/tools", list_tools)
    app.router.add_post("/call", call)
    app.router.add_get("/health", health)
    app.router.add_get("/stats", stats)
    return app


def main(argv: list[str] | None = None) -> None:
    run_server(argv, __doc__.splitlines()[0], 8765, "tool server", lambda args: make_app(),
               risk="anyone who can reach this port can call its tools")


if __name__ == "__main__":
    main()
