"""stdout belongs to the command: every library's log lines go to stderr.

A CLI's stdout carries only what it is asked for (a folder, a summary, a report), so that
`BASE=$(python -m agentrl.models prepare default)` captures a path and nothing else. Two libraries
write to stdout on their own:
  * vLLM logs to `VLLM_LOGGING_STREAM` (stdout unless set), in this process and in its engine-core
    processes, which inherit the environment: set to stderr here, unless the user set it;
  * DeepSpeed, when first imported, gives its logger a handler bound to `sys.stdout` and warns at once
    (the accelerator it picked). Its import therefore runs with stdout pointing at stderr
    (`_StderrImport`), so the handler it makes writes there for the rest of the process; a handler
    made before `route_library_output` ran (deepspeed imported earlier) is re-pointed.
transformers, Ray and agentrl's own logging (metrics.setup_logging) already write to stderr.

DeepSpeed's accelerator line ("Setting accelerator to CPU. If you have GPU or other accelerator, we were
unable to detect it.") came with every process that imported it on a CPU install, where there is no
accelerator it could have missed: `pin_cpu_accelerator` names the CPU the way DeepSpeed documents
(`DS_ACCELERATOR=cpu`), so it picks it without the warning, in this process and every child.
"""

from __future__ import annotations

import contextlib
import importlib.abc
import importlib.util
import logging
import os
import sys
from collections.abc import MutableMapping
from typing import Any

_REDIRECTED = ("deepspeed",)
# The packages DeepSpeed looks for, before CUDA, to pick an accelerator other than the CPU
# (deepspeed/accelerator/real_accelerator.py); with any of them installed its own choice stands.
_ACCELERATOR_PACKAGES = ("intel_extension_for_pytorch", "intel_extension_for_deepspeed", "torch_npu",
                         "torch_sdaa", "habana_frameworks", "torch_mlu", "torch_supa", "torch_xmlir")


class _Loader(importlib.abc.Loader):
    """The package's own loader, executing the module with stdout pointing at stderr."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner

    def create_module(self, spec):
        return self._inner.create_module(spec)

    def exec_module(self, module) -> None:
        with contextlib.redirect_stdout(sys.stderr):
            self._inner.exec_module(module)

    def __getattr__(self, name: str) -> Any:  # resource readers, get_data, ...: the real loader's
        return getattr(self._inner, name)


class _StderrImport(importlib.abc.MetaPathFinder):
    """Finds the top-level packages in `_REDIRECTED` with the other finders and wraps their loader."""

    def find_spec(self, name: str, path: Any = None, target: Any = None):
        if name not in _REDIRECTED:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None:
                if spec.loader is not None:
                    spec.loader = _Loader(spec.loader)
                return spec
        return None


def route_library_output() -> None:
    """Send the log output of vLLM and DeepSpeed to stderr (idempotent)."""
    os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")
    pin_cpu_accelerator()
    if not any(isinstance(f, _StderrImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _StderrImport())
    for handler in logging.getLogger("DeepSpeed").handlers:
        if isinstance(handler, logging.StreamHandler) and handler.stream in (sys.stdout, sys.__stdout__):
            handler.setStream(sys.stderr)


def _torch_build() -> dict[str, str | None]:
    """The GPU backends the installed torch was built with (`torch.version`: cuda, hip, xpu), read without
    importing torch (seconds, and most commands that set up logging import it later, if at all)."""
    torch = sys.modules.get("torch")
    if torch is not None:
        version = torch.version
    else:
        spec = importlib.util.find_spec("torch")
        if spec is None or not spec.submodule_search_locations:
            return {}
        path = os.path.join(list(spec.submodule_search_locations)[0], "version.py")
        if not os.path.isfile(path):
            return {}
        version_spec = importlib.util.spec_from_file_location("_agentrl_torch_version", path)
        version = importlib.util.module_from_spec(version_spec)
        version_spec.loader.exec_module(version)  # a file of constants: torch's build, no torch import
    return {name: getattr(version, name, None) for name in ("cuda", "hip", "xpu")}


def pin_cpu_accelerator(env: MutableMapping[str, str] = os.environ) -> bool:
    """Set `DS_ACCELERATOR=cpu` where DeepSpeed can only end up on the CPU: a torch built without CUDA,
    ROCm or XPU, not on macOS (MPS), and none of DeepSpeed's other accelerator packages installed. A GPU
    build keeps DeepSpeed's own detection and its warning, which then says something a user can act on
    (a GPU build that sees no GPU). A value the user set is kept. True when it set the variable."""
    if "DS_ACCELERATOR" in env or sys.platform == "darwin":
        return False
    build = _torch_build()
    if not build or any(build.values()):
        return False
    if any(importlib.util.find_spec(name) is not None for name in _ACCELERATOR_PACKAGES):
        return False
    env["DS_ACCELERATOR"] = "cpu"
    return True
