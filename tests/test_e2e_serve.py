"""`python -m agentrl.serve` standing alone on a real vLLM engine: the official `openai` client gets the
same tokens streaming and not (same seed), a session's ledger records them with their logprobs, and
a request without the bearer token is a 401."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import httpx
import openai
import pytest
import warm_python

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def served(model_dir):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "AGENTRL_TEST_API_KEY": "s3cret"}  # a key in argv is refused (ps)
    proc = warm_python.Popen([sys.executable, "-m", "agentrl.serve", "--model", model_dir, "--port", "0",
                             "--api-key-env", "AGENTRL_TEST_API_KEY", "engine.max_num_seqs=8"],
                            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        lines = []  # log lines, then "serving <folder> as 'agentrl' at http://127.0.0.1:<port>/v1"
        while not (lines and lines[-1].startswith("serving ")):
            line = proc.stdout.readline()
            assert line, "".join(lines)  # the server exited
            lines.append(line)
        line = lines[-1]
        assert " at http://127.0.0.1:" in line, line
        yield line.split()[-1]
    finally:
        proc.terminate()
        proc.wait(timeout=60)


def test_serve_streams_the_same_tokens_and_records_the_ledger(served, model_dir):
    from agentrl.data.chat import ChatFormat, load_tokenizer

    headers = {"Authorization": "Bearer s3cret"}
    base = served.removesuffix("/v1")

    async def run():
        session = httpx.post(f"{base}/sessions", headers=headers).json()
        client = openai.AsyncOpenAI(base_url=session["base_url"], api_key="s3cret", max_retries=0)
        messages = [{"role": "user", "content": "Guess a number between 1 and 100."}]
        plain = await client.chat.completions.create(model="agentrl", messages=messages, seed=11, max_tokens=12,
                                                     temperature=1.0)
        messages.append(plain.choices[0].message.model_dump(exclude_none=True))
        messages.append({"role": "user", "content": "Higher."})
        await client.chat.completions.create(model="agentrl", messages=messages, seed=12, max_tokens=12)
        stateless = openai.AsyncOpenAI(base_url=served, api_key="s3cret", max_retries=0)
        chunks = [c async for c in await stateless.chat.completions.create(
            model="agentrl", messages=messages[:1], seed=11, max_tokens=12, temperature=1.0, stream=True)]
        ledger = httpx.get(f"{base}/sessions/{session['id']}", headers=headers).json()
        return plain, chunks, ledger

    plain, chunks, ledger = asyncio.run(run())
    streamed = "".join(c.choices[0].delta.content or "" for c in chunks)
    assert streamed == (plain.choices[0].message.content or "") and len(chunks) >= 3
    assert chunks[-1].choices[0].finish_reason == plain.choices[0].finish_reason
    generated = [i for i, m in enumerate(ledger["loss_mask"]) if m]
    assert len(generated) >= 2 and not ledger["segments"]
    assert all(ledger["logprobs"][i] <= 0.0 and ledger["versions"][i] == 0 for i in generated)
    fmt = ChatFormat(load_tokenizer(model_dir))
    first = fmt.initial([{"role": "user", "content": "Guess a number between 1 and 100."}])
    assert ledger["prompt_len"] == len(first) and ledger["tokens"][:len(first)] == first
    assert ledger["text"].count("Higher.") == 1  # the follow-up extended the ledger, not re-rendered it
    refused = httpx.get(f"{served}/models")
    assert refused.status_code == 401 and refused.json()["error"]["code"] == "invalid_api_key"
