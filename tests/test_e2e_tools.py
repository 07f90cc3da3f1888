"""End to end with tools: the reference tool server in its own process on loopback, a calculator
warm-started default model, and `python -m agentrl.train` on examples/agents/calculator.yaml with a
real vLLM engine and DeepSpeed learner. Checks mechanics (tool calls reach the server, tool metrics
are logged, the summary reports the tool-call success rate before and after), not a learning curve.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
import warm_python

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def tool_server():
    """The reference tool server (rewards.servers.tools) on a free loopback port: its base URL."""
    proc = subprocess.Popen([sys.executable, "-m", "rewards.servers.tools", "--port", "0"],
                            cwd=ROOT, stdout=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()  # "tool server listening on http://127.0.0.1:<port>"
        assert line.startswith("tool server listening on http://127.0.0.1:"), line
        yield line.split()[-1]
    finally:
        proc.terminate()
        proc.wait(timeout=10)


@pytest.fixture(scope="module")
def calculator_model(tmp_path_factory) -> str:
    """A short warm start on mostly-correct calculator demonstrations, so the model emits tool calls."""
    from agentrl.config import DefaultModelConfig
    from agentrl.models.default import ensure_default_model

    cfg = DefaultModelConfig(task="calculator", split_digits=True, sft_steps=60, sft_demos=400, sft_batch_size=32,
                             sft_lr=5e-3, demo_optimal_prob=0.9, cache_dir=str(tmp_path_factory.mktemp("models")))
    return str(ensure_default_model(cfg))


def train(config: str, out: Path, model: str, *overrides: str) -> subprocess.CompletedProcess:
    """`python -m agentrl.train` on an example config, shortened: 16 held-out tasks, groups of 4, batches of 16;
    `overrides` point it at the test's tool server."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "CI": "true"}
    cmd = [sys.executable, "-m", "agentrl.train", "--config", config, f"model.path={model}",
           f"train.out_dir={out}", "data.eval_tasks=16", "rollout.n_samples=4",
           "buffer.batch_size=16", "train.save_model=false", *overrides]
    proc = warm_python.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    return proc


def test_calculator_env_trains_against_the_reference_tool_server(tmp_path, tool_server, calculator_model):
    out = tmp_path / "run"
    proc = train("examples/agents/calculator.yaml", out, calculator_model, f"tools.servers.calculator.url={tool_server}",
                 "train.steps=3")

    summary = json.loads((out / "summary.json").read_text())
    for key in ("eval_before", "eval_after"):
        res = summary[key]
        assert res["n"] == 16 and res["failed"] == {}, res
        assert 0.0 <= res["tool_call_success_rate"] <= 1.0
    assert "tool-call success, warm start" in proc.stdout and "tool-call success, after RL" in proc.stdout

    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert len(records) == 3
    for rec in records:
        assert {k for k in rec if k.startswith("episodes/")} <= {"episodes/ok", "episodes/truncated"}
        for key in ("tools/calls", "tools/turns", "tools/parse_failure_rate", "tools/call_success_rate"):
            assert key in rec
    assert sum(r["tools/calls"] for r in records) > 0  # the policy really called the tool

    stats = httpx.get(tool_server + "/stats", timeout=5).json()
    assert stats["listed"] >= 1  # the env discovered its tools from this server
    assert stats["calls"].get("calculator", 0) > 0  # and its calls ran there


def ledger_around_turns(fmt, ep: dict) -> list[int]:
    """The first prompt rendered, then each model turn's sampled tokens and the template's suffix for the
    messages after it (closed with EOS first when the turn was cut at max_tokens)."""
    messages, turns = ep["messages"], ep["turns"]
    at = [i for i, m in enumerate(messages) if m["role"] == "assistant"]
    assert len(at) == len(turns)
    tokens = fmt.initial(messages[:at[0]])
    for k, (i, turn) in enumerate(zip(at, turns)):
        assert turn["start"] == len(tokens)
        sampled = ep["tokens"][turn["start"]:turn["start"] + turn["n_generated"]]
        tokens += sampled
        following = messages[i + 1:at[k + 1] if k + 1 < len(at) else len(messages)]
        if following:
            tokens += ([] if sampled and sampled[-1] == fmt.eos_id else [fmt.eos_id]) + fmt.continuation(following)
    return tokens


