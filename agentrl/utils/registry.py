"""Registry entries by their config name: estimators (`ADVANTAGES`), policy losses (`POLICY_LOSSES`), tool formats.

`"package.module:name"` imports package.module first and then takes `name` from the registry, so what a
user's module registers (`register_advantage`, `register_policy_loss`, `register_tool_parser`) is usable from
YAML (`algo.advantage: mypkg.algos:my_estimator`). The import happens wherever the name is looked up: when
the config is checked, and again where it is used, which may be another process (a Ray actor) that never
saw the user's module.
"""

from __future__ import annotations

import difflib
import importlib
from typing import TypeVar

V = TypeVar("V")


def lookup(registry: dict[str, V], name: str, key: str) -> V:
    """registry[name], importing name's module first when it has one; a ValueError naming `key` otherwise."""
    module, sep, short = name.rpartition(":")
    if sep:
        if not module or not short:
            raise ValueError(f"{key}={name!r} must be a registered name or look like 'package.module:name'")
        try:
            importlib.import_module(module)
        except (ImportError, TypeError) as exc:  # TypeError: importlib's answer to a relative module ('..:x')
            raise ValueError(f"{key}={name!r}: cannot import {module!r} ({exc})") from None
    fn = registry.get(short)
    if fn is None:
        near = difflib.get_close_matches(short, list(registry), n=1)
        hint = (f" after importing {module!r} (does it register {short!r}?)" if sep else
                "; a name your own module registers goes as 'package.module:name'")
        raise ValueError(f"{key}={name!r} is not one of {sorted(registry)}{hint}"
                         + (f"; did you mean {near[0]!r}?" if near else ""))
    return fn
