"""The config keys as `--help` lists them, generated from the schema so the list cannot drift from what
the loader accepts: each section's docstring as its header, then one line per key with its default and
its field description.

    [buffer] Batch assembly and the staleness bound.
      buffer.batch_size = 64    episodes per learner batch (multiple of n_samples)
      buffer.max_staleness = 1  max learner version minus oldest token version; 0 = on-policy

A key's line holds key, default and the start of its description, so `--help | grep staleness` finds
all three; a longer description wraps under its own column, each section's column placed where its
lines are fewest. `None` shows as `unset`, a Literal's
choices as `{a|b}`, a required key as `(required)`. Reward sources are listed once per `type`, as
`rewards.sources.N.<key>`; a typed sub-config (algo.kl) as its own key, whose default is the default's
type, then one section per type (`[algo.kl, type: loss]`). Used by `agentrl.train`, `agentrl.eval` and `agentrl.stage_cli`.
"""

from __future__ import annotations

import json
import textwrap
import typing
from collections.abc import Callable, Collection
from typing import Any, Literal

from pydantic import BaseModel
from pydantic.fields import FieldInfo

from agentrl.config.load import is_source_list, nested_model
from agentrl.config.variants import type_names, variants
from agentrl.config.sources import SOURCE_TYPES

WIDTH = 100  # columns of the terminal the list is laid out for
MAX_COLUMN = 56  # descriptions start at most here, keeping them 44 columns wide or more
MAX_VALUE = 40  # a longer default is cut, so one value cannot push its description off the screen

HOW_TO_SET = ("Config keys and their defaults. Set them in the YAML file given to --config (sections as "
              "mappings: `buffer: {max_staleness: 2}`) or as dotted.key=value arguments "
              "(buffer.max_staleness=2), which win over the file.")

Flags = Callable[[str], str | None]  # dotted key -> the bare flag that sets it ('--max_len'), or None


def choices(ann: Any) -> list[str]:
    """The values of a Literal annotation, also inside `list[...]` or `... | None`; [] when there is none."""
    if typing.get_origin(ann) is Literal:
        return [str(a) for a in typing.get_args(ann)]
    for arg in typing.get_args(ann):
        found = choices(arg)
        if found:
            return found
    return []


def value_text(value: Any) -> str:
    """A default as a user would write it in YAML or an override: unset, true, 0.05, ["jsonl"]."""
    if value is None:
        text = "unset"
    elif isinstance(value, bool):
        text = "true" if value else "false"
    elif isinstance(value, BaseModel) and hasattr(value, "type"):  # a typed sub-config: its short form
        text = str(value.type)
    elif isinstance(value, str):
        text = value if value and value.strip() == value else json.dumps(value)
    elif isinstance(value, (list, tuple, dict)):
        text = json.dumps(value, ensure_ascii=False)
    else:
        text = str(value)
    return text if len(text) <= MAX_VALUE else text[: MAX_VALUE - 3] + "..."


def default_text(field: FieldInfo) -> str:
    """The default of a field; a required one-value Literal (a reward source's `type`) shows its value."""
    if field.is_required():
        only = choices(field.annotation)
        return only[0] if len(only) == 1 else "(required)"
    return value_text(field.get_default(call_default_factory=True))


def description(field: FieldInfo) -> str:
    """The field's description on one line, after the choices of a Literal with more than one."""
    text = " ".join((field.description or "").split())
    options = choices(field.annotation)
    return f"{{{'|'.join(options)}}} {text}".strip() if len(options) > 1 else text


def _doc(model: type[BaseModel]) -> str:
    """The first paragraph of a section's docstring, on one line."""
    return " ".join((model.__doc__ or "").strip().split("\n\n")[0].split())


def _wrap(text: str, width: int) -> list[str]:
    # Whole words only: a key, flag or URL is never split, and the lines joined by spaces give the text back.
    return textwrap.wrap(text, width, break_long_words=False, break_on_hyphens=False)


def _rows(left: str, text: str, column: int) -> list[str]:
    if not text:
        return [left]
    pad = " " * column
    parts = _wrap(text, WIDTH - column)
    if len(left) + 2 > column:  # argparse's layout for a long option: its help on the lines below
        return [left] + [pad + p for p in parts]
    return [left.ljust(column) + parts[0]] + [pad + p for p in parts[1:]]


def _columns(rows: list[tuple[str, str]]) -> list[int]:
    """Where a section's descriptions may start: two after the end of one of its key lines."""
    return sorted({min(len(left) + 2, MAX_COLUMN) for left, _ in rows})


def _laid_out(rows: list[tuple[str, str]], column: int) -> tuple[int, list[str]]:
    """The rows with their descriptions at `column`, and what that costs: the lines, counting twice a key
    line too long for the column (its description starts below it, breaking the column)."""
    lines = [line for left, text in rows for line in _rows(left, text, column)]
    return len(lines) + sum(len(left) + 2 > column for left, text in rows if text), lines


def _section(model: type[BaseModel], prefix: str, header: str, flags: Flags | None,
             skip: Collection[str], shown: set[str] | None = None) -> list[str]:
    """Header and key lines of one section, then its subsections, depth first. `shown`: the headers of
    typed sub-configs already listed (algo.kl.controller's types appear once, under the first kl type)."""
    shown = set() if shown is None else shown
    lines: list[str] = []
    fields = model.model_fields
    rows = []
    for name, field in fields.items():
        if nested_model(field.annotation) is None:
            key = prefix + name
            flag = flags(key) if flags is not None else None
            rows.append((f"  {flag + ', ' if flag else ''}{key} = {default_text(field)}", description(field)))
    if rows:
        lines += ["", *_wrap(header, WIDTH)]
        lines += min((_laid_out(rows, column) for column in _columns(rows)), key=lambda laid: laid[0])[1]
    for name, field in fields.items():
        key = prefix + name
        nested = nested_model(field.annotation)
        if nested is not None and key not in skip:
            lines += _section(nested, key + ".", f"[{key}] {_doc(nested) or field.description or ''}", flags, skip,
                              shown)
        for member in variants(field.annotation) if key not in skip else ():
            head = f"[{key}, type: {' | '.join(type_names(member))}]"
            if head not in shown:
                shown.add(head)
                lines += _section(member, key + ".", f"{head} {_doc(member)}", flags, skip, shown)
        if is_source_list(model, name):
            for kind, source in SOURCE_TYPES.items():
                lines += _section(source, key + ".N.", f"[{key}.N, type: {kind}] {_doc(source)}", flags, skip)
    return lines


def keys_help(model: type[BaseModel], title: str = HOW_TO_SET, flags: Flags | None = None,
              skip: Collection[str] = ()) -> str:
    """Every key of `model`'s tree, grouped by section, under `title`. `flags` names the bare flag of a
    key where a CLI has one; sections whose dotted key is in `skip` are left out with their subsections."""
    lines = _wrap(title, WIDTH) + _section(model, "", f"[{model.__name__}] {_doc(model)}", flags, skip)
    return "\n".join(lines) + "\n"
