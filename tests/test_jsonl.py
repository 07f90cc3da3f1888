"""The one JSON-lines reader (`agentrl.utils.files.read_jsonl`): strict errors name file and line, tolerant
reading skips a torn last line, blank lines are skipped, lines end at "\\n" only; folders built aside are
published once and the ones killed builds left are swept; and the readers
built on it keep their messages (tasks, texts, metrics, the checkpoint manifest, a resumed file)."""

from __future__ import annotations

import json

import pytest

from agentrl.run.checkpoint import CheckpointStore
from agentrl.data import DataError, read_tasks, read_texts
from agentrl.utils.files import (JsonlError, build_folder, jsonl_lines, publish_folder, read_jsonl,
                                  restart_jsonl_at)
from agentrl.telemetry.metrics import read_metrics


def test_strict_reading_names_file_and_line(tmp_path):
    path = tmp_path / "a.jsonl"
    path.write_text('{"a": 1}\n\n  \n{"a": 2}\r\n[3]\n"x"\n')
    assert list(read_jsonl(path)) == [(1, {"a": 1}), (4, {"a": 2}), (5, [3]), (6, "x")]  # blank lines skipped
    path.write_text('{"a": 1}\n\n{"a": \n{"a": 2}\n')
    with pytest.raises(JsonlError) as info:
        list(read_jsonl(path))
    assert str(info.value) == f"{path}:3: not valid JSON (Expecting value at column 7)"
    assert (info.value.path, info.value.line, info.value.problem) == (str(path), 3, "not valid JSON")
    assert isinstance(info.value, ValueError)
    path.write_bytes(b'{"a": 1}\n{"a": "\xff"}\n')
    with pytest.raises(JsonlError, match=rf"^{path}:2: not UTF-8 text \(byte 7\)$"):
        list(read_jsonl(path))
    with pytest.raises(OSError):
        list(read_jsonl(tmp_path / "missing.jsonl"))


def test_tolerant_reading_skips_a_torn_last_line_and_bad_lines(tmp_path):
    path = tmp_path / "m.jsonl"
    path.write_text('{"step": 0}\n{"step": 1}\nnot json\n\n{"step": 2}\n{"step": 3, "lo')
    assert list(read_jsonl(path, strict=False)) == [(1, {"step": 0}), (2, {"step": 1}), (5, {"step": 2})]
    with pytest.raises(JsonlError, match=":3: not valid JSON"):
        list(read_jsonl(path))


def test_lines_end_at_newline_only(tmp_path):
    path = tmp_path / "u.jsonl"
    row = {"text": "one\u2028two\x85three"}  # str.splitlines would cut this row in three
    path.write_text(json.dumps(row, ensure_ascii=False) + "\n", encoding="utf-8")
    assert list(read_jsonl(path)) == [(1, row)]
    assert [line.raw for line in jsonl_lines(path)] == [path.read_bytes()]


def test_readers_built_on_it(tmp_path):
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text('{"q": 1}\n\n{"q": \n')
    with pytest.raises(DataError, match=rf"^data.train_path: {tasks} line 3: not valid JSON \(Expecting value"):
        read_tasks(tasks, "train")
    texts = tmp_path / "texts.jsonl"
    texts.write_text('{"text": "a"}\n\n{"text": \n')
    with pytest.raises(ValueError, match=rf"^{texts}:3: not valid JSON"):  # was a bare JSONDecodeError
        read_texts(texts)
    texts.write_text('{"text": "a"}\n\n{"txt": "b"}\n')
    with pytest.raises(ValueError, match=rf"^{texts}:3: expected an object with a string 'text' field"):
        read_texts(texts)  # the line number counts blank lines (it did not)
    metrics = tmp_path / "metrics.jsonl"
    metrics.write_text('{"step": 0}\n[1]\n{"step": 1}\n{"step": 2, "rew')
    assert read_metrics(metrics) == [{"step": 0}, {"step": 1}]
    assert read_metrics(tmp_path / "none.jsonl") == []
    (tmp_path / "checkpoints").mkdir()
    (tmp_path / "checkpoints" / "manifest.jsonl").write_text('{"step": 2, "path": "step_2"}\n{"step": 4, "pa')
    assert CheckpointStore(tmp_path)._rows() == [{"step": 2, "path": "step_2"}]


