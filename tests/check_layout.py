"""The layout's rules, checked by walking every import (also those inside functions):

  * `agentrl/config` imports nothing of the project but itself, `agentrl.types`, and the leaf registries
    `agentrl.algo` and `agentrl.tool_formats` (names checked by validators); never `rewards`, `envs`, rollout,
    the learner, DeepSpeed or vLLM;
  * `agentrl/algo` imports only torch and the standard library;
  * `agentrl/rollout` imports neither DeepSpeed nor `agentrl.learner`;
  * `rewards/` never imports `agentrl.learner`;
  * no component imports `agentrl.train` (the wiring sits on top);
  * no non-test Python file is over 400 lines.

Run it as `python tests/check_layout.py` (prints each violation, exits 1 if any); tests/test_layout.py
runs it in the suite.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

MAX_LINES = 400
CONFIG_MAY_IMPORT = ("agentrl.config", "agentrl.types", "agentrl.algo", "agentrl.tool_formats")
PROJECT = ("agentrl", "rewards", "envs", "examples", "bench", "tests")


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path, root: Path) -> list[tuple[int, str]]:
    """(line, absolute module name) of every import in the file; relative imports resolved."""
    tree = ast.parse(path.read_text(), filename=str(path))
    package = module_name(path, root)
    if path.name != "__init__.py":
        package = package.rpartition(".")[0]
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            out.append((node.lineno, base))
            # `from agentrl import learner` imports agentrl.learner (a name that is not a module is harmless here)
            out += [(node.lineno, f"{base}.{alias.name}") for alias in node.names]
    return out


def _within(name: str, prefixes: tuple[str, ...]) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


def rule_violations(module: str, name: str) -> str | None:
    """Why `module` may not import `name`, or None."""
    if _within(module, ("agentrl.config",)):
        if _within(name, PROJECT) and not _within(name, CONFIG_MAY_IMPORT):
            return "agentrl/config imports only agentrl.config, agentrl.types and the registries algo and tools"
        if _within(name, ("deepspeed", "vllm")):
            return "agentrl/config imports no engine"
    if _within(module, ("agentrl.algo",)):
        top = name.split(".")[0]
        if not (_within(name, ("agentrl.algo", "torch")) or top in sys.stdlib_module_names):
            return "agentrl/algo imports only torch and the standard library"
    if _within(module, ("agentrl.rollout",)) and _within(name, ("deepspeed", "agentrl.learner")):
        return "agentrl/rollout knows nothing of DeepSpeed or agentrl.learner"
    if _within(module, ("rewards",)) and _within(name, ("agentrl.learner",)):
        return "rewards/ never imports agentrl.learner"
    if module != "agentrl.train" and _within(name, ("agentrl.train",)) and not _within(module, ("tests",)):
        return "components never import agentrl.train"
    return None


def violations(root: Path) -> list[str]:
    found = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root)
        if rel.parts[0] not in PROJECT or any(p.startswith(".") for p in rel.parts):
            continue
        if rel.parts[0] != "tests":
            n = len(path.read_text().splitlines())
            if n > MAX_LINES:
                found.append(f"{rel}: {n} lines (at most {MAX_LINES} outside tests/)")
        module = module_name(path, root)
        flagged: set[int] = set()  # one report per import statement
        for line, name in imports(path, root):
            why = rule_violations(module, name)
            if why and line not in flagged:
                flagged.add(line)
                found.append(f"{rel}:{line}: imports {name}: {why}")
    return found


if __name__ == "__main__":
    problems = violations(Path(__file__).resolve().parents[1])
    print("\n".join(problems) or "layout ok")
    sys.exit(1 if problems else 0)
