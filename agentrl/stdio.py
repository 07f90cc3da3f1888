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
"""

from __future__ import annotations

import contextlib
import importlib.abc
import logging
import os
import sys
from typing import Any

_REDIRECTED = ("deepspeed",)


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
    if not any(isinstance(f, _StderrImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _StderrImport())
    for handler in logging.getLogger("DeepSpeed").handlers:
        if isinstance(handler, logging.StreamHandler) and handler.stream in (sys.stdout, sys.__stdout__):
            handler.setStream(sys.stderr)
