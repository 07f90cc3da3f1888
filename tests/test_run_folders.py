"""A command typed twice never writes into another run's files (agentrl.utils.outputs,
agentrl.run.checkpoint.placement; docs/durability.md, "Running a command again"): what counts as a folder that
holds a run, the numbered folder a fresh run takes instead, which run `train.resume=auto` continues,
a set-aside checkpoint resumed like any other, checkpoint pruning that stays within its own run, and
outputs that would write over their input refused by name. Real files in tmp_path; no engine."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from agentrl.learner.state import save_state
from agentrl.run.checkpoint import CheckpointStore, RunState, resolve_resume, save_run_state
from agentrl.run.checkpoint.placement import claim_run, place_run
from agentrl.utils.files import restart_jsonl_at
from agentrl.utils import outputs
from agentrl.utils.outputs import CLAIM, apart_error, claim_folder, free_file, newest_run, next_free, run_files


def _fill(step: int):
    def fill(folder: Path) -> None:
        (folder / "learner").mkdir()
        save_state({"version": step, "w": torch.zeros(2)}, folder / "learner")
        save_run_state(folder, RunState(step=step, learner_version=step, components={}, elapsed_s=float(step)))
    return fill


def _write_run(out: Path, steps: list[int], keep: int = 0, finished: bool = False) -> CheckpointStore:
    store = CheckpointStore(out, keep)
    for step in steps:
        store.write(step, _fill(step))
    out.mkdir(parents=True, exist_ok=True)
    (out / "metrics.jsonl").write_text("".join(json.dumps({"step": s}) + "\n" for s in range(max(steps, default=3))))
    if finished:
        (out / "summary.json").write_text("{}")
    return store


def test_what_counts_as_a_run(tmp_path):
    assert run_files(tmp_path / "missing") == [] and run_files(tmp_path) == []
    (tmp_path / "job.yaml").write_text("train: {}\n")  # a user's own file beside: not a run
    assert run_files(tmp_path) == []
    for name in ("summary.json", "metrics.jsonl", "run_config.json", "config.json", "rollouts.jsonl"):
        folder = tmp_path / name.replace(".", "_")
        folder.mkdir()
        (folder / name).write_text("")  # even an empty one: the run got as far as opening it
        assert run_files(folder) == [name]
    (tmp_path / "ck" / "checkpoints").mkdir(parents=True)
    (tmp_path / "ck" / "checkpoints" / "manifest.jsonl").write_text("")
    assert run_files(tmp_path / "ck") == ["checkpoints/manifest.jsonl"]


def test_a_claim_counts_only_while_its_process_lives(tmp_path):
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    import socket

    (tmp_path / CLAIM).write_text(json.dumps({"host": socket.gethostname(), "pid": int(dead.stdout)}))
    assert run_files(tmp_path) == []  # started, failed before writing anything: free again
    assert claim_folder(tmp_path) == tmp_path  # the dead claim is replaced by this process's
    assert json.loads((tmp_path / CLAIM).read_text())["pid"] == os.getpid()
    assert run_files(tmp_path) == [CLAIM]
    assert claim_folder(tmp_path) == tmp_path.with_name(tmp_path.name + "-2")  # a second command racing


def test_a_fresh_run_takes_the_next_numbered_folder(tmp_path):
    out = tmp_path / "runs" / "job"
    assert next_free(out) == out and claim_folder(out) == out and out.is_dir()
    (out / "metrics.jsonl").write_text('{"step": 0}\n')
    assert claim_folder(out) == tmp_path / "runs" / "job-2"
    (tmp_path / "runs" / "job-2" / "summary.json").write_text("{}")
    assert claim_folder(out) == tmp_path / "runs" / "job-3"
    (tmp_path / "runs" / "job-3" / "metrics.jsonl").write_text("")
    (tmp_path / "runs" / "job-10").mkdir()  # an empty folder of the family is not a run
    (tmp_path / "runs" / "job-x").mkdir()  # nor of the family
    assert next_free(out) == tmp_path / "runs" / "job-4"
    assert newest_run(out) == tmp_path / "runs" / "job-3"
    assert (out / "metrics.jsonl").read_text() == '{"step": 0}\n'  # nothing of the first one touched


def test_an_output_file_never_replaces_one(tmp_path):
    assert free_file(tmp_path / "report.json") == tmp_path / "report.json"
    (tmp_path / "report.json").write_text("old")
    assert free_file(tmp_path / "report.json") == tmp_path / "report-2.json"
    (tmp_path / "report-2.json").write_text("old")
    assert free_file(tmp_path / "report.json") == tmp_path / "report-3.json"


def test_the_same_command_twice_keeps_both_runs(tmp_path, caplog):
    """The issue's case: run 1 checkpoints 5..20 (keep 2), then the same command again. Run 2 gets its
    own folder, so its checkpoints are not pruned against run 1's higher steps, nor over them."""
    out = tmp_path / "run"
    first = _write_run(out, [5, 10, 15, 20], keep=2, finished=True)
    before = sorted(p.name for p in first.complete())
    place = place_run(None, out)
    with caplog.at_level(logging.WARNING):
        folder = claim_run(place)
    assert folder == tmp_path / "run-2" and place.resume is None
    assert (f"train.out_dir={out} already holds a run (summary.json, metrics.jsonl, checkpoints/manifest.jsonl), "
            f"which is kept as it is: this run writes to {folder} (train.resume=auto continues the newest run of "
            f"{out})") in caplog.text
    second = _write_run(folder, [5, 10], keep=2)
    assert [p.name for p in second.complete()] == ["step_5", "step_10"]  # its own, none pruned
    assert sorted(p.name for p in first.complete()) == before == ["step_15", "step_20"]
    assert len((out / "metrics.jsonl").read_text().splitlines()) == 20  # run 1's rows all there


