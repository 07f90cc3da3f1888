"""Rows of a stage dataset (SFT, RM, PRM, DPO, KTO): JSON objects, each with the place it came from.

Formats: `.jsonl` (one object per line, blank lines skipped), `.json` (a list of objects), `.parquet`,
or a folder written by Hugging Face `datasets`' `save_to_disk` (a DatasetDict folder gives its "train"
split). Every problem is a one-line `DataError` naming the config key, the file and the line or row, so a
bad row in a million-row file is found without a debugger. pyarrow and datasets are imported only for
their formats: a .jsonl run never pays their import time.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

from agentrl.data.errors import DataError
from agentrl.utils.files import JsonlError, read_jsonl

SUPPORTED = ".jsonl, .json, .parquet, or a folder saved with datasets' save_to_disk"


@dataclass(frozen=True)
class Row:
    """One dataset row. `where` is "path line N" (1-based, .jsonl) or "path row N" (0-based, the other
    formats); `key` is the config key that named the file, so errors about the row name both."""

    data: dict[str, Any]
    where: str
    key: str = "data.paths"

    @property
    def at(self) -> str:
        """The error-message prefix: "data.paths: /x/a.jsonl line 3"."""
        return f"{self.key}: {self.where}"


def _kind(value: Any) -> str:
    return "null" if value is None else type(value).__name__


def field(row: Row, key: str, kinds: tuple[type, ...], what: str) -> Any:
    """`row.data[key]` if it is an instance of one of `kinds`, else a DataError naming the row and the key;
    `what` says in words what was expected ("a string or a list of messages"). A bool is no int here
    (Python says it is): a label of `true` where a count is expected is a data error, not 1."""
    if key not in row.data:
        raise DataError(f"{row.at}: key {key!r} is missing (row keys: {list(row.data)})")
    value = row.data[key]
    if not isinstance(value, kinds) or (isinstance(value, bool) and bool not in kinds):
        raise DataError(f"{row.at}: key {key!r} must be {what}, got {_kind(value)}")
    return value


def read_rows(path: str | Path, key: str = "data.paths") -> list[Row]:
    """The rows of one dataset file or folder, in file order; `key` is the config key that named it."""
    path = Path(path)
    if path.is_dir():
        values = _saved_dataset(path, key)
    elif not path.exists():
        raise DataError(f"{key}: {path} does not exist")
    elif path.suffix == ".jsonl":
        values = _jsonl(path, key)
    elif path.suffix == ".json":
        values = _json(path, key)
    elif path.suffix == ".parquet":
        values = _parquet(path, key)
    else:
        raise DataError(f"{key}: {path}: unknown dataset format {path.suffix or '(no extension)'!r}; "
                        f"supported: {SUPPORTED}")
    rows = [_object(value, where, key) for where, value in values]
    if not rows:
        raise DataError(f"{key}: {path} holds no rows")
    return rows


def _object(value: Any, where: str, key: str) -> Row:
    if not isinstance(value, dict):
        raise DataError(f"{key}: {where}: expected a JSON object (one row), got {_kind(value)}")
    return Row(value, where, key)


def _text(path: Path, key: str) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise DataError(f"{key}: {path}: not UTF-8 text (byte {exc.start})") from None


def _jsonl(path: Path, key: str) -> list[tuple[str, Any]]:
    try:
        return [(f"{path} line {number}", value) for number, value in read_jsonl(path)]
    except JsonlError as exc:
        raise DataError(f"{key}: {path} line {exc.line}: {exc.what}") from None


def _json(path: Path, key: str) -> list[tuple[str, Any]]:
    try:
        values = json.loads(_text(path, key))
    except json.JSONDecodeError as exc:
        raise DataError(f"{key}: {path} line {exc.lineno}: not valid JSON ({exc.msg})") from None
    if not isinstance(values, list):
        raise DataError(f"{key}: {path}: expected a JSON list of rows, got {_kind(values)}")
    return _numbered(path, values)


def _numbered(path: Path, values: Iterable[Any]) -> list[tuple[str, Any]]:
    return [(f"{path} row {i}", value) for i, value in enumerate(values)]


def _parquet(path: Path, key: str) -> list[tuple[str, Any]]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        return _numbered(path, pq.read_table(path).to_pylist())
    except (pa.ArrowException, OSError) as exc:
        raise DataError(f"{key}: {path}: not a readable parquet file ({_first_line(exc)})") from None


def _saved_dataset(path: Path, key: str) -> list[tuple[str, Any]]:
    """A `save_to_disk` folder: a Dataset (dataset_info.json + state.json) or a DatasetDict
    (dataset_dict.json), whose "train" split is read."""
    if not (path / "dataset_dict.json").exists() and not (path / "state.json").exists():
        raise DataError(f"{key}: {path} is a folder but not one saved by datasets' save_to_disk (no state.json or "
                        f"dataset_dict.json); supported: {SUPPORTED}")
    import datasets

    try:
        loaded = datasets.load_from_disk(str(path))
    except (OSError, ValueError) as exc:
        raise DataError(f"{key}: {path}: datasets cannot load this folder ({_first_line(exc)})") from None
    if isinstance(loaded, datasets.DatasetDict):
        if "train" not in loaded:
            raise DataError(f"{key}: {path} is a DatasetDict without a 'train' split (splits: {sorted(loaded)})")
        loaded = loaded["train"]
    return _numbered(path, loaded.to_list())


def _first_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return lines[0] if lines else type(exc).__name__
