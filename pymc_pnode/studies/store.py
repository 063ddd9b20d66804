"""The on-disk record of a study: one tidy table, written one finished task at a time.

A store is a directory holding

- ``study.json``: what the study is (its name and a description of its settings). A rerun with other settings
  is refused, so that results of two different studies never mix in one table;
- ``results.jsonl``: one line per finished task, ``{"task": key, "rows": [{column: value, ...}, ...]}``. Each
  line is written with a single ``write`` and flushed to disk before the next task is recorded, so a crash or a
  killed process loses at most the line being written; a torn last line is dropped when the store is opened
  again;
- ``failures.jsonl``: one line per task that failed after its retries, with the error and its traceback.

A task is finished when its key appears in ``results.jsonl``; a rerun skips finished tasks and tries the
others again (failed ones included).
"""

from __future__ import annotations

import json
import numbers
import os
from pathlib import Path
from typing import Any, Iterable, Mapping

import numpy as np

_RESULTS = "results.jsonl"
_FAILURES = "failures.jsonl"
_META = "study.json"


def task_id(key) -> str:
    """The canonical text of a task key (keys are ``int`` or ``str``), used to compare keys across runs."""
    if isinstance(key, (bool, np.bool_)) or not isinstance(key, (numbers.Integral, str)):
        raise TypeError(f"task keys must be int or str, got {key!r} ({type(key).__name__})")
    return json.dumps(int(key) if isinstance(key, numbers.Integral) else key)


def scalar(value, column: str):
    """A JSON-storable scalar of a result row (numbers, bools, strings, None); arrays are refused."""
    if value is None or isinstance(value, (str, bool)):
        return value
    if isinstance(value, np.ndarray):
        if value.ndim == 0:
            return scalar(value.item(), column)
        raise TypeError(f"column {column!r}: a result row holds scalars, got an array of shape {value.shape}; "
                        "return one row per element instead")
    if isinstance(value, np.generic):
        return scalar(value.item(), column)
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real):
        return float(value)
    raise TypeError(f"column {column!r}: cannot store a {type(value).__name__} in a result row")


def rows_of(result) -> list[dict[str, Any]]:
    """The rows of one task's result: a mapping (one row) or a sequence of mappings."""
    rows = [result] if isinstance(result, Mapping) else list(result)
    if not rows or not all(isinstance(row, Mapping) for row in rows):
        raise TypeError("a study task must return a dict of scalars (one row) or a non-empty list of such dicts")
    return [{str(column): scalar(value, str(column)) for column, value in row.items()} for row in rows]


class StudyStore:
    """The directory that records one study (see the module docstring for its layout).

    Parameters
    ----------
    path : str or Path, optional
        The directory; created if missing. Without one the record is kept in memory only.
    metadata : dict, optional
        What the study is. If the directory already records a study with other metadata, a ``ValueError``
        says so (use another directory, or delete it to start again).
    """

    def __init__(self, path=None, metadata: Mapping[str, Any] | None = None):
        self.path = None if path is None else Path(path)
        self.metadata = json.loads(json.dumps(dict(metadata or {}), default=str))
        self._memory: dict[str, list[dict]] = {_RESULTS: [], _FAILURES: []}
        if self.path is None:
            return
        self.path.mkdir(parents=True, exist_ok=True)
        meta_path = self.path / _META
        if meta_path.exists():
            recorded = json.loads(meta_path.read_text())
            if self.metadata and recorded != self.metadata:
                raise ValueError(f"store {str(self.path)!r} records another study: {recorded} (this one: "
                                 f"{self.metadata}); use another store directory or delete this one to start "
                                 "again")
            self.metadata = recorded
        else:
            _write_atomically(meta_path, json.dumps(self.metadata, indent=1, sort_keys=True))
        for name in (_RESULTS, _FAILURES):
            _drop_torn_last_line(self.path / name)

    # -- reading -----------------------------------------------------------------------------------------
    def _lines(self, name: str) -> list[dict]:
        if self.path is None:
            return self._memory[name]
        path = self.path / name
        if not path.exists():
            return []
        with open(path) as handle:
            return [json.loads(line) for line in handle if line.strip()]

    def finished(self) -> dict[str, list[dict[str, Any]]]:
        """Rows of every finished task, by task id (the first record wins should a task appear twice)."""
        done: dict[str, list[dict[str, Any]]] = {}
        for entry in self._lines(_RESULTS):
            done.setdefault(task_id(entry["task"]), [dict(row, task=entry["task"]) for row in entry["rows"]])
        return done

    def failures(self) -> dict[str, dict[str, Any]]:
        """The last recorded failure of every task that has not finished since, by task id."""
        done = self.finished()
        failed = {task_id(entry["task"]): entry for entry in self._lines(_FAILURES)}
        return {key: entry for key, entry in failed.items() if key not in done}

    def table(self, order: Iterable | None = None):
        """All finished rows as one ``pandas.DataFrame`` with a ``task`` column (in ``order`` of task keys,
        if given, else in the order the tasks finished)."""
        import pandas as pd

        done = self.finished()
        keys = [task_id(key) for key in order] if order is not None else list(done)
        rows = [row for key in keys for row in done.get(key, [])]
        frame = pd.DataFrame(rows)
        if "task" in frame:
            frame = frame[["task", *[c for c in frame.columns if c != "task"]]]
        return frame

    # -- writing -----------------------------------------------------------------------------------------
    def _append(self, name: str, entry: dict[str, Any]) -> None:
        if self.path is None:
            self._memory[name].append(json.loads(json.dumps(entry)))
            return
        # NaN and infinities are written as Python's json writes them (bare words), which it reads back.
        line = json.dumps(entry) + "\n"
        with open(self.path / name, "a") as handle:
            handle.write(line)
            handle.flush()
            os.fsync(handle.fileno())

    def record(self, key, rows: list[dict[str, Any]]) -> None:
        """Record a finished task (one line, flushed to disk before returning)."""
        task_id(key)
        self._append(_RESULTS, {"task": key, "rows": rows})

    def record_failure(self, key, error: str, traceback: str, attempts: int) -> None:
        """Record a task that failed after ``attempts`` tries."""
        self._append(_FAILURES, {"task": key, "error": error, "traceback": traceback, "attempts": attempts})


def _write_atomically(path: Path, text: str) -> None:
    tmp = path.with_suffix(path.suffix + f".{os.getpid()}.tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


def _drop_torn_last_line(path: Path) -> None:
    """Cut a last line that a crash left without its newline (it was never a complete record)."""
    if not path.exists() or path.stat().st_size == 0:
        return
    with open(path, "rb+") as handle:
        handle.seek(-1, os.SEEK_END)
        if handle.read(1) == b"\n":
            return
        handle.seek(0)
        data = handle.read()
        handle.truncate(data.rfind(b"\n") + 1)
