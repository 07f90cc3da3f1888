"""The layout's rules, checked by walking every import (also those inside functions):

  * `agentrl/config` imports nothing of the project but itself, `agentrl.types`, and the leaf registries
    `agentrl.algo` and `agentrl.rollout.tools` with their lookup `agentrl.utils.registry` (names checked by
    validators); never `rewards`, `envs`, rollout, the learner, DeepSpeed or vLLM;
  * `agentrl/algo` imports only torch and the standard library;
  * `agentrl/rollout` imports neither DeepSpeed nor `agentrl.learner`;
  * `rewards/` never imports `agentrl.learner`;
  * `agentrl/learner` imports nothing of `agentrl.rollout` (the weights' two ends meet in `agentrl.weights`);
  * no component imports `agentrl.train` (the wiring sits on top), and nothing but tests imports
    `agentrl.cli` (the `agentrl` script runs each command by its one module name, `agentrl.train`);
  * imports point down: every unit (the longest name in `TIERS` a module's name starts with: a package,
    a sub-package or one module) of `agentrl/`, `envs/` and `rewards/` sits in one tier of `TIERS`, and
    imports only units of its own tier or of tiers below;
  * no import circles among the project's files (imports at any depth, except under
    `if TYPE_CHECKING:`, which never run), found as strongly connected components;
  * no non-test Python file is over 400 lines.

Run it as `python tests/check_layout.py` (prints each violation, exits 1 if any); tests/test_layout.py
runs it in the suite.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

MAX_LINES = 400
CONFIG_MAY_IMPORT = ("agentrl.config", "agentrl.types", "agentrl.algo", "agentrl.rollout.tools", "agentrl.utils.registry")
CONFIG_MAY_NOT = ("agentrl.rollout.tools.client", "agentrl.rollout.tools.budget", "agentrl.rollout.tools.counts")
PROJECT = ("agentrl", "rewards", "envs", "examples", "bench", "tests")
LIBRARY = ("agentrl", "envs", "rewards")  # what the tier and circle rules cover

# Lowest first. A unit is the longest name listed here that a module's name starts with (a package, a
# sub-package or one module); a unit may import its own tier and the tiers below, and within a tier the
# circle rule keeps the arrows one-way. Each tier has a heading; docs/layout.md's tree and tier table are
# generated from this table (docs/gen_layout.py), so the layout is written once.
TIERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("leaves: nothing of the project above them",
     ("agentrl", "agentrl.types", "agentrl.algo", "agentrl.utils", "agentrl.utils.faults", "agentrl.utils.tracebacks",
      "agentrl.utils.stdio", "agentrl.utils.files", "agentrl.utils.padding", "agentrl.utils.process_exit",
      "agentrl.utils.registry",
      "agentrl.telemetry", "agentrl.telemetry.plot", "agentrl.rollout.tools")),
    ("the validated config tree", ("agentrl.config",)),
    ("pieces the components share",
     ("agentrl.utils.http_common", "agentrl.data.chat", "agentrl.telemetry.trackers", "agentrl.run.buffer",
      "agentrl.telemetry.learning_signal", "agentrl.telemetry.metrics")),
    ("remote tools", ("agentrl.rollout.tools.client", "agentrl.rollout.tools.budget")),
    ("what a user writes, and the data it reads", ("agentrl.env", "agentrl.data")),
    ("the components a run is made of", ("rewards", "envs", "agentrl.rollout", "agentrl.weights")),
    ("the learner", ("agentrl.learner",)),
    ("Ray, the embedded default and its teacher, checkpoints",
     ("agentrl.run.cluster", "agentrl.models.default", "agentrl.models.demos", "agentrl.run.checkpoint")),
    ("named pretrained models", ("agentrl.models",)),
    ("start-up: checks, building and stopping engines and ranks", ("agentrl.run.startup",)),
    ("one RL run: set-up, loop, checkpoints, clean-up", ("agentrl.run",)),
    ("the command lines, and the agentrl script that runs them",
     ("agentrl.train", "agentrl.eval", "agentrl.serve", "agentrl.replay", "agentrl.check", "agentrl.stage_cli",
      "agentrl.lora_merge", "agentrl.sft", "agentrl.rm", "agentrl.prm", "agentrl.dpo", "agentrl.kto", "agentrl.view",
      "agentrl.cli")),
)
UNITS = {u for _, units in TIERS for u in units}


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


def unit(name: str) -> str:
    """The layout unit of a module: the longest name in TIERS it starts with; else `agentrl.<top>` for
    agentrl's, or the top-level package."""
    parts = name.split(".")
    for n in range(len(parts), 1, -1):  # the package itself ("agentrl") is only its own __init__
        if ".".join(parts[:n]) in UNITS:
            return ".".join(parts[:n])
    return ".".join(parts[:2]) if parts[0] == "agentrl" else parts[0]


