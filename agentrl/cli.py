"""`agentrl <command> [args ...]`: the `agentrl` script, one name for every command line.

`agentrl train --config x.yaml train.steps=3` runs exactly what `python -m agentrl.train --config x.yaml
train.steps=3` runs: the command's module as `__main__` (runpy, as `-m` does, with the current folder
first on `sys.path`), its arguments passed through untouched; only its usage names it `agentrl train`
(agentrl.utils.prog). `agentrl --help` lists the commands, each with the first sentence of its module's
docstring, read from the source: nothing of the commands (torch, vLLM) is imported for the list.
`agentrl help CMD` is `agentrl CMD --help`. An unknown command names the nearest one and exits 2, as
does `agentrl` alone (after the list, on stderr).
"""

from __future__ import annotations

import ast
import difflib
import os
import re
import runpy
import sys
from pathlib import Path
from typing import TextIO

from agentrl.utils import prog as prog_module

SCRIPT = "agentrl"
# Each is `python -m agentrl.<name>` too; tests/test_cli.py checks the list against the modules that run.
COMMANDS = ("train", "eval", "serve", "view", "check", "sft", "rm", "prm", "dpo", "kto", "replay", "lora_merge",
            "models")
WIDTH = 100  # the list's lines, at most


def source(command: str) -> Path:
    """The file `python -m agentrl.<command>` runs (a package runs its `__main__.py`)."""
    here = Path(__file__).resolve().parent
    return here / f"{command}.py" if (here / f"{command}.py").is_file() else here / command / "__main__.py"


def summary(command: str, room: int = WIDTH - 16) -> str:
    """The first sentence of the command's docstring, without its leading usage (`python -m ...`:); when
    it is longer than `room`, without its parentheses, then up to its first comma."""
    doc = ast.get_docstring(ast.parse(source(command).read_text())) or ""
    text = " ".join(doc.split("\n\n")[0].split())
    text = re.sub(r"^`[^`]*`:\s*", "", text)  # "`python -m agentrl.check [--config FILE] ...`: a dry run ..."
    first, depth, quoted = text, 0, False
    for i, ch in enumerate(text):  # a sentence ends at ". " or "; " outside `code` and (brackets)
        quoted ^= ch == "`"
        depth += (ch == "(") - (ch == ")")
        if ch in ".;" and not quoted and depth == 0 and text[i + 1:i + 2] in ("", " "):
            first = text[:i]
            break
    first = first[:1].upper() + first[1:]
    if len(first) > room:
        first = re.sub(r" \([^()]*\)", "", first)
    if len(first) > room and ", " in first[:room]:
        first = first.split(", ", 1)[0]
    return first if len(first) <= room else first[:room - 3].rsplit(" ", 1)[0] + "..."


def usage() -> str:
    rows = "\n".join(f"  {name:<12}  {summary(name)}" for name in COMMANDS)
    return (f"usage: {SCRIPT} <command> [args ...]\n"
            f"       {SCRIPT} <command> --help\n\n"
            f"Asynchronous RL for LLM agents. Each command is also `python -m agentrl.<command>`.\n\n"
            f"commands:\n{rows}\n\n"
            f"options:\n  -h, --help    this list\n  --version     the installed version\n")


def nearest(word: str) -> str | None:
    close = difflib.get_close_matches(word, COMMANDS, n=1, cutoff=0.5)
    return close[0] if close else None


def unknown(word: str, err: TextIO) -> int:
    what = "option" if word.startswith("-") else "command"
    print(f"{SCRIPT}: '{word}' is not an {SCRIPT} {what}.", file=err)
    near = nearest(word.lstrip("-"))
    if near:
        print(f"The most similar command is: {SCRIPT} {near}", file=err)
    print(f"See '{SCRIPT} --help' for the list.", file=err)
    return 2


def run(command: str, args: list[str]) -> int:
    """Run `agentrl.<command>` as `python -m` runs it, with `args` as its arguments."""
    if not sys.flags.safe_path:
        sys.path.insert(0, os.getcwd())  # what -m puts first: configs' env and reward paths import from here
    sys.argv = [str(source(command)), *args]
    prog_module.SCRIPT = SCRIPT
    runpy.run_module(f"agentrl.{command}", run_name="__main__", alter_sys=True)
    return 0  # a command that ends without sys.exit succeeded


def main(argv: list[str] | None = None, out: TextIO | None = None, err: TextIO | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    out, err = out or sys.stdout, err or sys.stderr
    if not argv:
        print(usage(), end="", file=err)
        return 2
    head, rest = argv[0], argv[1:]
    if head in ("-h", "--help"):
        print(usage(), end="", file=out)
        return 0
    if head == "--version":
        from importlib.metadata import PackageNotFoundError, version

        try:
            print(f"{SCRIPT} {version('agentrl')}", file=out)
        except PackageNotFoundError:
            print(f"{SCRIPT} (not installed)", file=out)
        return 0
    if head == "help":
        if not rest:
            print(usage(), end="", file=out)
            return 0
        head, rest = rest[0], ["--help"]
    if head not in COMMANDS:
        return unknown(head, err)
    return run(head, rest)
