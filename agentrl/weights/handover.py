"""Where weight hand-over files live: /dev/shm (a RAM-backed filesystem) when it has room, else the temp
folder. Both sides of a push use it: the learner's `EngineWeightSync` on one machine, and a Ray engine
actor that writes the object store's bytes to a file its vLLM worker can read by name.

Why the care: /dev/shm and the temp folder are shared by every user of the machine. A file created
there with the default mode (0644) lets anyone read the weights, and a file opened with plain
O_CREAT follows a symlink someone planted at the name beforehand (writing the weights over a file of
their choosing) or loads bytes someone swapped in. So a process's hand-over files go into a folder of
its own (`mkdtemp`: a random name, mode 0700, created or refused, never reused), and every file is
created with O_CREAT|O_EXCL|O_NOFOLLOW, mode 0600: a name that already exists, a symlink included, is
an error, never followed. A folder the user configured (`weight_sync.handover_dir`) is used as given:
the files in it are still created exclusively and 0600.

A process killed with SIGKILL never runs its atexit hook, so its private folder (a model-sized
snapshot) would stay in RAM until reboot. Each private folder therefore holds a lock file the process
keeps flock'ed for its life; the kernel drops the lock when the process dies, however it dies. Making
its first private folder in a base, a process removes this user's folders there whose lock is free
(`sweep_stale`).
"""

from __future__ import annotations

import atexit
import errno
import fcntl
import logging
import os
import stat
import time
import shutil
import tempfile
from pathlib import Path

SHM = Path("/dev/shm")
_EXCLUSIVE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
LOCK = ".owner.lock"
# A folder younger than this is never swept: its maker may not have taken the lock yet (mkdtemp,
# then open, then flock: microseconds apart; a minute covers a process stopped in between).
SWEEP_MIN_AGE_S = 60.0
log = logging.getLogger(__name__)

# This process's private folders, per shared base folder; created on first use, removed at exit.
_private: dict[Path, Path] = {}


def handover_dir(preferred: str | None, need_bytes: int) -> Path:
    """/dev/shm when it has room (containers often mount only 64 MB there), else the temp folder."""
    if preferred:
        return Path(preferred)
    if SHM.is_dir() and os.access(SHM, os.W_OK) and shutil.disk_usage(SHM).free > 2 * need_bytes:
        return SHM
    return Path(tempfile.gettempdir())


def private_dir(base: Path) -> Path:
    """This process's own folder in the shared `base` (mode 0700, a random name `mkdtemp` creates or
    fails on: a planted folder or symlink is never reused). Removed when the process exits; a fork
    child inherits the mapping but removes only folders it created itself."""
    folder = _private.get(base)
    if folder is None or not folder.is_dir():
        if base not in _private:
            sweep_stale(base)
        folder = Path(tempfile.mkdtemp(prefix=f"agentrl-{os.getuid()}-", dir=base))
        # Held (not inherited across exec: O_CLOEXEC) until this process dies; never closed on purpose.
        fcntl.flock(create_exclusive(folder / LOCK), fcntl.LOCK_EX | fcntl.LOCK_NB)
        _private[base] = folder
        atexit.register(_remove, folder, os.getpid())
    return folder


def sweep_stale(base: Path) -> list[Path]:
    """Remove this user's private folders in `base` left by processes that died without cleaning up
    (SIGKILL, OOM kill, power cut of a container): a real folder (not a symlink) owned by this uid,
    named like ours, at least SWEEP_MIN_AGE_S old, whose lock file exists and can be locked now. Anything
    else (another user's, a live process's, one without a lock file) is left alone. The removed paths."""
    removed = []
    try:
        candidates = list(base.glob(f"agentrl-{os.getuid()}-*"))
    except OSError:
        return removed
    for folder in candidates:
        try:
            info = folder.lstat()
            if (not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid()
                    or time.time() - info.st_mtime < SWEEP_MIN_AGE_S):
                continue
            fd = os.open(folder / LOCK, os.O_RDONLY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0))
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            continue  # held: its process is alive
        finally:
            os.close(fd)
        shutil.rmtree(folder, ignore_errors=True)
        removed.append(folder)
    if removed:
        log.info("removed %d hand-over folder(s) left in %s by processes that were killed: %s", len(removed),
                 base, ", ".join(p.name for p in removed))
    return removed


def _remove(folder: Path, owner_pid: int) -> None:
    if os.getpid() == owner_pid:
        shutil.rmtree(folder, ignore_errors=True)


def handover_path(preferred: str | None, need_bytes: int, name: str) -> Path:
    """Where to write the hand-over file `name`: in the configured folder as given, else in this
    process's private folder under /dev/shm or the temp folder."""
    if preferred:
        return Path(preferred) / name
    return private_dir(handover_dir(None, need_bytes)) / name


def create_exclusive(path: Path) -> int:
    """A new file at `path` (mode 0600), open for writing; refuses a name that exists, a symlink
    included (FileExistsError, or ELOOP from O_NOFOLLOW: both raised as FileExistsError)."""
    try:
        return os.open(path, _EXCLUSIVE, 0o600)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise FileExistsError(errno.EEXIST, "refusing a symlink at the hand-over file's name", str(path)) from exc
        if exc.errno == errno.EEXIST:
            raise FileExistsError(errno.EEXIST, "refusing a hand-over file's name that already exists "
                                                "(a file or symlink planted there, or a stale one)", str(path)) from exc
        raise


def publish(tmp: Path, path: Path) -> None:
    """Give the finished `tmp` its final name `path`, atomically and without replacing anything there:
    a hard link fails on an existing name where a rename would silently replace it. Filesystems
    without hard links get the rename (the name is then in a private folder, or the user's own)."""
    try:
        os.link(tmp, path, follow_symlinks=False)
    except FileExistsError:
        tmp.unlink(missing_ok=True)
        raise FileExistsError(errno.EEXIST, "refusing a hand-over file's name that already exists", str(path))
    except OSError as exc:
        if exc.errno not in (errno.EPERM, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EXDEV, errno.EMLINK):
            tmp.unlink(missing_ok=True)
            raise
        os.rename(tmp, path)
        return
    tmp.unlink()


def write_handover(data, name: str, preferred: str | None = None) -> Path:
    """Write `data` (bytes or a uint8 buffer: a safetensors file's contents) as `name`, atomically,
    exclusively and readable by this user only."""
    view = memoryview(data).cast("B")
    path = handover_path(preferred, view.nbytes, name)
    tmp = path.with_name(path.name + ".part")
    fd = create_exclusive(tmp)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(view)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    publish(tmp, path)
    return path
