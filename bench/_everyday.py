"""The everyday rows of `bench/chaos_resume.py`'s fault table: one user typing a command again, no fault
injected. Each row's trials run in fresh folders; a trial counts when every run's files are all still
there afterwards (its metrics.jsonl byte for byte as that run left it, every step's row, its
checkpoints), and, for the stage row, when the refused command left its input byte for byte.

    same command twice / three times   the job without train.resume, run 2 or 3 times into one out_dir
    resume=auto after each             fresh, resume=auto, fresh, resume=auto
    a stage pointed at its own input   agentrl.sft --pretrain M --save_path M (and M/sub): exit 2
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import tempfile
from pathlib import Path

from bench._common import ROOT, progress, resolve_model


def _digest(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def _fresh(cmd: list[str]) -> list[str]:
    return [a for a in cmd if not a.startswith("train.resume=")]


def _runs(base: Path, model: str, plan: list[bool], job, steps: int, every: int) -> tuple[bool, str]:
    """Run the job once per entry of `plan` (True: with train.resume=auto); (all kept, note)."""
    out, kept, seen = base / "out", {}, []
    for i, resume in enumerate(plan):
        cmd = job(model, out) if resume else _fresh(job(model, out))
        proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=900)
        if proc.returncode != 0:
            return False, f"run {i + 1} exit {proc.returncode}: {proc.stderr[-300:]}"
        for folder in sorted(p for p in base.iterdir() if p.name == "out" or p.name.startswith("out-")):
            if folder not in kept:
                kept[folder] = (folder / "metrics.jsonl").read_bytes()
                seen.append(folder.name)
    expected = {f"step_{s}" for s in range(every, steps + 1, every)}
    for folder, metrics in kept.items():
        rows = [json.loads(line)["step"] for line in (folder / "metrics.jsonl").read_text().splitlines()]
        ckpts = {p.name for p in (folder / "checkpoints").glob("step_*")}
        if (folder / "metrics.jsonl").read_bytes() != metrics or rows != list(range(steps)) or ckpts != expected:
            return False, f"{folder.name}: steps {rows}, checkpoints {sorted(ckpts)}"
    return True, "folders " + " ".join(seen)


def _stage_own_input(base: Path, model: str) -> tuple[bool, str]:
    data = base / "sft.jsonl"
    data.write_text(json.dumps({"messages": [{"role": "user", "content": "hi"},
                                             {"role": "assistant", "content": "hello"}]}) + "\n")
    before = _digest(Path(model))
    for out in (Path(model), Path(model) / "sft"):
        proc = subprocess.run([sys.executable, "-m", "agentrl.sft", "--pretrain", model, "--dataset", str(data),
                               "--save_path", str(out)], cwd=ROOT, capture_output=True, text=True, timeout=300)
        if proc.returncode != 2 or "an input folder" not in proc.stderr:
            return False, f"exit {proc.returncode}: {proc.stderr[-300:]}"
    return _digest(Path(model)) == before, "refused, exit 2"


def everyday_rows(trials: int, model: str, job, steps: int, every: int, only: tuple[str, ...] = ()) -> list[dict]:
    model = resolve_model(model)
    plans = {"same command twice": [False, False], "same command three times": [False, False, False],
             "resume=auto after each": [False, True, False, True]}
    names = [*plans, "a stage pointed at its own input"]
    rows = []
    for name in names:
        if only and not any(s in name for s in only):
            continue
        kept, notes = 0, []
        for t in range(trials):
            progress(f"{name}: trial {t + 1}/{trials}")
            with tempfile.TemporaryDirectory() as tmp:
                ok, note = (_runs(Path(tmp), model, plans[name], job, steps, every) if name in plans
                            else _stage_own_input(Path(tmp), model))
            kept += ok
            notes.append(note)
        rows.append({"fault": name, "trials": trials, "runs whose files are all still there": f"{kept}/{trials}",
                     "note": "; ".join(sorted(set(notes)))})
    return rows
