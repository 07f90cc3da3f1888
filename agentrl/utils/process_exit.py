"""Leave a command quickly once its work is done.

A process that imported torch, vLLM and DeepSpeed holds millions of objects; the interpreter's final
garbage collection at exit scans them all (seconds on a small CPU) to free memory the operating system
takes back anyway. Freezing the heap first (`gc.freeze`) leaves it out of that scan; exit hooks still
run, files are still flushed and closed.
"""

from __future__ import annotations

import gc
import sys
from typing import Any, Callable


def run_and_exit(main: Callable[..., int | None], *args: Any) -> None:
    """`sys.exit(main(*args))` for a command line's `__main__`, without the final collection."""
    code = main(*args)
    gc.freeze()
    sys.exit(code)
