"""The driver's state as JSON: the codec of `driver.json`, so that loading a checkpoint never runs code.

JSON holds dicts with string keys, lists, strings, numbers (NaN and infinities as Python's `json`
writes them), booleans and null. Everything else a component's state dict holds is written as a
tagged object `{"$t": kind, ...}`:

    tuple, set               {"$t": "tuple" | "set", "v": [...]}
    Counter                  {"$t": "Counter", "v": {key: count}}
    defaultdict(Cls)         {"$t": "defaultdict", "f": "Cls", "v": ...}   Cls one of DATACLASSES
    a dict that is not plain {"$t": "dict", "v": [[key, value], ...]}    non-string keys, or a "$t" key
    dataclass instance       {"$t": "dc", "c": "Episode", "v": {field: value}}   only DATACLASSES
    anything else            {"$t": "repr", "type": "pkg.Class", "v": repr(x)}  read back as that string

Decoding builds only the containers above and the dataclasses named in `DATACLASSES` (a fixed
allow-list, like `torch.serialization.add_safe_globals`); an unknown tag or class is a CheckpointError.
The `repr` fallback is for what user code leaves in an episode's `info` (an Env may put any object
there): a checkpoint must not fail over it, and a resumed run sees its text (logged once per type).
"""

from __future__ import annotations

import dataclasses
import importlib
import logging
from collections import Counter, defaultdict
from typing import Any

log = logging.getLogger(__name__)

TAG = "$t"
# name in the file -> "module:qualname"; imported when first decoded (rewards sits beside agentrl.rollout)
DATACLASSES: dict[str, str] = {
    "Turn": "agentrl.types:Turn", "Segment": "agentrl.types:Segment", "Episode": "agentrl.types:Episode",
    "Group": "agentrl.types:Group", "ToolCallStats": "agentrl.rollout.tools.counts:ToolCallStats",
    "SourceStats": "rewards.sources:SourceStats",
}
_warned: set[str] = set()


class CheckpointError(ValueError):
    """A checkpoint that cannot be loaded: not a complete one, from an unsafe format, or malformed.
    The message names the file and what to do."""


def _class(name: str) -> type:
    where = DATACLASSES.get(name)
    if where is None:
        raise CheckpointError(f"class {name!r} is not one a checkpoint may hold (allowed: {sorted(DATACLASSES)})")
    module, _, qualname = where.partition(":")
    return getattr(importlib.import_module(module), qualname)


def _name_of(cls: type) -> str | None:
    name = cls.__name__
    where = DATACLASSES.get(name)
    return name if where == f"{cls.__module__}:{cls.__qualname__}" else None


def encode(obj: Any) -> Any:
    """`obj` as a JSON-ready value (see the module docstring)."""
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return obj
    if isinstance(obj, list):
        return [encode(x) for x in obj]
    if isinstance(obj, tuple) and not hasattr(obj, "_fields"):
        return {TAG: "tuple", "v": [encode(x) for x in obj]}
    if isinstance(obj, (set, frozenset)):
        return {TAG: "set", "v": [encode(x) for x in obj]}
    if isinstance(obj, Counter):
        return {TAG: "Counter", "v": _encode_dict(dict(obj))}
    if isinstance(obj, defaultdict):
        factory = obj.default_factory
        name = _name_of(factory) if isinstance(factory, type) else None
        if name is not None:
            return {TAG: "defaultdict", "f": name, "v": _encode_dict(dict(obj))}
        return _encode_dict(dict(obj))
    if isinstance(obj, dict):
        return _encode_dict(obj)
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        name = _name_of(type(obj))
        if name is not None:
            return {TAG: "dc", "c": name, "v": {f.name: encode(getattr(obj, f.name)) for f in dataclasses.fields(obj)}}
    if type(obj).__module__ == "numpy" and hasattr(obj, "tolist"):  # numpy scalars and arrays: plain numbers
        return encode(obj.tolist())
    return _as_repr(obj)


def _encode_dict(obj: dict) -> Any:
    if all(isinstance(k, str) for k in obj) and TAG not in obj:
        return {k: encode(v) for k, v in obj.items()}
    return {TAG: "dict", "v": [[encode(k), encode(v)] for k, v in obj.items()]}


def _as_repr(obj: Any) -> dict[str, Any]:
    kind = f"{type(obj).__module__}.{type(obj).__qualname__}"
    if kind not in _warned:
        _warned.add(kind)
        log.warning("checkpoint: a %s (in a component's state, e.g. an episode's info) is not plain data; "
                    "it is kept as its repr() text, which a resumed run reads back as a string", kind)
    return {TAG: "repr", "type": kind, "v": repr(obj)}


def decode(value: Any) -> Any:
    """The inverse of `encode` (a `repr` fallback comes back as its string)."""
    if isinstance(value, list):
        return [decode(x) for x in value]
    if not isinstance(value, dict):
        return value
    kind = value.get(TAG)
    if kind is None:
        return {k: decode(v) for k, v in value.items()}
    if kind == "tuple":
        return tuple(decode(x) for x in value["v"])
    if kind == "set":
        return {decode(x) for x in value["v"]}
    if kind == "Counter":
        return Counter(decode(value["v"]))
    if kind == "defaultdict":
        return defaultdict(_class(value["f"]), decode(value["v"]))
    if kind == "dict":
        return {decode(k): decode(v) for k, v in value["v"]}
    if kind == "repr":
        return value["v"]
    if kind == "dc":
        return _dataclass(value["c"], decode(value["v"]))
    raise CheckpointError(f"unknown tagged value {kind!r}")


def _dataclass(name: str, fields: dict[str, Any]) -> Any:
    cls = _class(name)
    known = {f.name: f for f in dataclasses.fields(cls)}
    unknown = set(fields) - set(known)
    if unknown:
        raise CheckpointError(f"{name} has no field(s) {sorted(unknown)} (a checkpoint of another agentrl version?)")
    obj = cls(**{k: v for k, v in fields.items() if known[k].init})
    for k, v in fields.items():
        if not known[k].init:
            setattr(obj, k, v)
    return obj
