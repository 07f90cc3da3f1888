"""MetricsSink on real files: metrics.jsonl across a kill and a resume, TensorBoard event files and an
offline wandb run read back value by value, the end-of-run plot, and the error for a missing package."""

from __future__ import annotations

import json
import struct
import sys
import time
from pathlib import Path

import pytest
from matplotlib.image import imread
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from agentrl.telemetry import metrics
from agentrl.config.load import ConfigError
from agentrl.telemetry.metrics import MetricsSink, print_summary, read_metrics
from agentrl.telemetry.plot import plot_run
from agentrl.telemetry.trackers import flat_scalars, wandb_mode, wandb_run_id


def record(step: int, scale: float = 1.0, **extra) -> dict:
    """A record with every kind of value a training step logs."""
    return {"step": step, "version": step + 1, "reward_mean": 0.25 * step * scale, "success_rate": 0.1 * step,
            "elapsed_s": 30.0 * (step + 1), "staleness_hist": {"0": 10 - step, "1": step}, "policy/clip_frac": 0.01,
            "is_ok": True, "note": "text", "tasks/trained": [step, step + 1], "missing": None,
            "loss": float("nan"), **extra}


def tb_scalars(out_dir: Path) -> dict[str, list[tuple[int, float]]]:
    acc = EventAccumulator(str(out_dir / "tensorboard"), size_guidance={"scalars": 0})
    acc.Reload()
    got = {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}
    return {tag: points for tag, points in got.items() if points}  # a purged tag stays listed, empty


def test_flat_scalars_keeps_finite_numbers_and_flattens_one_level():
    assert flat_scalars(record(2)) == {
        "version": 3.0, "reward_mean": 0.5, "success_rate": 0.2, "elapsed_s": 90.0, "staleness_hist/0": 8.0,
        "staleness_hist/1": 2.0, "policy/clip_frac": 0.01, "is_ok": 1.0}


@pytest.mark.parametrize(("env", "mode"), [({}, "offline"), ({"WANDB_API_KEY": "k"}, "online"),
                                           ({"WANDB_API_KEY": "k", "WANDB_MODE": "disabled"}, "disabled")])
def test_wandb_mode_follows_the_environment(env, mode):
    assert wandb_mode(env) == mode


def test_a_fresh_run_gets_a_new_wandb_id_and_a_resumed_one_keeps_it(tmp_path):
    first = wandb_run_id(tmp_path, resuming=False)
    assert (tmp_path / "wandb_run_id").read_text() == first + "\n" and len(first) == 12
    assert wandb_run_id(tmp_path, resuming=True) == first
    second = wandb_run_id(tmp_path, resuming=False)
    assert second != first and wandb_run_id(tmp_path, resuming=True) == second


def test_tensorboard_event_files_hold_exactly_the_logged_scalars(tmp_path):
    stale = MetricsSink(tmp_path, 5, show=False, loggers=["tensorboard"])  # an earlier run in the same folder
    for step in range(5):
        stale.log(record(step, scale=-1.0, extra_metric=1.0))
    stale.close()
    time.sleep(1.05)  # event files are named by the second they start in, as a later process's would be
    sink = MetricsSink(tmp_path, 3, show=False, loggers=["jsonl", "tensorboard"])
    for step in range(3):
        sink.log(record(step))
    sink.close()
    got = tb_scalars(tmp_path)
    # no step, note, tasks/trained, missing or NaN loss, and nothing of the earlier run (purge_step=0)
    assert set(got) == set(flat_scalars(record(0)))
    for tag in got:
        want = [(s, flat_scalars(record(s))[tag]) for s in range(3)]
        assert [s for s, _ in got[tag]] == [s for s, _ in want], tag
        assert [v for _, v in got[tag]] == pytest.approx([v for _, v in want], rel=1e-6), tag
    assert got["staleness_hist/1"] == [(0, 0.0), (1, 1.0), (2, 2.0)]
    lines = (tmp_path / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line)["loss"] for line in lines] == [None] * 3  # NaN written as null, strict JSON


