"""The configuration reference page, generated from the config schema so it cannot drift from what the
loader accepts: every section of the run's tree (`agentrl.config.schema.Config`) and of the stages'
(`agentrl.config.stages.StageConfig`), each key with its type, default, bounds and description. A key
added to the schema appears here with no edit of any page.

Used as a mkdocs hook (`hooks:` in mkdocs.yml): `on_files` adds the page `configuration-reference.md`
to the site at build time, so nothing generated is kept in the repository. `python
docs/gen_config_reference.py` prints the same markdown. The walk is the one `--help` makes
(agentrl/config/help.py): nested sections depth first, a typed sub-config (algo.kl) as one key whose
default is its type and then one section per type, reward sources once per `type`, named entries
(tools.servers) as `NAME`.
"""

from __future__ import annotations

import json
import sys
import typing
from pathlib import Path
from typing import Any, Literal

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # the repository's own agentrl, also where it is not installed
    sys.path.insert(0, str(ROOT))

from pydantic import BaseModel  # noqa: E402
from pydantic.fields import FieldInfo  # noqa: E402

from agentrl.config.help import default_text  # noqa: E402
from agentrl.config.load import is_source_list, named_model, nested_model  # noqa: E402
from agentrl.config.schema import Config  # noqa: E402
from agentrl.config.sources import SOURCE_TYPES  # noqa: E402
from agentrl.config.stages import StageConfig  # noqa: E402
from agentrl.config.variants import type_names, variants  # noqa: E402

PAGE = "configuration-reference.md"

INTRO = """# Configuration reference

Generated from the config schema (`agentrl/config/`) when the site is built: every section, key, type,
default, bounds and description, as the loader checks them. Set a key in the YAML file given to
`--config` (sections as mappings: `buffer: {max_staleness: 2}`) or as a `dotted.key=value` argument,
which wins over the file; an unknown key is an error naming the nearest valid one. `python -m
agentrl.train --help` lists the same keys in a terminal. How the pieces are used: [Configuration](configuration.md).
"""

# annotated_types / pydantic metadata -> how a bound reads
BOUNDS = {"ge": ">= {}", "gt": "> {}", "le": "<= {}", "lt": "< {}", "multiple_of": "multiple of {}",
          "min_length": "length >= {}", "max_length": "length <= {}", "pattern": "matches `{}`"}


def cell(text: str) -> str:
    """Text safe inside a markdown table cell: no pipe ends the cell, no `<x>` is read as HTML."""
    return text.replace("|", "\\|").replace("<", "&lt;").replace(">", "&gt;").replace("\n", " ")


def type_text(ann: Any) -> str:
    """An annotation as a reader writes it: int, float, str | None, list[str], one of "a", "b"."""
    if ann is type(None):
        return "None"
    origin = typing.get_origin(ann)
    if origin is Literal:
        return "one of " + ", ".join(f'"{a}"' if isinstance(a, str) else str(a) for a in typing.get_args(ann))
    if origin is typing.Annotated:
        return type_text(typing.get_args(ann)[0])
    if origin is typing.Union or type(ann).__name__ == "UnionType":
        return " | ".join(type_text(a) for a in typing.get_args(ann))
    if origin is not None:
        name = getattr(origin, "__name__", str(origin))
        return f"{name}[{', '.join(type_text(a) for a in typing.get_args(ann))}]"
    if ann is Any:
        return "any"
    return getattr(ann, "__name__", str(ann))


def bounds_text(field: FieldInfo) -> str:
    """The field's bounds (`>= 0, <= 1`), from the constraints pydantic checks."""
    found = []
    for item in field.metadata:
        for name, form in BOUNDS.items():
            value = getattr(item, name, None)
            if value is not None:
                found.append(form.format(value))
    return ", ".join(found)


def field_type(model: type[BaseModel], name: str, field: FieldInfo) -> str:
    members = variants(field.annotation)
    if members:
        kinds = [kind for m in members for kind in type_names(m)]
        return "typed sub-config: `type` one of " + ", ".join(f'"{k}"' for k in kinds)
    if is_source_list(model, name):
        return "list of reward sources (one section per `type` below)"
    named = named_model(field.annotation)
    if named is not None:
        return f"mapping of name -> {named.__name__}"
    return type_text(field.annotation)


