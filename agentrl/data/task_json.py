"""Whether tasks survive JSON as themselves: checkpoints keep a run's tasks as JSON, so a task holding a
tuple, a set, a NaN or a non-string key would come back from a resume as something else. Pure functions,
used by the dry run (`agentrl.check`)."""

from __future__ import annotations

import contextlib
import json
import math
from typing import Any


def json_problem(value: Any, where: str = "") -> str | None:
    """Why `value` would not come back from JSON as itself, naming the key path; None when it would."""
    here = f"key {where!r}" if where else "the task"
    if value is None or isinstance(value, (str, bool, int)):
        return None
    if isinstance(value, float):
        return None if math.isfinite(value) else f"{here} holds {value}, which is not JSON"
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                return f"{here} has the {type(key).__name__} key {key!r} (JSON gives it back as a string)"
            if problem := json_problem(item, f"{where}.{key}" if where else key):
                return problem
        return None
    if isinstance(value, list):
        return next((p for i, item in enumerate(value) if (p := json_problem(item, f"{where}[{i}]"))), None)
    if isinstance(value, tuple):
        return f"{here} holds a {type(value).__name__} (JSON gives it back as a list)"
    return f"{here} holds a {type(value).__name__}, which JSON cannot write"


def tasks_problem(tasks: list[Any], split: str) -> str | None:
    """The first task of `split` that is not JSON, by index, id, key and type; None when all are."""
    with contextlib.suppress(TypeError, ValueError):
        if json.loads(json.dumps(tasks)) == tasks:
            return None
    for i, task in enumerate(tasks):
        if problem := json_problem(task):
            ident = f" (id {task['id']!r})" if isinstance(task, dict) and "id" in task else ""
            return f"{split} task {i}{ident} is not JSON: {problem}"
    return None