def test_resume_auto_continues_the_newest_run_of_the_family(tmp_path):
    out = tmp_path / "run"
    _write_run(out, [20], finished=True)
    _write_run(tmp_path / "run-2", [10])
    place = place_run("auto", out)
    assert place.out_dir == tmp_path / "run-2" and place.resume == tmp_path / "run-2" / "checkpoints" / "step_10"
    assert not place.fresh and claim_run(place) == tmp_path / "run-2"
    # the numbered folder asked for by name: its own family (run-2, run-2-2, ...)
    assert place_run("auto", tmp_path / "run-2").resume == place.resume
    # an empty folder: auto is a fresh start there
    assert place_run("auto", tmp_path / "new") .fresh and claim_run(place_run("auto", tmp_path / "new")) == \
        tmp_path / "new"


def test_resume_auto_of_a_run_without_a_checkpoint(tmp_path, caplog):
    """Interrupted before its first checkpoint: it starts over in place, its files set aside first.
    Finished without one: nothing to continue, so a fresh run in a folder of its own."""
    out = tmp_path / "run"
    out.mkdir()
    (out / "metrics.jsonl").write_text('{"step": 0}\n{"step": 1}\n')
    place = place_run("auto", out)
    assert place.restart and place.resume is None
    with caplog.at_level(logging.WARNING):
        assert claim_run(place) == out
    aside = next((out / "checkpoints").glob("abandoned-*"))
    assert "starts over at step 0" in caplog.text and str(aside) in caplog.text
    restart_jsonl_at(out / "metrics.jsonl", 0)  # what the new run's sink does
    assert (aside / "metrics.jsonl").read_text() == '{"step": 0}\n{"step": 1}\n'  # the link kept its rows
    assert (out / "metrics.jsonl").read_text() == ""

    done = tmp_path / "done"
    done.mkdir()
    (done / "summary.json").write_text("{}")
    place = place_run("auto", done)
    assert place.fresh and claim_run(place) == tmp_path / "done-2"


