"""Files a kill may interrupt: writing one so that a kill leaves either the old file or the new one,
never a mix (`atomic_write`); folders built aside and renamed into place (`build_folder`, `publish_folder`);
and the one JSON-lines reader (`read_jsonl`, strict or tolerant of the
torn last line a killed writer leaves) with its one error, `JsonlError` ("path:line: what is wrong")."""

from __future__ import annotations

import json
import os
import shutil
import socket
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator


class JsonlError(ValueError):
    """A line of a JSON-lines file that cannot be read: `path:line: problem (detail)`, e.g.
    "a.jsonl:3: not valid JSON (Expecting value at column 7)". Readers whose messages name their
    config key re-word it from the fields."""

    def __init__(self, path: str | Path, line: int, problem: str, detail: str) -> None:
        self.path, self.line, self.problem, self.detail = str(path), line, problem, detail
        super().__init__(f"{path}:{line}: {self.what}")

    @property
    def what(self) -> str:
        return f"{self.problem} ({self.detail})"


@dataclass(frozen=True)
class JsonlLine:
    """One line of a JSON-lines file as stored, and what it holds."""

    number: int  # 1-based
    raw: bytes  # the bytes stored, its newline included (a torn last line has none)
    value: Any = None  # the parsed JSON; None on a blank or bad line
    problem: str | None = None  # why the line is not JSON ("not UTF-8 text", "not valid JSON"); None if it is
    detail: str = ""  # where and how: "byte 4", "Expecting value at column 7"

    @property
    def blank(self) -> bool:
        return not self.raw.strip()


def jsonl_lines(path: str | Path) -> Iterator[JsonlLine]:
    """Every line of a JSON-lines file, blank and bad ones included. Lines end at "\n" only: a JSON
    string may hold U+2028, where `str.splitlines` would cut a row in two (a "\r" is JSON whitespace)."""
    with open(path, "rb") as f:
        for number, raw in enumerate(f, 1):
            yield jsonl_line(number, raw)


def jsonl_line(number: int, raw: bytes) -> JsonlLine:
    """One stored line parsed (a reader that follows a growing file reads its lines one by one)."""
    if not raw.strip():
        return JsonlLine(number, raw)
    try:
        # without its line end, so a JSON error's column counts on this line, not the next
        return JsonlLine(number, raw, json.loads(raw.rstrip(b"\r\n").decode("utf-8")))
    except UnicodeDecodeError as exc:
        return JsonlLine(number, raw, problem="not UTF-8 text", detail=f"byte {exc.start}")
    except json.JSONDecodeError as exc:
        return JsonlLine(number, raw, problem="not valid JSON", detail=f"{exc.msg} at column {exc.colno}")
    except RecursionError:  # arrays or objects nested deeper than the parser's stack
        return JsonlLine(number, raw, problem="not valid JSON", detail="nested too deeply")


def read_jsonl(path: str | Path, *, strict: bool = True) -> Iterator[tuple[int, Any]]:
    """(line number, value) of every non-blank line, in file order; what each value must be (an
    object, with which keys) is the caller's to check. `strict`: a line that is not UTF-8 JSON raises
    JsonlError naming the file and line; tolerant (`strict=False`): such a line is skipped, for files
    a killed writer may have left with a torn line. A missing file raises OSError as `open` does."""
    for line in jsonl_lines(path):
        if line.problem is not None:
            if strict:
                raise JsonlError(path, line.number, line.problem, line.detail)
        elif not line.blank:
            yield line.number, line.value


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


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's live process
        return True
    return True


def build_folder(out: Path) -> Path:
    """A fresh, empty folder beside `out` to build it in, private to this host and process; `publish_folder`
    renames it into place. A build killed before publishing leaves its folder behind (a named model's
    weights, hundreds of MB; a warm start's SFT checkpoints): those of this host whose process is gone are
    removed first. A folder of another host (a shared cache) or of a live process is left alone; a reused
    pid only keeps one longer."""
    host = socket.gethostname().replace("/", "_")
    prefix = f".{out.name}.{host}."
    if out.parent.is_dir():
        for p in out.parent.iterdir():
            if not (p.name.startswith(prefix) and p.name.endswith(".tmp")):
                continue
            pid = p.name[len(prefix):-len(".tmp")]
            if pid.isdigit() and not _pid_alive(int(pid)):
                shutil.rmtree(p, ignore_errors=True)
    tmp = out.with_name(f"{prefix}{os.getpid()}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    return tmp


def publish_folder(tmp: Path, out: Path, marker: str) -> Path:
    """Rename the finished folder `tmp` to `out` (atomic: a reader sees all of it or none). When another
    process published `out` first, theirs is kept and `tmp` removed; an `out` without `marker` is what an
    interrupted build left, and is replaced."""
    for _ in range(3):  # each pass either publishes or clears a stale `out` that another may refill
        try:
            os.rename(tmp, out)
            return out
        except OSError:
            if (out / marker).exists():
                shutil.rmtree(tmp, ignore_errors=True)
                return out
            # Moved aside in one step, then deleted: of two processes that found the stale folder, one moves
            # it and the other's move fails, so neither renames into a half-deleted folder; each tries again,
            # and `out` ends as one complete build.
            aside = out.with_name(f".{out.name}.{os.getpid()}.stale")
            try:
                os.rename(out, aside)
            except FileNotFoundError:
                continue
            shutil.rmtree(aside, ignore_errors=True)
    os.rename(tmp, out)
    return out


def restart_jsonl_at(path: str | Path, start_step: int) -> int:
    """Prepare a per-step JSON-lines file for a run that starts at `start_step`: a fresh run (0) empties
    it; a resumed run keeps the rows of earlier steps (those past its checkpoint are redone and would
    otherwise appear twice) and drops a torn last line a killed writer can leave. Rows are kept byte
    for byte and the rewrite is atomic. Returns the rows dropped."""
    path = Path(path)
    if start_step <= 0 or not path.exists():
        # a new file, not the old one emptied: a link to the old one (a set-aside copy) keeps its rows
        atomic_write(path, b"")
        return 0
    kept: list[bytes] = []
    dropped = 0
    for line in jsonl_lines(path):
        value = line.value if line.raw.endswith(b"\n") else None  # no newline: torn
        step = value.get("step") if isinstance(value, dict) else None
        if isinstance(step, int) and step < start_step:
            kept.append(line.raw)
        else:
            dropped += 1
    atomic_write(path, b"".join(kept))
    return dropped