def test_restart_keeps_earlier_rows_byte_for_byte(tmp_path):
    path = tmp_path / "r.jsonl"
    rows = b'{"step": 0,  "x": 1.0}\n\n{"step": 1}\nnot json\n{"step": 2}\n{"step": 1}'  # last: no newline, torn
    path.write_bytes(rows)
    assert restart_jsonl_at(path, 2) == 4
    assert path.read_bytes() == b'{"step": 0,  "x": 1.0}\n{"step": 1}\n'


def _built(folder, text):
    folder.mkdir()
    (folder / "DONE").write_text(text)
    return folder


def test_publish_folder_keeps_the_first_of_two_builds_and_replaces_an_interrupted_one(tmp_path):
    out = tmp_path / "model"
    assert publish_folder(_built(tmp_path / ".a.tmp", "first"), out, "DONE") == out
    # A second process that finished the same build later: the published folder stays, its copy goes.
    assert publish_folder(_built(tmp_path / ".b.tmp", "second"), out, "DONE") == out
    assert (out / "DONE").read_text() == "first" and not (tmp_path / ".b.tmp").exists()
    # A folder without the marker is what an interrupted build left behind: it is replaced.
    stale = tmp_path / "stale"
    stale.mkdir()
    (stale / "half.bin").write_text("x")
    publish_folder(_built(tmp_path / ".c.tmp", "third"), stale, "DONE")
    assert sorted(p.name for p in stale.iterdir()) == ["DONE"] and (stale / "DONE").read_text() == "third"


def test_build_folder_sweeps_what_killed_builds_of_this_host_left_and_nothing_else(tmp_path):
    import os
    import socket
    import subprocess
    import sys

    out = tmp_path / "default-model-abc"
    host = socket.gethostname()
    done = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    dead = int(done.stdout)  # a process that has exited: its pid is free (reuse only keeps a folder longer)
    left = {
        "dead": tmp_path / f".{out.name}.{host}.{dead}.tmp",                 # a killed build of this host
        "live": tmp_path / f".{out.name}.{host}.{os.getppid()}.tmp",         # a build in progress
        "other_host": tmp_path / f".{out.name}.elsewhere-{host}.{dead}.tmp",  # a shared cache's other host
        "other_model": tmp_path / f".default-model-xyz.{host}.{dead}.tmp",   # another model's: not swept here
        "user": tmp_path / "notes.tmp",
    }
    for p in left.values():
        p.mkdir()
        (p / "weights.bin").write_text("x")
    own = tmp_path / f".{out.name}.{host}.{os.getpid()}.tmp"
    own.mkdir()
    (own / "half.bin").write_text("x")  # this process's earlier, failed try
    tmp = build_folder(out)
    assert tmp == own and list(tmp.iterdir()) == []  # fresh and empty
    assert not left["dead"].exists()
    assert all(left[k].is_dir() for k in ("live", "other_host", "other_model", "user"))
    (tmp / "DONE").write_text("ok")
    assert publish_folder(tmp, out, "DONE") == out and not tmp.exists()


def test_a_line_nested_past_the_parser_s_stack_is_a_bad_line_not_a_crash(tmp_path):
    path = tmp_path / "deep.jsonl"
    path.write_bytes(b'{"a": 1}\n' + b"[" * 100_000 + b"\n" + b'{"b": 2}\n')
    assert list(read_jsonl(path, strict=False)) == [(1, {"a": 1}), (3, {"b": 2})]
    with pytest.raises(JsonlError, match=r":2: not valid JSON \(nested too deeply\)$"):
        list(read_jsonl(path))
