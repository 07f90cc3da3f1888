"""Each agent process's own folder: made fresh per episode, removed after it, and nothing else ever removed.

All episode folders live in one folder of this process's own (`mkdtemp` in the temp directory, mode
0700, a random name created or refused, never reused), removed when the process exits. An episode's
folder is removed only when it is a direct child of that folder: a path that resolves anywhere else
(a symlink swapped in, a bug) is left where it is and reported.
"""

from __future__ import annotations

import atexit
import logging
import os
import shutil
import tempfile
from pathlib import Path

log = logging.getLogger(__name__)
_ROOT: Path | None = None


def episodes_root() -> Path:
    """This process's folder of episode folders (made on first use)."""
    global _ROOT
    if _ROOT is None or not _ROOT.is_dir():
        _ROOT = Path(tempfile.mkdtemp(prefix=f"agentrl-agents-{os.getuid()}-")).resolve()
        atexit.register(shutil.rmtree, _ROOT, True)
    return _ROOT


def new_episode_dir() -> Path:
    """A fresh folder for one episode: `work/` inside it is the process's working directory, beside
    which the sandbox's socket sits (out of the program's way)."""
    episode = Path(tempfile.mkdtemp(prefix="episode-", dir=episodes_root()))
    (episode / "work").mkdir()
    return episode


def remove_episode_dir(episode: Path) -> None:
    """Removes `episode` if it is one of `episodes_root()`'s folders; symlinks inside are removed, never
    followed (shutil.rmtree)."""
    root = episodes_root()
    if episode.is_symlink() or episode.resolve().parent != root:
        log.error("not removing %s: it is not an episode folder of %s", episode, root)
        return
    shutil.rmtree(episode, onerror=lambda fn, path, exc: log.warning("could not remove %s: %s", path, exc[1]))
