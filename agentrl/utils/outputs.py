"""Where a command writes, so that no run loses another run's files or its own input: a folder that
holds a run (or a model) is never written into by a new one, which gets the next free folder of its
family instead (`runs/x`, then `runs/x-2`, `runs/x-3`, ...); an output file that exists likewise gets
`name-2.ext`; and an output that is, or lies inside, or contains an input is refused by name.

The rule is the same for `agentrl.train`, the stage CLIs, `agentrl.eval --json`, `agentrl.replay --out`
and `agentrl.lora_merge --out` (docs/durability.md). Numbering, not refusing, keeps a command that
was run once runnable again as it is; the folder actually used is logged and printed.
"""

from __future__ import annotations

import json
import os
import re
import socket
from pathlib import Path

# What a run (or a saved model) leaves in its folder; any one of them means the folder is taken.
RUN_MARKS = ("summary.json", "metrics.jsonl", "run_config.json", "config.json", "adapter_config.json",
             "rollouts.jsonl", "eval_episodes.jsonl", "checkpoints/manifest.jsonl", "model")
# Written (exclusively) by the process that takes a fresh folder, before any other file: two commands
# started together never pick the same folder. It counts only while its process lives.
CLAIM = ".agentrl-claim"


def _claim_alive(path: Path) -> bool:
    try:
        claim = json.loads(path.read_text())
        host, pid = claim["host"], int(claim["pid"])
    except (OSError, ValueError, KeyError, TypeError):
        return False  # torn or foreign: nothing else in the folder, so nothing to keep
    if host != socket.gethostname():
        return True  # another host's process: cannot tell, so it is taken
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def run_files(folder: str | Path) -> list[str]:
    """The run's (or model's) files `folder` holds, by name; [] for an empty or missing folder, or one
    that holds only other things (a config yaml, a dead claim)."""
    folder = Path(folder)
    if not folder.is_dir():
        return []
    found = [name for name in RUN_MARKS if (folder / name).exists()]
    if (folder / CLAIM).is_file() and _claim_alive(folder / CLAIM):
        found.append(CLAIM)
    return found


def _numbered(out: Path, n: int) -> Path:
    return out if n == 1 else out.with_name(f"{out.name}-{n}")


def family(out: str | Path) -> dict[int, Path]:
    """`out` (number 1) and its numbered siblings `out-2`, `out-3`, ... that exist, by number."""
    out = Path(out).expanduser()
    members = {1: out} if out.exists() else {}
    if out.parent.is_dir():
        pattern = re.compile(re.escape(out.name) + r"-([2-9]|[1-9]\d+)")
        for p in out.parent.iterdir():
            if (m := pattern.fullmatch(p.name)) and p.is_dir():
                members[int(m.group(1))] = p
    return dict(sorted(members.items()))


def newest_run(out: str | Path) -> Path | None:
    """The highest-numbered folder of `out`'s family that holds a run (numbers only grow: the newest)."""
    taken = [p for p in family(out).values() if run_files(p)]
    return taken[-1] if taken else None


def next_free(out: str | Path) -> Path:
    """`out` while no folder of its family holds a run, else the number after the highest that does."""
    out = Path(out).expanduser()
    taken = [n for n, p in family(out).items() if run_files(p)]
    return _numbered(out, max(taken) + 1) if taken else out


def claim_folder(out: str | Path) -> Path:
    """Take the next free folder of `out`'s family for a new run: created, with this process's claim
    written exclusively (a second command racing for it moves on to the next number)."""
    out = Path(out).expanduser()
    for _ in range(1000):
        folder = next_free(out)
        created = not folder.exists()
        folder.mkdir(parents=True, exist_ok=True)
        claim = folder / CLAIM
        if claim.exists() and not _claim_alive(claim):
            claim.unlink(missing_ok=True)  # a claim whose process is gone, with nothing written beside it
        try:
            fd = os.open(claim, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            continue  # another process took it in between; next_free now skips it
        with os.fdopen(fd, "w") as f:
            f.write(json.dumps({"host": socket.gethostname(), "pid": os.getpid(), "created": created}) + "\n")
        return folder
    raise RuntimeError(f"no free folder beside {out}")


def release_folder(folder: str | Path) -> None:
    """Give back a folder `claim_folder` took for a command that stopped before writing anything (a config
    error only the model folder tells): this process's claim goes, and the folder too when the claim made
    it and nothing else is in it. Anything else in the folder stays."""
    claim = Path(folder) / CLAIM
    try:
        mine = json.loads(claim.read_text())
    except (OSError, ValueError):
        return
    if mine.get("host") != socket.gethostname() or mine.get("pid") != os.getpid():
        return
    claim.unlink(missing_ok=True)
    if mine.get("created"):
        try:
            claim.parent.rmdir()  # only while empty
        except OSError:
            pass


def free_file(path: str | Path) -> Path:
    """`path`, or `stem-2.ext`, `stem-3.ext`, ... when it exists: an output file never replaces one."""
    path = Path(path).expanduser()
    n = 1
    while (candidate := path if n == 1 else path.with_name(f"{path.stem}-{n}{path.suffix}")).exists():
        n += 1
    return candidate


def apart_error(out: str | Path, key: str, inputs: dict[str, str | Path | None]) -> str | None:
    """The error naming both keys (the caller raises it as its config error) when the output `out` is one
    of `inputs` (key -> path; None and names that are no local path are skipped), lies inside one, or
    contains one: writing there would overwrite or mix with what the command reads. None when apart."""
    target = Path(out).expanduser().resolve()
    for name, value in inputs.items():
        if value is None or not Path(value).expanduser().exists():
            continue
        source = Path(value).expanduser().resolve()
        how = ("is" if target == source else "is inside" if source in target.parents
               else "contains" if target in source.parents else None)
        if how:
            sep = " " if key.startswith("-") else "="  # a flag as typed (--out DIR), a config key as key=value
            kind = "folder" if source.is_dir() else "file"
            return (f"{key}{sep}{out} {how} an input {kind} ({name}{sep}{value}): the command would write over "
                    f"what it reads; choose another {key}")
    return None
