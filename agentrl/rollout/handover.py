"""Where weight hand-over files live: /dev/shm (a RAM-backed filesystem) when it has room, else the temp
folder. Both sides of a push use it: the learner's `EngineWeightSync` on one machine, and a Ray engine
actor that writes the object store's bytes to a file its vLLM worker can read by name.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

SHM = Path("/dev/shm")


def handover_dir(preferred: str | None, need_bytes: int) -> Path:
    """/dev/shm when it has room (containers often mount only 64 MB there), else the temp folder."""
    if preferred:
        return Path(preferred)
    if SHM.is_dir() and os.access(SHM, os.W_OK) and shutil.disk_usage(SHM).free > 2 * need_bytes:
        return SHM
    return Path(tempfile.gettempdir())


def write_handover(data, name: str, preferred: str | None = None) -> Path:
    """Write `data` (bytes or a uint8 buffer: a safetensors file's contents) as `name`, atomically."""
    view = memoryview(data).cast("B")
    path = handover_dir(preferred, view.nbytes) / name
    tmp = path.with_name(path.name + ".part")
    with open(tmp, "wb") as f:
        f.write(view)
    tmp.rename(path)
    return path