def tier(name: str) -> int | None:
    u = unit(name)
    return next((i for i, (_, units) in enumerate(TIERS) if u in units), None)


def _tier_violation(module: str, name: str) -> str | None:
    if not (_within(module, LIBRARY) and _within(name, LIBRARY)) or unit(module) == unit(name):
        return None
    mine, theirs = tier(module), tier(name)
    if mine is None:
        return f"{unit(module)} is in no tier of tests/check_layout.py TIERS (place it there)"
    if theirs is not None and theirs > mine:
        return f"imports point down: {unit(module)} (tier {mine}) imports {unit(name)} (tier {theirs})"
    return None


def _within(name: str, prefixes: tuple[str, ...]) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


def rule_violations(module: str, name: str) -> str | None:
    """Why `module` may not import `name`, or None."""
    if _within(module, ("agentrl.config",)):
        if _within(name, PROJECT) and (not _within(name, CONFIG_MAY_IMPORT) or _within(name, CONFIG_MAY_NOT)):
            return ("agentrl/config imports only agentrl.config, agentrl.types and the registries algo and rollout.tools "
                    "(and their lookup, agentrl.utils.registry)")
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
    if _within(name, ("agentrl.cli",)) and not _within(module, ("tests",)):
        return "nothing imports agentrl.cli (the agentrl script runs the commands by name)"
    if _within(module, ("agentrl.learner",)) and _within(name, ("agentrl.rollout",)):
        return "agentrl/learner knows nothing of agentrl.rollout (weights go through agentrl.weights)"
    if module != "agentrl.train" and _within(name, ("agentrl.train",)) and not _within(module, ("tests",)):
        return "components never import agentrl.train"
    return _tier_violation(module, name)


def runtime_imports(path: Path, root: Path) -> list[str]:
    """Module names imported anywhere in the file except under `if TYPE_CHECKING:` (never run)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    skip = {id(n) for node in ast.walk(tree) if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
            for b in node.body for n in ast.walk(b)}
    wanted = {(node.lineno, node.col_offset) for node in ast.walk(tree)
              if isinstance(node, (ast.Import, ast.ImportFrom)) and id(node) not in skip}
    lines = {line for line, _ in wanted}
    return [name for line, name in imports(path, root) if line in lines]


def circles(root: Path) -> list[list[str]]:
    """Strongly connected components (size > 1) of the import graph of LIBRARY's modules. Importing a
    name resolves to the longest module prefix; a package's circles with its own children through
    its `__init__` re-exports are not circles of the design and are left out."""
    files = {module_name(p, root): p for top in LIBRARY if (root / top).is_dir() for p in (root / top).rglob("*.py")}

    def resolve(name: str) -> str | None:
        while name and name not in files:
            name = name.rpartition(".")[0]
        return name or None

    graph = {m: {r for n in runtime_imports(p, root) if (r := resolve(n)) and r != m} for m, p in files.items()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []

    def strong(v: str) -> None:  # Tarjan
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                found.append(sorted(comp))

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10 * len(files) + 100))
    for v in sorted(graph):
        if v not in index:
            strong(v)
    return [c for c in found if not any(all(_within(x, (p,)) for x in c) for p in c)]


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
    found += [f"import circle: {' -> '.join(c)}" for c in circles(root)]
    return found


if __name__ == "__main__":
    problems = violations(Path(__file__).resolve().parents[1])
    print("\n".join(problems) or "layout ok")
    sys.exit(1 if problems else 0)
