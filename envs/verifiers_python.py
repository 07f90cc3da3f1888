"""Run verifiers' harness programs on this interpreter instead of a uv-built environment.

verifiers (0.4, `verifiers.v1`) plays a rollout by launching a harness program (for the `null` and
`bash` harnesses, its own chat loop, a PEP 723 script) in a runtime; the local `subprocess` runtime
prepares that script with `uv sync --script`, which downloads uv and the script's dependencies
(and, failing that, runs `pip install --user uv`). A training host is often offline, and agentrl's
venv already holds every dependency those scripts declare (openai, mcp, httpx, httpx2, tenacity,
certifi: verifiers' own requirements). So, for the subprocess runtime only, a script whose declared
dependencies are all installed here runs as `sys.executable script.py`; any other script still goes
through uv. Versions are not checked: agentrl runs openai 3.x where verifiers pins openai<3, which
its sources tolerate (every openai name they import exists in openai 3).
"""

from __future__ import annotations

import hashlib
import os
import re
import sys
import tempfile
from importlib import metadata
from pathlib import Path
from typing import Any

_DEPENDENCIES = re.compile(r"^# dependencies = \[(.*)\]$", re.MULTILINE)
_NAME = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)")
_installed = False


def _dependencies_here(script: bytes) -> bool:
    """Whether every dependency the PEP 723 header of `script` declares is installed here."""
    match = _DEPENDENCIES.search(script.decode(errors="replace"))
    if match is None:
        return False
    for item in re.findall(r'"([^"]+)"', match.group(1)):
        name = _NAME.match(item)
        try:
            metadata.distribution(name.group(1) if name else item)
        except metadata.PackageNotFoundError:
            return False
    return True


def _write_once(directory: str, script: bytes) -> str:
    """The script's content-addressed path, written atomically the first time."""
    path = Path(directory) / f"{hashlib.sha256(script).hexdigest()}-agentrl.py"
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, suffix=".tmp")
        with os.fdopen(fd, "wb") as f:
            f.write(script)
        os.replace(tmp, path)
    return str(path)


def use_this_interpreter() -> None:
    """Patch verifiers' subprocess runtime once (idempotent) to run installable scripts here."""
    global _installed
    if _installed:
        return
    from verifiers.v1.runtimes.subprocess import SubprocessRuntime

    original = SubprocessRuntime.prepare_uv_script

    async def prepare_uv_script(self: Any, script: str | bytes, env: dict[str, str] | None = None, *,
                                activate: bool = True) -> list[str]:
        data = script.encode() if isinstance(script, str) else script
        if not _dependencies_here(data):
            return await original(self, script, env, activate=activate)
        return [sys.executable, _write_once(self.scripts_dir, data)]

    SubprocessRuntime.prepare_uv_script = prepare_uv_script  # type: ignore[method-assign]
    _installed = True
