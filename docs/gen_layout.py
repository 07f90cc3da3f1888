"""The layout page's tree and import tiers, generated so the layout is written once: the tree from the
package itself (each folder's and module's docstring, first sentence), the tiers from the table the
layout test enforces (`TIERS` in tests/check_layout.py).

Used as a mkdocs hook (`hooks:` in mkdocs.yml): `on_page_markdown` replaces the marker line
`<!-- generated: layout -->` of docs/layout.md with the tree and the tier table. `python docs/gen_layout.py`
prints the same markdown.
"""

from __future__ import annotations

import ast
import importlib.util
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MARKER = "<!-- generated: layout -->"
TOP = ("agentrl", "envs", "rewards")
WIDTH = 24  # the name column of the tree


def checker():
    """tests/check_layout.py (a script, not a package module), loaded from its path."""
    spec = importlib.util.spec_from_file_location("check_layout", ROOT / "tests" / "check_layout.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def summary(path: Path, limit: int = 110) -> str:
    """The first sentence of a module's docstring, on one line, cut at `limit` characters."""
    doc = ast.get_docstring(ast.parse(path.read_text())) or ""
    text = " ".join(doc.split())
    usage = re.match(r"`(python -m agentrl|agentrl )[^`]*`:\s*", text)  # a command's usage: what it does follows
    if usage:
        text = text[usage.end():usage.end() + 1].upper() + text[usage.end() + 1:]
    # the first ". ", ": " or "; " outside `code` ends the sentence
    ends = [m.start() for m in re.finditer(r"[.:;](\s|$)", text) if text[: m.start()].count("`") % 2 == 0]
    first = text[: ends[0]] if ends else text
    return first if len(first) <= limit else first[: limit - 3].rstrip() + "..."


def tree_lines(folder: Path, depth: int) -> list[str]:
    """One line per package and module under `folder`, packages first, each with its summary."""
    out = []
    pad = "  " * depth
    subs = sorted(p for p in folder.iterdir() if p.is_dir() and any(p.glob("*.py")) and p.name != "__pycache__")
    mods = sorted(p for p in folder.glob("*.py") if p.name not in ("__init__.py", "__main__.py"))
    for sub in subs:
        init = sub / "__init__.py"
        note = summary(init) if init.exists() else ""
        out.append(f"{pad}{sub.name + '/':<{WIDTH - len(pad)}} {note}".rstrip())
        out += tree_lines(sub, depth + 1)
    for mod in mods:
        out.append(f"{pad}{mod.name:<{WIDTH - len(pad)}} {summary(mod)}".rstrip())
    return out


def tier_table(tiers) -> list[str]:
    rows = ["| tier | what | units (a unit imports its own tier and those above it in this table, never below) |",
            "|---|---|---|"]
    for i, (heading, units) in enumerate(tiers):
        rows.append(f"| {i} | {heading} | {', '.join(f'`{u}`' for u in units)} |")
    return rows


def markdown() -> str:
    lines = ["```"]
    for top in TOP:
        init = ROOT / top / "__init__.py"
        lines.append(f"{top + '/':<{WIDTH}} {summary(init) if init.exists() else ''}".rstrip())
        if top == "agentrl":
            lines += tree_lines(ROOT / top, 1)
    lines.append("```")
    return "\n".join(lines + ["", "## Import tiers", ""] + tier_table(checker().TIERS)) + "\n"


def on_page_markdown(markdown_text: str, page, config, files):  # noqa: ARG001 (mkdocs hook signature)
    if MARKER in markdown_text:
        return markdown_text.replace(MARKER, markdown())
    return markdown_text


if __name__ == "__main__":
    print(markdown())
