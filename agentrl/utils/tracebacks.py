"""Where a user's code failed: an exception as one readable line naming the user's file and line, and
its full traceback. A leaf (standard library only), used wherever user code runs isolated: Env,
agent, reward rule.

The frame named is the innermost one in the user's own code, not in agentrl, the standard library or
an installed package: `json.loads` failing inside `my_env.py:41` is reported as `my_env.py:41`.
"""

from __future__ import annotations

import os
import sysconfig
import traceback
from pathlib import Path

_PACKAGE = str(Path(__file__).resolve().parents[1]) + os.sep  # agentrl/, not only agentrl/utils/
_LIBRARY = tuple({str(Path(p).resolve()) + os.sep for key in ("stdlib", "platstdlib", "purelib", "platlib")
                  if (p := sysconfig.get_paths().get(key))})


def _is_user_file(filename: str) -> bool:
    if filename.startswith("<"):  # <string>, <frozen ...>
        return False
    path = str(Path(filename).resolve())
    return not path.startswith(_PACKAGE) and not path.startswith(_LIBRARY)


def user_frame(exc: BaseException) -> traceback.FrameSummary | None:
    """The innermost frame of `exc`'s traceback in user code, or None when there is none."""
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if _is_user_file(f.filename)]
    return frames[-1] if frames else None


def where(exc: BaseException) -> str:
    """'my_env.py:41 in reset' for `exc`'s innermost user frame ('' when there is none)."""
    frame = user_frame(exc)
    return f"{frame.filename}:{frame.lineno} in {frame.name}" if frame else ""


def describe(exc: BaseException) -> tuple[str, str]:
    """(one line: 'TypeError: unhashable type: 'list' (at my_env.py:41 in reset)', full traceback)."""
    line = "".join(traceback.format_exception_only(type(exc), exc)).strip().replace("\n", " ")
    at = where(exc)
    return (f"{line} (at {at})" if at else line), "".join(traceback.format_exception(exc)).rstrip()
