"""Typed sub-configs: a field whose value is one of several models told apart by their `type` (the
`algo` section's advantage, kl, correction and trust_region; `agentrl.config.algo`). What the loader, `--help` and
`AlgoConfig` need to know of them: the members, which member a type picks, and where a key belongs.
"""

from __future__ import annotations

import typing
from typing import Any, Literal

from pydantic import BaseModel, Tag


def _union_parts(ann: Any) -> list[Any]:
    # Through Union and Annotated only: a list of a union (rewards.sources) is not a sub-config.
    if typing.get_origin(ann) in (typing.Union, typing.Annotated) or type(ann).__name__ == "UnionType":
        return [part for arg in typing.get_args(ann) for part in _union_parts(arg)]
    return [ann]


def variants(ann: Any) -> list[type[BaseModel]]:
    """The members of a typed sub-config (a union of models told apart by `type`, like algo.kl), else []."""
    members = [m for m in _union_parts(ann) if isinstance(m, type) and issubclass(m, BaseModel)
               and "type" in m.model_fields]
    return members if len(members) > 1 else []


def type_names(member: type[BaseModel]) -> list[str]:
    """The `type` values a member answers to; an open one (any name of a registry) lists its `registered()`."""
    ann = member.model_fields["type"].annotation
    if typing.get_origin(ann) is Literal:
        return list(typing.get_args(ann))
    return member.registered() if hasattr(member, "registered") else []


def member_for(members: list[type[BaseModel]], kind: Any) -> type[BaseModel] | None:
    """The member whose `type` is `kind`: a Literal that holds it, else the open member (if any)."""
    for member in members:
        if kind in type_names(member):
            return member
    return next((m for m in members if typing.get_origin(m.model_fields["type"].annotation) is not Literal), None)


def variant_tags(ann: Any) -> set[str]:
    """What pydantic puts in an error location after a typed sub-config's name: its members' tags."""
    found = {str(p.tag) for p in _union_parts(ann) if isinstance(p, Tag)}
    return found | {str(t) for m in variants(ann) for t in type_names(m)}


def misplaced(value: Any, members: list[type[BaseModel]], place: str) -> str | None:
    """The error for a key of `value` (a mapping with a known `type`) that belongs to another member,
    naming that member's type, also inside a typed sub-config of the chosen one; else None."""
    kind = value.get("type") if isinstance(value, dict) else None
    member = member_for(members, kind) if kind is not None else None
    if member is None:
        return None
    for key, sub in value.items():
        owners = [" or ".join(type_names(m)) for m in members if key in m.model_fields]
        if key not in member.model_fields and owners:
            return f"config key '{place}.{key}' belongs to {place} type {' / '.join(owners)}, not to type {kind}"
        inner = variants(member.model_fields[key].annotation) if key in member.model_fields else []
        problem = misplaced(sub, inner, f"{place}.{key}") if inner else None
        if problem:
            return problem
    return None