@pytest.mark.parametrize("config", ["examples/agents/openai_agent.yaml", "examples/agents/anthropic_agent.yaml"])
def test_openai_agent_trains_through_agentenv(tmp_path, tool_server, calculator_model, config):
    """examples/agents/openai_agent.py: the same task as plain `openai` code, through the run's endpoint;
    examples/agents/anthropic_agent.py: the same again on the `anthropic` client (/v1/messages), whose
    conversation renders to the same ledger."""
    from agentrl.data.chat import ChatFormat, load_tokenizer

    out = tmp_path / "run"
    train(config, out, calculator_model, f"env.kwargs.tool_url={tool_server}", "train.steps=2",
          "train.save_rollouts=true")
    summary = json.loads((out / "summary.json").read_text())
    for key in ("eval_before", "eval_after"):
        assert summary[key]["n"] == 16 and summary[key]["failed"] == {}, summary[key]
        assert 0.0 <= summary[key]["tool_call_success_rate"] <= 1.0
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert len(records) == 2 and all(r["ledger/segments_split"] == 0 for r in records)
    assert sum(r["tools/calls"] for r in records) > 0  # tool calls parsed from the sessions' turns
    # Every trained episode's ledger is the template's rendering of the conversation the agent had.
    fmt = ChatFormat(load_tokenizer(calculator_model))
    rollouts = [json.loads(line) for line in (out / "rollouts.jsonl").read_text().splitlines()]
    assert len(rollouts) == 32
    # Sampled turns need not be the canonical tokenisation of their text (nor whole UTF-8 characters), so
    # the check rebuilds the ledger from the template around the turns' own tokens: the first prompt and
    # every suffix between turns must be exactly the template's rendering, the turns exactly as sampled.
    for ep in rollouts:
        assert ep["tokens"] == ledger_around_turns(fmt, ep)[:len(ep["tokens"])]
        gen = {i for t in ep["turns"] for i in range(t["start"], t["start"] + t["n_generated"])}
        assert ep["loss_mask"] == [int(i in gen) for i in range(len(ep["tokens"]))]
    for ep in rollouts:
        assert not ep["segments"] and all(v >= 0 for v, m in zip(ep["versions"], ep["loss_mask"]) if m)
    check_learner_values(rollouts, records)


def test_process_agent_trains_through_its_session(tmp_path, tool_server, calculator_model):
    """examples/agents/process_agent.yaml: the same task as a standard-library program of its own, one
    process per episode (ProcessAgentEnv), its tokens those of its session and its reward its file's."""
    out = tmp_path / "run"
    train("examples/agents/process_agent.yaml", out, calculator_model,
          f"env.kwargs.env.CALCULATOR_TOOL_URL={tool_server}", "train.steps=2", "train.save_rollouts=true")
    summary = json.loads((out / "summary.json").read_text())
    for key in ("eval_before", "eval_after"):  # no episode failed: every process called the model, wrote its reward
        assert summary[key]["n"] == 16 and summary[key]["failed"] == {}, summary[key]
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert len(records) == 2 and all(r["ledger/segments_split"] == 0 for r in records)
    assert sum(r["tools/calls"] for r in records) > 0  # the program's tool calls, parsed from its session's turns
    rollouts = [json.loads(line) for line in (out / "rollouts.jsonl").read_text().splitlines()]
    assert len(rollouts) == 32 and all(ep["status"] in ("ok", "truncated") for ep in rollouts)
    assert all(ep["reward"] in (0.0, 1.0) and "tool_success" in ep["info"]["env"] for ep in rollouts)
    check_learner_values(rollouts, records)


def check_learner_values(rollouts: list[dict], metrics: list[dict]) -> None:
    """The learner's per-token values beside each trained episode (for the viewer): the advantage is GRPO's
    of the group's rewards (A = (r - mean) / (unbiased std + 1e-6)) on every scored token, and
    mean |learner log pi - mu| over a step's scored tokens is the step's mismatch_abs (pi_prox is the
    training pass's log pi here: decoupled, one optimizer step); the trust region's 0/1 decision counts to
    the step's trust_masked_frac. Values are written to 4 decimals."""
    for step, rec in enumerate(metrics):
        eps = [ep for ep in rollouts if ep["step"] == step and "advantages" in ep]
        assert eps and all(ep["status"] in ("ok", "truncated") for ep in eps)
        for gid in {ep["group_id"] for ep in eps}:
            group = [ep for ep in eps if ep["group_id"] == gid]
            rewards = [ep["reward"] for ep in group]
            mean = sum(rewards) / len(rewards)
            std = (sum((r - mean) ** 2 for r in rewards) / (len(rewards) - 1)) ** 0.5
            for ep, r in zip(group, rewards):
                scored = [a for a, m in zip(ep["advantages"], ep["loss_mask"]) if m]
                assert scored and all(abs(a - (r - mean) / (std + 1e-6)) < 1e-4 for a in scored)
                assert all(a is None for a, m in zip(ep["advantages"], ep["loss_mask"]) if not m)
        gaps = [abs(p - mu) for ep in eps for p, mu, m in zip(ep["learner_logprobs"], ep["logprobs"], ep["loss_mask"]) if m]
        assert sum(gaps) / len(gaps) == pytest.approx(rec["policy/mismatch_abs"], abs=2e-4)
        # the trust region's decision per token: 0/1 where scored, and the share it dropped is the step's
        # trust_masked_frac (a count ratio; the metric is taken in float32, 2^-24 relative)
        kept = [k for ep in eps for k, m in zip(ep["trust_kept"], ep["loss_mask"]) if m]
        assert set(kept) <= {0, 1} and len(kept) == len(gaps)
        assert kept.count(0) / len(kept) == pytest.approx(rec["policy/trust_masked_frac"], abs=1e-6)
