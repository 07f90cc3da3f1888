"""examples/pipeline/stages.sh, the reuse rule of run.sh's stages, on real files with real bash: a stage runs
again when its command, a file its command names, the code under CODE_KEY's folders, or its output
changed, or a stage before it ran; never when it only ran before. Each stage here is `bash step.sh NAME
OUTPUT [INPUT]`, which records that it ran and writes OUTPUT."""

from __future__ import annotations

import subprocess
from pathlib import Path

STAGES_SH = Path(__file__).resolve().parents[1] / "examples" / "pipeline" / "stages.sh"

STEP = """echo "$1" >> "$OUT/ran"
if [[ ${FAIL:-} == "$1" ]]; then exit 3; fi
if [[ $2 == *.json ]]; then echo '{}' > "$2"; else mkdir -p "$2"; fi
"""

# Three stages as run.sh chains them: b reads a file it names (input.txt) and writes a file it names (b.json).
PIPELINE = """set -euo pipefail
source {stages}
CODE_KEY=$(code_key {code})
mkdir -p "$OUT/.stages"
TIMES="$OUT/times.txt"
: > "$TIMES"
stage a "$OUT/a" bash {step} a "$OUT/a"
stage b "$OUT/b.json" bash {step} b "$OUT/b.json" {input}
stage c "$OUT/c" bash {step} c "$OUT/c" --steps "${{C_STEPS:-2}}"
"""


def run(tmp: Path, **env: str) -> tuple[list[str], subprocess.CompletedProcess]:
    """Run the three-stage pipeline once in `tmp`; the stages that ran, in order, and the process."""
    out = tmp / "out"
    (out / "ran").unlink(missing_ok=True)
    script = PIPELINE.format(stages=STAGES_SH, step=tmp / "step.sh", input=tmp / "input.txt", code=tmp / "pkg")
    proc = subprocess.run(["bash", "-c", script], env={"PATH": "/usr/bin:/bin", "OUT": str(out), "FRESH": "0", **env},
                          capture_output=True, text=True, timeout=60)
    ran = (out / "ran").read_text().split() if (out / "ran").exists() else []
    return ran, proc


def fresh_dir(tmp_path: Path) -> Path:
    (tmp_path / "step.sh").write_text(STEP)
    (tmp_path / "input.txt").write_text("1\n")
    (tmp_path / "pkg" / "sub").mkdir(parents=True)
    (tmp_path / "pkg" / "sub" / "mod.py").write_text("X = 1\n")
    ran, proc = run(tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert ran == ["a", "b", "c"]
    return tmp_path


def test_a_second_run_reuses_every_stage_and_keeps_their_times(tmp_path):
    fresh_dir(tmp_path)
    ran, proc = run(tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert ran == []  # b's own output, b.json, is named in its command: written by the run, not an input
    for name in "abc":
        assert f"=== {name}: reused" in proc.stderr
    times = dict(line.split() for line in (tmp_path / "out" / "times.txt").read_text().splitlines())
    assert sorted(times) == ["a", "b", "c"] and all(v.isdigit() for v in times.values())


def test_an_edited_input_file_runs_its_stage_and_every_later_one(tmp_path):
    fresh_dir(tmp_path)
    (tmp_path / "input.txt").write_text("2\n")
    assert run(tmp_path)[0] == ["b", "c"]
    assert run(tmp_path)[0] == []


def test_an_edited_script_named_by_the_command_runs_every_stage_that_names_it(tmp_path):
    fresh_dir(tmp_path)
    (tmp_path / "step.sh").write_text(STEP + "# edited\n")
    assert run(tmp_path)[0] == ["a", "b", "c"]


def test_an_edited_or_added_module_under_the_code_folders_runs_every_stage(tmp_path):
    """Code the commands import without naming it (run.sh: agentrl, envs, rewards) is in every key."""
    fresh_dir(tmp_path)
    (tmp_path / "pkg" / "sub" / "mod.py").write_text("X = 2\n")
    assert run(tmp_path)[0] == ["a", "b", "c"]
    assert run(tmp_path)[0] == []
    (tmp_path / "pkg" / "new.py").write_text("")
    assert run(tmp_path)[0] == ["a", "b", "c"]
    (tmp_path / "pkg" / "notes.txt").write_text("not code")
    assert run(tmp_path)[0] == []


def test_a_changed_command_runs_that_stage(tmp_path):
    fresh_dir(tmp_path)
    assert run(tmp_path, C_STEPS="3")[0] == ["c"]


def test_a_deleted_output_runs_its_stage_and_every_later_one(tmp_path):
    fresh_dir(tmp_path)
    (tmp_path / "out" / "b.json").unlink()
    assert run(tmp_path)[0] == ["b", "c"]


def test_fresh_runs_every_stage(tmp_path):
    fresh_dir(tmp_path)
    assert run(tmp_path, FRESH="1")[0] == ["a", "b", "c"]


def test_a_failed_stage_leaves_no_stamp_and_runs_again(tmp_path):
    fresh_dir(tmp_path)
    (tmp_path / "input.txt").write_text("2\n")
    ran, proc = run(tmp_path, FAIL="b")
    assert proc.returncode == 3 and ran == ["b"]
    assert not (tmp_path / "out" / ".stages" / "b").exists()
    assert run(tmp_path)[0] == ["b", "c"]