def test_a_resumed_run_logs_each_step_once(tmp_path, monkeypatch):
    first = MetricsSink(tmp_path, 7, show=False, loggers=["tensorboard"])
    for step in range(6):
        first.log(record(step))
    with (tmp_path / "metrics.jsonl").open("a") as f:  # killed mid-write: half a line, no close()
        f.write('{"step": 6, "reward_me')
    time.sleep(1.05)  # event files are named by the second they start in, as a later process's would be
    plotted = {}

    def spy(records, path, eval_before=None, eval_after=None, title=""):
        plotted.update(steps=[r["step"] for r in records], before=eval_before, after=eval_after)
        return plot_run(records, path, eval_before, eval_after, title)

    monkeypatch.setattr(metrics, "plot_run", spy)
    resumed = MetricsSink(tmp_path, 7, show=False, loggers=["jsonl", "tensorboard"], start_step=3)
    assert [r["step"] for r in read_metrics(tmp_path / "metrics.jsonl")] == [0, 1, 2]
    assert resumed.bar.n == 3
    for step in range(3, 7):
        resumed.log(record(step, scale=10.0))
    resumed.write_summary({"eval_before": {"score": 0.2}, "eval_after": {"score": 0.7}})

    rows = read_metrics(tmp_path / "metrics.jsonl")
    assert [r["step"] for r in rows] == list(range(7))
    assert [r["reward_mean"] for r in rows] == [0.0, 0.25, 0.5, 7.5, 10.0, 12.5, 15.0]
    assert plotted == {"steps": list(range(7)), "before": 0.2, "after": 0.7}  # the plot covers the resume
    got = tb_scalars(tmp_path)["reward_mean"]
    assert [s for s, _ in got] == list(range(7))  # purge_step hid the first run's steps 3..5
    assert [v for _, v in got] == pytest.approx([0.0, 0.25, 0.5, 7.5, 10.0, 12.5, 15.0], rel=1e-6)
    first.close()


def wandb_records(path: Path):
    """The records of a .wandb transaction log (a LevelDB-style log: 7-byte file header, then records of
    crc32c, length, type in 32 KiB blocks) as wandb protobufs; offline runs keep their history only here."""
    from wandb.proto import wandb_internal_pb2

    data, block = path.read_bytes(), 32768
    ident, magic, _version = struct.unpack("<4sHB", data[:7])
    assert (ident, magic) == (b":W&B", 0xBEE1)
    pos, chunks = 7, b""
    while pos + 7 <= len(data):
        left = block - pos % block
        _crc, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        if left < 7 or (kind, length) == (0, 0):  # zero padding to the end of the block
            pos += left
            continue
        chunk, pos = data[pos + 7:pos + 7 + length], pos + 7 + length
        chunks = chunk if kind in (1, 2) else chunks + chunk  # 1 full, 2 first, 3 middle, 4 last
        if kind in (1, 4):
            rec = wandb_internal_pb2.Record()
            rec.ParseFromString(chunks)
            yield rec


def wandb_run(folder: Path) -> dict:
    """run id, config, exit code and {step: logged values} of one offline run folder."""
    (log_file,) = folder.glob("run-*.wandb")
    out: dict = {"history": {}, "exit_code": None}
    for rec in wandb_records(log_file):
        kind = rec.WhichOneof("record_type")
        if kind == "run":
            out.update(id=rec.run.run_id, name=rec.run.display_name, project=rec.run.project,
                       config={u.key: json.loads(u.value_json) for u in rec.run.config.update})
        elif kind == "history":
            items = {"/".join(i.nested_key) or i.key: json.loads(i.value_json) for i in rec.history.item}
            out["history"][items["_step"]] = {k: v for k, v in items.items() if not k.startswith("_")}
        elif kind == "exit":
            out["exit_code"] = rec.exit.exit_code
    return out


