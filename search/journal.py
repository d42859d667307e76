"""The search's evaluation journal: every finished S(z), on disk before the next one starts.

A BOSCH search evaluates thousands of masks at seconds each and may be killed at any time
(SIGKILL from a scheduler included). The journal makes it resumable: a replay with the same
settings asks for the same masks, and every mask already in the journal is answered from
it instead of being evaluated again.

On disk (``bosch-journal/1``), JSON lines::

    {"journal": "bosch-journal/1", "header": {"model": ..., "ratio": 0.5, ...}}
    {"key": "1011/0110/...", "score": 0.8125, "stage": "stage1", "seconds": 4.2}
    ...

The header holds the settings that determine the results; resuming under other settings
would mix scores of different problems, so it is refused.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

JOURNAL_FORMAT = "bosch-journal/1"
# How every journal file begins (what json.dumps writes for the header line).
_HEADER_PREFIX = b'{"journal": "bosch-journal/1", "header": '

log = logging.getLogger("bosch_eval.search")


class JournalError(RuntimeError):
    """A journal that cannot be opened, resumed or appended to as asked."""


def mask_key(bits: Sequence[Sequence[int]]) -> str:
    """The canonical string of an L×G 0/1 grid: rows bottom to top joined by '/', e.g. "1011/0110".

    Raises:
        ValueError: if the grid is empty, ragged or holds anything but 0/1.
    """
    if not bits or not bits[0]:
        raise ValueError("mask_key: expected a non-empty L×G grid of 0/1")
    width = len(bits[0])
    rows = []
    for layer, row in enumerate(bits):
        if len(row) != width:
            raise ValueError(f"mask_key: row {layer} has {len(row)} entries, expected {width}")
        for group, bit in enumerate(row):
            if bit not in (0, 1) or isinstance(bit, float):
                raise ValueError(f"mask_key: entry [{layer}][{group}] is {bit!r}, expected 0 or 1")
        rows.append("".join("1" if bit else "0" for bit in row))
    return "/".join(rows)


class Journal:
    """An append-only JSON-lines record of finished evaluations, keyed by :func:`mask_key`.

    Opening rules:

    * ``resume=False``: a new journal. An existing file that holds records (or is not a
      journal at all) is never overwritten: JournalError, pass --resume or another --out.
      A file with only a header (killed before its first evaluation) is started afresh.
    * ``resume=True`` and no file: a new journal.
    * ``resume=True`` and a file: its header must equal ``header`` (compared as JSON, so a
      tuple equals a list); its records are loaded. A last line that is incomplete (no
      newline) or not a valid record was cut by a kill mid-write: it is dropped and the file
      truncated back to the last good line. Any earlier bad line is an error.

    ``writable=False`` (non-main processes) reads the file under the same rules but never
    creates, truncates or writes it; appended records live in memory only.
    """

    def __init__(self, path: str | Path, header: Mapping[str, Any], resume: bool, writable: bool = True) -> None:
        self.path = Path(path)
        self.writable = writable
        self._header = _normalized_header(header)
        self._records: list[dict[str, Any]] = []
        self._scores: dict[str, float] = {}
        if self.path.exists() and self._load(resume):
            return
        if writable:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            line = json.dumps({"journal": JOURNAL_FORMAT, "header": self._header}) + "\n"
            with self.path.open("w", encoding="utf-8") as handle:
                handle.write(line)
                handle.flush()
                os.fsync(handle.fileno())

    @property
    def header(self) -> dict[str, Any]:
        """The settings this journal was made under (as they read back from JSON)."""
        return json.loads(json.dumps(self._header))

    @property
    def records(self) -> list[dict[str, Any]]:
        """Every record, oldest first: ``{"key": ..., "score": ..., **fields}`` (copies)."""
        return [dict(record) for record in self._records]

    def __len__(self) -> int:
        return len(self._records)

    def lookup(self, key: str) -> float | None:
        """The journaled score of ``key``, or None if that mask was never evaluated."""
        return self._scores.get(key)

    def append(self, key: str, score: float, **fields: Any) -> None:
        """Record one finished evaluation; it is on disk (fsync'ed) when this returns.

        Raises:
            JournalError: if ``key`` is already journaled (a mask is never evaluated twice),
                or the record is not JSON-serializable.
        """
        if not isinstance(key, str) or not key:
            raise JournalError(f"{self.path}: a record key must be a non-empty string, got {key!r}")
        if key in self._scores:
            raise JournalError(f"{self.path}: mask {key} is already journaled (score {self._scores[key]!r})")
        if isinstance(score, bool) or not isinstance(score, (int, float)):
            raise JournalError(f"{self.path}: the score of mask {key} must be a number, got {score!r}")
        record = {"key": key, "score": float(score), **fields}
        try:
            line = json.dumps(record) + "\n"
        except (TypeError, ValueError) as err:
            raise JournalError(f"{self.path}: record of mask {key} is not JSON-serializable: {err}") from None
        if self.writable:
            # One write of the whole line: a kill can cut only this last line, which resume drops.
            with self.path.open("a", encoding="utf-8") as handle:
                handle.write(line)
                handle.flush()
                os.fsync(handle.fileno())
        self._add(json.loads(line))

    # -- reading ----------------------------------------------------------------------
    def _load(self, resume: bool) -> bool:
        """Read an existing file; return False if it holds nothing and should be started afresh."""
        data = self.path.read_bytes()
        lines = data.split(b"\n")
        terminated = lines[-1] == b""
        if terminated:
            lines.pop()
        # Only the last line can be cut by a kill mid-write: it is kept only if complete and valid.
        dropped = b""
        if lines and not (terminated and _line_problem(lines[-1], len(lines)) is None):
            dropped = lines.pop()
        if not lines:
            if dropped and not (_HEADER_PREFIX.startswith(dropped) or dropped.startswith(_HEADER_PREFIX)):
                raise JournalError(f"{self.path}: exists and is not a {JOURNAL_FORMAT} file; refusing to overwrite it")
            return False  # empty, or a header cut by a kill: nothing to keep
        problem = _line_problem(lines[0], 1)
        if problem is not None:
            raise JournalError(f"{self.path}: line 1: {problem}; refusing to use or overwrite this file")
        if not resume:
            if len(lines) > 1:
                raise JournalError(
                    f"{self.path}: holds {len(lines) - 1} finished evaluations; pass --resume to continue that "
                    "search, or choose another --out (finished work is never overwritten)"
                )
            return False
        self._check_header(json.loads(lines[0])["header"])
        for number, line in enumerate(lines[1:], start=2):
            problem = _line_problem(line, number)
            record = json.loads(line) if problem is None else None
            if record is not None and record["key"] in self._scores:
                problem = f"mask {record['key']} appears twice"
            if problem is not None:
                raise JournalError(f"{self.path}: line {number}: {problem}; the journal is damaged")
            self._add(record)
        if dropped:
            log.warning("%s: dropped a last line cut short by an interrupted write (%d bytes)", self.path, len(dropped))
            if self.writable:
                with self.path.open("r+b") as handle:
                    handle.truncate(len(data) - len(dropped) - (1 if terminated else 0))
                    handle.flush()
                    os.fsync(handle.fileno())
        return True

    def _check_header(self, stored: dict[str, Any]) -> None:
        """Raise a JournalError naming the first setting that differs from the file's."""
        for name in [*self._header, *(name for name in stored if name not in self._header)]:
            mine, theirs = self._header.get(name), stored.get(name)
            if name in self._header and name in stored and type(mine) is type(theirs) and mine == theirs:
                continue
            was = json.dumps(theirs) if name in stored else "(absent)"
            now = json.dumps(mine) if name in self._header else "(absent)"
            raise JournalError(
                f"{self.path}: header field '{name}' is {was} in the journal but {now} in this search; "
                "resume with the same settings, or choose another --out"
            )

    def _add(self, record: dict[str, Any]) -> None:
        self._records.append(record)
        self._scores[record["key"]] = float(record["score"])


def _normalized_header(header: Mapping[str, Any]) -> dict[str, Any]:
    """The header as it will read back from the file, so comparisons see what JSON keeps."""
    if not isinstance(header, Mapping):
        raise JournalError(f"journal header: expected a mapping of search settings, got {type(header).__name__}")
    try:
        return json.loads(json.dumps(dict(header)))
    except (TypeError, ValueError) as err:
        raise JournalError(f"journal header: not JSON-serializable: {err}") from None


def _line_problem(line: bytes, number: int) -> str | None:
    """What is wrong with line ``number`` (1 = the header) of a journal, or None."""
    try:
        value = json.loads(line.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError):
        return "not valid JSON"
    if number == 1:
        if not isinstance(value, dict) or value.get("journal") != JOURNAL_FORMAT or not isinstance(value.get("header"), dict):
            return f"not a {JOURNAL_FORMAT} header"
        return None
    if not isinstance(value, dict):
        return "expected a JSON object"
    if not isinstance(value.get("key"), str) or not value["key"]:
        return "field 'key' is missing or not a non-empty string"
    score = value.get("score")
    if isinstance(score, bool) or not isinstance(score, (int, float)):
        return f"field 'score' is {score!r}, expected a number"
    return None