def rows(model: type[BaseModel], prefix: str) -> list[str]:
    """The table of a section's own keys (its nested sections are tables of their own)."""
    out = []
    for name, field in model.model_fields.items():
        if nested_model(field.annotation) is not None:
            continue
        default = _default(field)
        desc = " ".join((field.description or "").split())
        out.append(f"| `{prefix}{name}` | {cell(field_type(model, name, field))} | {cell(default)} | "
                   f"{cell(bounds_text(field))} | {cell(desc)} |")
    if not out:
        return []
    return ["| key | type | default | bounds | description |", "|---|---|---|---|---|", *out, ""]


def _default(field: FieldInfo) -> str:
    """The default in full (`--help` cuts long ones to fit a terminal; a page has the room), in backticks."""
    text = default_text(field)
    if text == "(required)":
        return text
    value = None if field.is_required() else field.get_default(call_default_factory=True)
    if text.endswith("...") and isinstance(value, (list, tuple, dict, str)):
        text = json.dumps(value, ensure_ascii=False) if not isinstance(value, str) else value
    return f"`{text}`" if text else '`""`'


def doc(model: type[BaseModel]) -> str:
    """A section's docstring, paragraphs kept."""
    paragraphs = (model.__doc__ or "").strip().split("\n\n")
    return "\n\n".join(" ".join(p.split()) for p in paragraphs if p.strip())


def section(model: type[BaseModel], prefix: str, title: str, lead: str, shown: set[str]) -> list[str]:
    """One section's heading, docstring and table, then its subsections, depth first. `shown`: the
    typed sub-config sections already written (a type reached twice is written once)."""
    lines = [f"### {title}", ""]
    text = doc(model) or lead
    lines += [text.replace("<", "&lt;").replace(">", "&gt;"), ""] if text else []
    lines += rows(model, prefix)
    for name, field in model.model_fields.items():
        key = prefix + name
        nested = nested_model(field.annotation)
        if nested is not None:
            lines += section(nested, key + ".", f"`{key}`", field.description or "", shown)
        for member in variants(field.annotation):
            head = f"`{key}`, type {' / '.join(f'`{k}`' for k in type_names(member))}"
            if head not in shown:
                shown.add(head)
                lines += section(member, key + ".", head, "", shown)
        named = named_model(field.annotation)
        if named is not None:
            lines += section(named, key + ".NAME.", f"`{key}.NAME`", field.description or "", shown)
        if is_source_list(model, name):
            for kind, source in SOURCE_TYPES.items():
                lines += section(source, key + ".N.", f"`{key}.N`, type `{kind}`", "", shown)
    return lines


def tree(model: type[BaseModel], heading: str, intro: str) -> list[str]:
    """A whole config tree: its top-level keys (if any), then one section per key, depth first."""
    lines = [f"## {heading}", "", intro, ""]
    shown: set[str] = set()
    top = rows(model, "")
    if top:
        lines += ["### Top level", "", *top]
    for name, field in model.model_fields.items():
        nested = nested_model(field.annotation)
        if nested is not None:
            lines += section(nested, name + ".", f"`{name}`", field.description or "", shown)
    return lines


def reference() -> str:
    """The page's markdown."""
    lines = [INTRO]
    lines += tree(Config, "RL runs: `agentrl.train`, `agentrl.eval`, `agentrl.check`, `agentrl.replay`",
                  "The tree of an RL run's YAML file (`agentrl.config.schema.Config`).")
    lines += tree(StageConfig, "Stages before RL: `agentrl.sft`, `rm`, `prm`, `dpo`, `kto`",
                  "The stage CLIs' tree (`agentrl.config.stages.StageConfig`); `--help` of each CLI also "
                  "names the bare flag that sets a key (`--max_len` for `data.max_len`).")
    return "\n".join(lines).rstrip() + "\n"


def on_files(files, config):
    """mkdocs hook: the page, generated from the schema, added to the site's files."""
    from mkdocs.structure.files import File

    files.append(File.generated(config, PAGE, content=reference()))
    return files


if __name__ == "__main__":
    sys.stdout.write(reference())
