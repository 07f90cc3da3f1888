"""Writing a file so that a kill leaves either the old file or the new one, never a mix."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def atomic_write(path: str | Path, data: bytes | str) -> None:
    """Write into a temporary file in the same folder, fsync, then rename over `path`. The file gets
    the permissions a plain `open(path, "w")` would (a temporary file is created 0600)."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data.encode() if isinstance(data, str) else data)
            f.flush()
            os.fsync(f.fileno())
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def restart_jsonl_at(path: str | Path, start_step: int) -> int:
    """Prepare a per-step JSON-lines file for a run that starts at `start_step`: a fresh run (0) empties
    it; a resumed run keeps the rows of earlier steps (those past its checkpoint are redone and would
    otherwise appear twice) and drops a torn last line a killed writer can leave. Rows are kept byte
    for byte and the rewrite is atomic. Returns the rows dropped."""
    import json

    path = Path(path)
    if start_step <= 0 or not path.exists():
        path.write_bytes(b"")
        return 0
    kept: list[bytes] = []
    dropped = 0
    with open(path, "rb") as f:
        for line in f:
            try:
                step = json.loads(line)["step"] if line.endswith(b"\n") else None  # no newline: torn
            except (ValueError, KeyError, TypeError):
                step = None
            if isinstance(step, int) and step < start_step:
                kept.append(line)
            else:
                dropped += 1
    atomic_write(path, b"".join(kept))
    return dropped
