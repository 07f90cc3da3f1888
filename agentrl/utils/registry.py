"""Registry entries by their config name: estimators (`ADVANTAGES`), policy losses (`POLICY_LOSSES`), tool formats.

`"package.module:name"` imports package.module first and then takes `name` from the registry, so what a
user's module registers (`register_advantage`, `register_policy_loss`, `register_tool_parser`) is usable from
YAML (`algo.advantage: mypkg.algos:my_estimator`). The import happens wherever the name is looked up: when
the config is checked, and again where it is used, which may be another process (a Ray actor) that never
saw the user's module.

`import_user_module` is the one way a user's module named in the config is imported (an Env, a reward rule,
a registry entry): what goes wrong inside it at import is a one-line ValueError naming its file and line.
"""

from __future__ import annotations

import difflib
import importlib
import traceback
from pathlib import Path
from types import ModuleType
from typing import TypeVar

from agentrl.utils.extras import MissingExtra
from agentrl.utils.tracebacks import user_frame

V = TypeVar("V")
_IMPORTLIB = Path(importlib.__file__).parent


def lookup(registry: dict[str, V], name: str, key: str) -> V:
    """registry[name], importing name's module first when it has one; a ValueError naming `key` otherwise."""
    module, sep, short = name.rpartition(":")
    if sep:
        if not module or not short:
            raise ValueError(f"{key}={name!r} must be a registered name or look like 'package.module:name'")
        try:
            import_user_module(module)
        except (ImportError, TypeError) as exc:  # TypeError: importlib's answer to a relative module ('..:x')
            raise ValueError(f"{key}={name!r}: cannot import {module!r} ({exc})") from None
        except ValueError as exc:  # the module failed while it ran
            raise ValueError(f"{key}={name!r}: {exc}") from None
    fn = registry.get(short)
    if fn is None:
        near = difflib.get_close_matches(short, list(registry), n=1)
        hint = (f" after importing {module!r} (does it register {short!r}?)" if sep else
                "; a name your own module registers goes as 'package.module:name'")
        raise ValueError(f"{key}={name!r} is not one of {sorted(registry)}{hint}"
                         + (f"; did you mean {near[0]!r}?" if near else ""))
    return fn


def import_user_module(name: str) -> ModuleType:
    """importlib.import_module(name); a module that is not there raises importlib's ImportError (the
    caller words it), anything raised while the module runs a ValueError of one line naming where:
    'envs/my_env.py:12 raised ZeroDivisionError at import: division by zero' (the innermost frame in the
    user's code; for a SyntaxError the line the parser stopped at)."""
    try:
        return importlib.import_module(name)
    except MissingExtra:
        raise  # an optional install that is not there: its own line names the install command
    except ModuleNotFoundError as exc:
        if exc.name and (name == exc.name or name.startswith(exc.name + ".")):
            raise  # `name` itself (or its package) is missing: not an error inside the user's code
        raise ValueError(raised_at_import(exc)) from None
    except (Exception, SystemExit) as exc:  # SystemExit: a module that parses argv or exits at import
        if not (isinstance(exc, SyntaxError) or _ran(exc)):
            raise  # importlib refused the name itself ('..', ''): the caller words it
        raise ValueError(raised_at_import(exc)) from None


def _ran(exc: BaseException) -> bool:
    """Whether the traceback reaches code outside importlib (the module's own, or what it called)."""
    return bool(_past_importlib(exc))


def _past_importlib(exc: BaseException) -> list[traceback.FrameSummary]:
    below = exc.__traceback__.tb_next if exc.__traceback__ else None  # past import_user_module's own frame
    return [f for f in traceback.extract_tb(below)
            if not f.filename.startswith("<") and Path(f.filename).parent != _IMPORTLIB]  # '<frozen ...>'


def raised_at_import(exc: BaseException) -> str:
    """'FILE:LINE raised TYPE at import: MESSAGE' on one line."""
    if isinstance(exc, SyntaxError):
        at, text = f"{_shown_path(exc.filename)}:{exc.lineno}", exc.msg
    else:
        # Without a frame in user code (a module installed in site-packages), the first frame past importlib
        # is the imported module's own line that failed.
        frames = _past_importlib(exc)
        frame = user_frame(exc) or (frames[0] if frames else None)
        at, text = (f"{_shown_path(frame.filename)}:{frame.lineno}" if frame else "?"), str(exc)
    text = " ".join(text.split())  # a message stays one line
    return f"{at} raised {type(exc).__name__} at import" + (f": {text}" if text else "")


def _shown_path(filename: str | None) -> str:
    """Relative to the working directory when the file is under it (as the user wrote it in the config)."""
    if not filename:
        return "?"
    path = Path(filename).resolve()
    return str(path.relative_to(Path.cwd())) if path.is_relative_to(Path.cwd()) else filename