def finished_wandb_run(folder: Path, timeout_s: float = 20.0) -> dict:
    """wandb_run once wandb-core has written the exit record: finish() can return before its writer has
    flushed the transaction log (the process's exit waits for it, a test reading at once may not)."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            run = wandb_run(folder)
            if run["exit_code"] is not None:
                return run
        except Exception:  # a record still half written
            if time.monotonic() > deadline:
                raise
        if time.monotonic() > deadline:
            raise AssertionError(f"no exit record in {folder} after {timeout_s} s")
        time.sleep(0.05)


def test_wandb_offline_run_holds_the_logged_values_and_resumes_the_same_run(tmp_path, monkeypatch):
    for var in ("WANDB_DIR", "WANDB_CACHE_DIR", "WANDB_CONFIG_DIR", "WANDB_DATA_DIR"):
        monkeypatch.setenv(var, str(tmp_path / "wandb-home" / var.lower()))
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    out = tmp_path / "run-a"
    sink = MetricsSink(out, 4, show=False, loggers=["wandb"], wandb_project="agentrl-test",
                       run_config={"algo": {"name": "grpo"}, "lr": 1e-3})
    for step in range(3):
        sink.log(record(step))
    sink.write_summary({})
    run_id = (out / "wandb_run_id").read_text().strip()
    (first,) = (out / "wandb").glob("offline-run-*")
    assert first.name.endswith(run_id)
    run = finished_wandb_run(first)
    assert (run["id"], run["name"], run["project"], run["exit_code"]) == (run_id, "run-a", "agentrl-test", 0)
    assert run["config"]["lr"] == 1e-3 and run["config"]["algo"] == {"name": "grpo"}
    assert run["history"] == {s: pytest.approx(flat_scalars(record(s))) for s in range(3)}

    time.sleep(1.05)  # wandb names run folders by the second; a resumed process starts later
    resumed = MetricsSink(out, 4, show=False, loggers=["wandb"], start_step=2, wandb_project="agentrl-test")
    resumed.log(record(2, scale=10.0))
    resumed.log(record(3, scale=10.0))
    resumed.close()  # no summary: the run ends as failed
    (second,) = set((out / "wandb").glob("offline-run-*")) - {first}
    assert second.name.endswith(run_id) and (out / "wandb_run_id").read_text().strip() == run_id
    again = finished_wandb_run(second)
    assert (again["id"], again["exit_code"]) == (run_id, 1)
    assert again["history"] == {s: pytest.approx(flat_scalars(record(s, scale=10.0))) for s in (2, 3)}


def test_write_summary_draws_the_curves_and_names_them(tmp_path, capsys):
    sink = MetricsSink(tmp_path, 25, show=False)
    for step in range(25):
        sink.log(record(step, **({"eval_score": 0.3 + 0.01 * step} if step % 5 == 4 else {})))
    summary = {"eval_before": {"score": 0.25, "n": 8, "failed": 0, "seconds": 61.4},
               "eval_after": {"score": 0.55, "n": 8, "failed": 0, "seconds": 50.3}, "train": {"seconds": 300.2}, "wall_s": 420}
    path = sink.write_summary(summary)
    sink.close()  # the training loop's finally after a clean run: a no-op
    assert summary["plot"] == str(tmp_path / "curves.png")
    assert json.loads(path.read_text())["plot"] == summary["plot"]
    image = imread(summary["plot"])
    assert image.shape[0] > 400 and image.shape[1] > 600
    assert image[..., :3].std() > 0.05  # drawn on, not a blank canvas
    print_summary(summary)
    out = capsys.readouterr().out
    assert f"curves                          : {summary['plot']}" in out
    assert "RL time 300s, held-out evals 112s, total wall time 420s" in out  # 61.4 + 50.3


@pytest.mark.parametrize("records", [[], [record(0)], [{"step": s, "reward_mean": 0.5} for s in range(30)]],
                         ids=["no records", "one record", "no eval_score or elapsed_s"])
def test_plot_run_draws_sparse_runs(tmp_path, records):
    path = plot_run(records, tmp_path / "c.png", eval_before=0.4 if records else None, title="sparse")
    assert path == tmp_path / "c.png" and imread(path).shape[1] > 600
    assert [p.name for p in tmp_path.iterdir()] == ["c.png"]  # the temporary file was renamed


@pytest.mark.parametrize(("logger", "module", "requirement"), [("wandb", "wandb", "./scripts/install.sh wandb"),
                                                                 ("tensorboard", "torch.utils.tensorboard",
                                                                  "tensorboard>=2.16")])
def test_a_missing_logger_package_names_the_setting(tmp_path, monkeypatch, logger, module, requirement):
    (tmp_path / "metrics.jsonl").write_text('{"step": 0}\n')
    monkeypatch.setitem(sys.modules, module, None)  # import fails as if not installed
    with pytest.raises(ConfigError, match="train.loggers") as err:
        MetricsSink(tmp_path, 3, show=False, loggers=["jsonl", logger])
    assert requirement in str(err.value)
    assert (tmp_path / "metrics.jsonl").read_text() == '{"step": 0}\n'  # failed before touching the run's file


def test_a_cpu_runs_install_notices_are_not_printed_and_real_warnings_are(tmp_path):
    """In a fresh interpreter, as a CLI starts: after setup_logging, importing vLLM (its INFO line that
    Triton is missing), torch's custom-op warning of the same and the FutureWarning vLLM's module scan
    raises print nothing, nor that FutureWarning in a new interpreter it starts (as the engine cores' fork
    server starts); a vLLM WARNING, an agentrl INFO line and any other FutureWarning still do."""
    import subprocess

    scan = "import torch.distributed as dist\nhasattr(dist.reduce_op, '__dict__')\n"
    code = (
        "import logging, subprocess, sys, warnings\n"
        "from agentrl.telemetry.metrics import setup_logging\n"
        "setup_logging()\n"
        "from vllm.triton_utils import importing\n"
        f"{scan}"
        f"subprocess.run([sys.executable, '-c', {scan!r}], check=True)\n"
        "logging.getLogger('torch._library.triton').warning('Triton not available, find_triton_kernels = []')\n"
        "logging.getLogger('vllm.engine').warning('a real vLLM warning')\n"
        "logging.getLogger('agentrl').info('an agentrl line')\n"
        "warnings.warn('another deprecation', FutureWarning)\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300,
                          cwd=Path(__file__).resolve().parents[1])
    assert proc.returncode == 0, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert [line[9:] for line in lines if line[:2].isdigit()] == [
        "WARNING vllm.engine: a real vLLM warning", "INFO agentrl: an agentrl line"], proc.stderr
    assert "Triton" not in proc.stderr and "reduce_op" not in proc.stderr, proc.stderr
    assert "FutureWarning: another deprecation" in proc.stderr
    assert proc.stdout == ""
    assert proc.stderr.count("FutureWarning") == 1