def test_resume_from_a_checkpoint_of_its_own_run_or_of_another(tmp_path):
    a, b = tmp_path / "A", tmp_path / "B"
    _write_run(a, [2, 4])
    _write_run(b, [6])
    own = place_run(str(a / "checkpoints" / "step_2"), a)  # a rollback: in place
    assert not own.fresh and own.out_dir == a and claim_run(own) == a
    branch = place_run(str(a / "checkpoints" / "step_2"), b)  # B holds a run: the branch gets B-2
    assert branch.fresh and claim_run(branch) == tmp_path / "B-2"
    assert branch.resume == a / "checkpoints" / "step_2"


def test_a_set_aside_checkpoint_resumes_like_any_other(tmp_path):
    out = tmp_path / "run"
    store = _write_run(out, [2, 4, 6])
    aside = store.set_aside_after(2)
    folder = aside / "step_6"
    assert resolve_resume(str(folder), out) == folder  # not "cut off mid-write"
    place = place_run(str(folder), out)
    assert place.resume == folder and place.fresh  # a branch: the run's folder holds the rolled-back run
    assert claim_run(place) == tmp_path / "run-2"
    with pytest.raises(Exception, match="cut off mid-write"):  # a folder without a row is still refused
        (out / "checkpoints" / "step_9" / "learner").mkdir(parents=True)
        save_state({"version": 9}, out / "checkpoints" / "step_9" / "learner")
        save_run_state(out / "checkpoints" / "step_9", RunState(9, 9, {}, 0.0))
        resolve_resume(str(out / "checkpoints" / "step_9"), out)


def test_an_output_is_never_its_input(tmp_path):
    model = tmp_path / "model"
    model.mkdir()
    for out, how in ((model, "is"), (model / "sub", "is inside"), (tmp_path, "contains")):
        assert apart_error(out, "train.out_dir", {"model.path": model}) == (f"train.out_dir={out} {how} an input folder (model.path={model}): the command "
                                  f"would write over what it reads; choose another train.out_dir")
    assert apart_error(tmp_path / "elsewhere", "train.out_dir", {"model.path": model, "teacher": "named-model"}) is None
    rollouts = tmp_path / "rollouts.jsonl"
    rollouts.write_text("")
    assert apart_error(rollouts, "--out", {"rollouts": rollouts}).startswith(f"--out {rollouts} is an input file (rollouts ")


def test_a_stage_pointed_at_its_own_input_is_refused(tmp_path, capsys):
    """`agentrl.sft --pretrain M --save_path M`: one config-error line, exit 2, before anything loads;
    the model folder is byte for byte as it was."""
    from agentrl.stage_cli import main

    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text('{"model_type": "qwen2"}')
    data = tmp_path / "sft.jsonl"
    data.write_text(json.dumps({"messages": [{"role": "user", "content": "hi"}]}) + "\n")
    before = {p.name: p.read_bytes() for p in model.iterdir()}
    for out in (model, model / "sft"):
        assert main("sft", ["--pretrain", str(model), "--dataset", str(data), "--save_path", str(out)]) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith(f"config error: train.out_dir={out} is") and \
            f"an input folder (model.path={model})" in err and "\n" not in err, err
    assert {p.name: p.read_bytes() for p in model.iterdir()} == before


def test_a_claim_given_back_leaves_no_folder_it_made_and_keeps_one_it_found(tmp_path):
    # a fresh run that stops at a config error before writing (the chat template): nothing left behind
    made = outputs.claim_folder(tmp_path / "new")
    outputs.release_folder(made)
    assert not made.exists()
    found = tmp_path / "mine"
    found.mkdir()
    (found / "notes.txt").write_text("the user's\n")
    taken = outputs.claim_folder(found)
    assert taken == found
    outputs.release_folder(taken)
    assert sorted(p.name for p in found.iterdir()) == ["notes.txt"]
    empty = tmp_path / "empty"
    empty.mkdir()
    outputs.release_folder(outputs.claim_folder(empty))
    assert empty.is_dir() and not any(empty.iterdir())  # made by the user, so it stays
