"""The calculator agent as a program of its own, standard library only: what agentrl trains through
`ProcessAgentEnv` (examples/agents/process_agent.yaml) when the agent is not Python code inside the run.

It plays exactly as examples/agents/openai_agent.py's `solve` does, so the calculator warm start
applies: the same system prompt and question, the tool server's tools, results cut to 32 bytes, "Reply
with a number, or call a tool." after a reply with no number, at most 3 turns, and the same reward rule
(rewards.rules.numeric_match: the reply's last number within 1e-6 of the answer), written inline.

The contract it keeps (agentrl.rollout.process_agent): the task is one JSON object on stdin; the model
is at $OPENAI_BASE_URL with $OPENAI_API_KEY; the reward goes to $AGENTRL_REWARD_FILE as
{"reward": r, "success": ..., "tool_success": ...}; exit 0. The tool server is $CALCULATOR_TOOL_URL.
Only json, re, math and urllib: start-up is ~30 ms, and every episode starts one.

    python -m rewards.servers.tools --port 8765 &
    python -m agentrl.train --config examples/agents/process_agent.yaml

Against a served model instead: OPENAI_BASE_URL=http://127.0.0.1:8000/v1 OPENAI_API_KEY=unused
AGENTRL_REWARD_FILE=/dev/stdout CALCULATOR_TOOL_URL=http://127.0.0.1:8765 python process_calculator.py
<<< '{"a": 12, "op": "+", "b": 30, "answer": 42}'
"""

import json
import math
import os
import re
import sys
import urllib.request

# rewards/rules.py's _NUMBER, so a reply scores here as numeric_match scores it there
NUMBER = re.compile(r"[-+]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:[eE][-+]?\d+)?|[-+]?\.\d+(?:[eE][-+]?\d+)?")


def last_number(text):
    matches = NUMBER.findall(text)
    return float(matches[-1].replace(",", "")) if matches else None


def numeric_match(text, answer, tol=1e-6):
    target, pred = float(answer), last_number(text)
    if pred is None or not math.isfinite(pred):
        return 0.0
    return 1.0 if math.isclose(pred, target, rel_tol=tol, abs_tol=tol) else 0.0


def http_json(url, body=None, headers=None, timeout=60):
    """GET (body None) or POST JSON; the parsed reply. An HTTP error raises (the process exits non-zero)."""
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json", **(headers or {})})
    with urllib.request.urlopen(request, timeout=timeout) as response:
        return json.load(response)


def without_none(value):
    """A reply message as openai's `model_dump(exclude_none=True)` gives it back, so the next request
    extends the session's conversation exactly."""
    if isinstance(value, dict):
        return {k: without_none(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [without_none(v) for v in value]
    return value


def run_tool(tool_url, name, arguments):
    """(content for the model, whether the tool ran)."""
    try:
        args = json.loads(arguments)
    except json.JSONDecodeError as exc:
        return f"error: arguments are not JSON: {exc}", False
    body = http_json(tool_url + "/call", {"name": name, "arguments": args})
    return body["content"], not body.get("is_error", False)


def solve(task, base_url, api_key, tool_url, max_turns=3, result_chars=32):
    tools = http_json(tool_url + "/tools")["tools"]
    names = [t["function"]["name"] for t in tools]
    messages = [{"role": "system", "content": f"Tools: {', '.join(names)}."},
                {"role": "user", "content": f"What is {task['a']} {task['op']} {task['b']}?"}]
    auth = {"Authorization": f"Bearer {api_key}"}
    tool_success = False
    for turn in range(max_turns):
        out = http_json(base_url + "/chat/completions", {"model": "agentrl", "messages": messages, "tools": tools},
                        auth)
        reply = without_none(out["choices"][0]["message"])
        messages.append(reply)
        if reply.get("tool_calls"):
            for call in reply["tool_calls"]:
                name, arguments = call["function"]["name"], call["function"]["arguments"]
                if name in names:
                    content, ran = run_tool(tool_url, name, arguments)
                else:
                    content, ran = f"error: unknown tool {name!r}; tools: {sorted(names)}", False
                tool_success = tool_success or ran
                messages.append({"role": "tool", "tool_call_id": call["id"], "content": content[:result_chars]})
            continue
        if last_number(reply.get("content") or "") is None:
            messages.append({"role": "user", "content": "Reply with a number, or call a tool."})
            continue
        reward = numeric_match(reply["content"], task["answer"])
        return {"reward": reward, "success": reward == 1.0, "tool_success": tool_success, "turns": turn + 1}
    return {"reward": 0.0, "success": False, "tool_success": tool_success, "turns": max_turns}


def main():
    task = json.load(sys.stdin)
    tool_url = os.environ.get("CALCULATOR_TOOL_URL", "http://127.0.0.1:8765").rstrip("/")
    max_turns = int(sys.argv[1]) if len(sys.argv) > 1 else 3
    result = solve(task, os.environ["OPENAI_BASE_URL"].rstrip("/"), os.environ["OPENAI_API_KEY"], tool_url, max_turns)
    with open(os.environ["AGENTRL_REWARD_FILE"], "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main()
