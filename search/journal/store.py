"""The search's evaluation journal: every finished S(z), on disk before the next one starts.

A BOSCH search evaluates thousands of masks at seconds each and may be killed at any time
(SIGKILL from a scheduler included). The journal makes it resumable: a replay with the same
settings asks for the same masks, and every mask already in the journal is answered from
it instead of being evaluated again.

On disk (``bosch-journal/1``), JSON lines::

    {"journal": "bosch-journal/1", "header": {"model": ..., "ratio": 0.5, ...}}
    {"key": "1011/0110/...", "score": 0.8125, "stage": "stage1", "seconds": 4.2}
    {"key": "1100/0110/...", "bound": 0.4219, "examples": 16, "stage": "stage1", "seconds": 1.1}
    ...

A ``bound`` record is a mask that exact racing stopped early (``examples`` of the
calibration examples scored): the best S it could still have reached, never a score. It
answers the same question again on resume; it is not reported as a score, and a mask with a
bound may later get a score record.

A ``values`` record holds per-example values a racing search scored, written as soon as
they are scored (before the race decides anything)::

    {"key": "1100/0110/...", "task": "bosch_niah_calib", "values": {"3": 1.0, "17": 0.0}}

A resumed search answers every (mask, task, example) in them instead of scoring it again,
so it replays the killed search's races (bounds and ties as they were decided) and goes on
from the last example scored.

The header holds what determines a mask's score (model, window, calibration): resuming
under another one would mix scores of different problems, so it is refused, naming the
field. The search's own settings (ratio, seed, buckets, ...) decide which masks are asked
for, not what they score, but they decide the result: a resume under other settings would
replace a finished search's mask, so it is refused too, naming every changed field, unless
the caller passes ``on_new_settings`` (``--new-settings``), which then keeps the old result
aside before the header takes the new settings; every journaled score is reused.

Counts, in every message: a *mask evaluated* is a distinct mask whose S was computed, to the
end (*scored*) or until racing ruled it out (*stopped early*); journal lines (records) are
never counted for people.

Two processes appending to one journal (see ``outdir_lock``) could write one mask twice;
the same key with the same score is recovered from (the copy is ignored), with two
different scores it is damage.
"""

from __future__ import annotations

import gzip
import json
import logging
import os
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from bosch_eval.runtime.checks import is_int, is_number
from bosch_eval.runtime.errors import JournalError
from bosch_eval.search.journal.header import differences, normalized_header, other_settings_error

JOURNAL_FORMAT = "bosch-journal/1"
# How every journal file begins (what json.dumps writes for the header line).
_HEADER_PREFIX = b'{"journal": "bosch-journal/1", "header": '

log = logging.getLogger("bosch_eval.search")


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


def read_records(path: str | Path) -> Iterator[dict[str, Any]]:
    """Every line of the journal at ``path``, or of ``<path>.gz`` (a finished journal as
    committed under results/) when ``path`` is absent, parsed, the header line first.
    Read-only: for scripts that look at a finished search; a resume opens a :class:`Journal`."""
    path = Path(path)
    packed = path.with_name(path.name + ".gz")
    with (
        path.open(encoding="utf-8")
        if path.is_file() or not packed.is_file()
        else gzip.open(packed, "rt", encoding="utf-8") as lines
    ):
        yield from map(json.loads, lines)


class Journal:
    """An append-only JSON-lines record of finished evaluations, keyed by :func:`mask_key`.

    Opening rules:

    * ``resume=False``: a new journal. An existing file that holds records (or is not a
      journal at all) is never overwritten: JournalError, pass --resume or another --out.
      A file with only a header (killed before its first evaluation) is started afresh.
    * ``resume=True`` and no file: a new journal.
    * no file but ``<path>.gz`` (a finished journal committed gzipped under results/):
      ``resume=True`` unpacks it to ``path`` (the ``.gz`` stays) and goes on as below;
      ``resume=False`` is a JournalError, as for a file that holds records.
    * ``resume=True`` and a file: its header must equal ``header`` (compared as JSON, so a
      tuple equals a list); its records are loaded. A last line that is incomplete (no
      newline) or not a valid record was cut by a kill mid-write: it is dropped and the file
      truncated back to the last good line. Any earlier bad line is an error.

    ``writable=False`` (non-main processes) reads the file under the same rules but never
    creates, truncates or writes it; appended records live in memory only.

    ``reusable``: header fields whose change does not change any journaled score (the
    search settings). A resume under other values of them is refused, naming every changed
    field, unless ``on_new_settings`` is given: it is called with the journal's header (to
    keep the old result aside) before the header is rewritten, and the records are reused.
    ``migrate``: turns a header read from the file into today's form before it is compared
    (old journals pinned paths where today's pin names and hashes).
    ``wall_time=True``: every record gets ``wall_s``, the search time spent on
    this journal so far (earlier runs included), so a resumed run reports the whole cost.
    """

    def __init__(
        self,
        path: str | Path,
        header: Mapping[str, Any],
        resume: bool,
        writable: bool = True,
        reusable: Sequence[str] = (),
        wall_time: bool = False,
        on_new_settings: Callable[[dict[str, Any]], None] | None = None,
        migrate: Callable[[dict[str, Any]], dict[str, Any]] | None = None,
    ) -> None:
        self.path = Path(path)
        self.writable = writable
        self.reusable = tuple(reusable)
        self.wall_time = wall_time
        self.on_new_settings = on_new_settings
        self.migrate = migrate
        self._header = normalized_header(header)
        self._records: list[dict[str, Any]] = []
        self._scores: dict[str, float] = {}
        self._bounds: dict[str, dict[str, Any]] = {}
        self._bound_pairs: set[tuple[str, int, float]] = set()  # (key, examples, bound) of every bound record
        self._values: dict[str, dict[str, dict[int, float]]] = {}  # key -> task -> document -> value
        self._loaded = 0  # records read from the file (the rest were appended by this run)
        self._opened = time.perf_counter()
        if not self.path.exists() and self.path.with_name(self.path.name + ".gz").exists():
            self._unpack(resume)
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
        """Every score record, oldest first: ``{"key": ..., "score": ..., **fields}`` (copies)."""
        return [dict(record) for record in self._records if "score" in record]

    @property
    def bounds(self) -> dict[str, float]:
        """The last bound journaled for each mask racing stopped early (score records not included)."""
        return {key: float(record["bound"]) for key, record in self._bounds.items()}

    @property
    def examples(self) -> dict[str, dict[str, dict[int, float]]]:
        """Every per-example value journaled: ``{key: {task: {document: value}}}`` (copies)."""
        return {key: {task: dict(docs) for task, docs in tasks.items()} for key, tasks in self._values.items()}

    def has_bound(self, key: str, bound: float, examples: int) -> bool:
        """Whether a bound record of ``key`` after ``examples`` examples with this bound is journaled."""
        return (key, int(examples), float(bound)) in self._bound_pairs

    def __len__(self) -> int:
        return len(self._records)

    @property
    def masks_evaluated(self) -> int:
        """Distinct masks journaled with a score or a racing bound (the count every message uses)."""
        return len(self._scores.keys() | self._bounds.keys())

    @property
    def prior_wall_s(self) -> float:
        """Search time spent on this journal by earlier runs (the largest ``wall_s`` read back)."""
        times = [r.get("wall_s") for r in self._records[: self._loaded]]
        return max((float(t) for t in times if is_number(t)), default=0.0)

    def lookup(self, key: str) -> float | None:
        """The journaled score of ``key``, or None if that mask was never evaluated."""
        return self._scores.get(key)

    def append(self, key: str, score: float, **fields: Any) -> None:
        """Record one finished evaluation; it is on disk (fsync'ed) when this returns.

        Raises:
            JournalError: if ``key`` is already journaled (a mask is never evaluated twice),
                or the record is not JSON-serializable.
        """
        self._write(key, "score", score, fields)

    def append_bound(self, key: str, bound: float, examples: int, **fields: Any) -> None:
        """Record a mask racing stopped after ``examples`` calibration examples: ``bound`` is
        the best S it could still have reached (on disk when this returns)."""
        self._write(key, "bound", bound, {"examples": int(examples), **fields})

    def append_values(self, key: str, task: str, values: Mapping[int, float]) -> None:
        """Record per-example values of mask ``key`` on ``task``, ``{document: value}`` (on
        disk when this returns).

        Raises:
            JournalError: a document of it is journaled with another value, or the values
                are not numbers.
        """
        if not isinstance(task, str) or not task:
            raise JournalError(
                f"{self.path}: the task of values of mask {key} must be a non-empty string, got {task!r}"
            )
        problem = _values_problem(values)
        if problem is not None:
            raise JournalError(f"{self.path}: values of mask {key} on {task}: {problem}")
        known = self._values.get(key, {}).get(task, {})
        for doc, value in values.items():
            if int(doc) in known and known[int(doc)] != float(value):
                raise JournalError(
                    f"{self.path}: mask {key}, {task} document {doc} is journaled with value {known[int(doc)]!r}, not {value!r}"
                )
        # In document order: the same record whatever order the values were scored or
        # gathered in (N processes hand back a chunk's documents rank by rank).
        in_order = sorted((int(doc), float(value)) for doc, value in values.items())
        self._write(key, "values", {str(doc): value for doc, value in in_order}, {"task": task}, check=False)

    def _write(self, key: str, kind: str, value: Any, fields: Mapping[str, Any], check: bool = True) -> None:
        if not isinstance(key, str) or not key:
            raise JournalError(f"{self.path}: a record key must be a non-empty string, got {key!r}")
        if check and key in self._scores:
            raise JournalError(f"{self.path}: mask {key} is already journaled (score {self._scores[key]!r})")
        if check and (not is_number(value)):
            raise JournalError(f"{self.path}: the {kind} of mask {key} must be a number, got {value!r}")
        record = {"key": key, kind: value if kind == "values" else float(value), **fields}
        if self.wall_time:
            record["wall_s"] = round(self.prior_wall_s + time.perf_counter() - self._opened, 3)
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
    def _unpack(self, resume: bool) -> None:
        """Write ``<path>.gz``'s text to ``path``, so that the journal resumes and appends as usual."""
        packed = self.path.with_name(self.path.name + ".gz")
        if not resume:
            raise JournalError(
                f"{packed}: a gzipped journal of a finished search; pass --resume to continue that search "
                f"(it is unpacked to {self.path.name}), or choose another --out (finished work is never overwritten)"
            )
        if not self.writable:
            raise JournalError(
                f"{packed}: a gzipped journal; the writing process unpacks it (or run `gunzip -k {packed}`)"
            )
        try:
            data = gzip.decompress(packed.read_bytes())
        except (OSError, EOFError) as err:
            raise JournalError(f"{packed}: not a readable gzip file ({err})") from None
        # Written whole and renamed into place: a kill leaves no half journal.
        temporary = self.path.with_suffix(".jsonl.tmp")
        with temporary.open("wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temporary, self.path)
        log.info("%s: unpacked to %s to resume it", packed, self.path)

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
                    f"{self.path}: holds {_masks_in(lines[1:])} masks evaluated; pass --resume to continue that "
                    "search, or choose another --out (finished work is never overwritten)"
                )
            return False
        stored = json.loads(lines[0])["header"]
        migrated = self.migrate(json.loads(lines[0])["header"]) if self.migrate is not None else stored
        changed = self._check_header(migrated)
        copies = 0
        for number, line in enumerate(lines[1:], start=2):
            problem = _line_problem(line, number)
            record = json.loads(line) if problem is None else None
            if record is not None and "values" in record:
                known = self._values.get(record["key"], {}).get(record["task"], {})
                clash = next(
                    (doc for doc, value in record["values"].items() if known.get(int(doc), value) != value), None
                )
                if clash is not None:
                    problem = (
                        f"mask {record['key']}, {record['task']} document {clash} appears twice with different values "
                        f"({known[int(clash)]!r} and {record['values'][clash]!r})"
                    )
            elif record is not None and record["key"] in self._scores and "score" in record:
                if float(record["score"]) == self._scores[record["key"]]:
                    copies += 1  # the same evaluation written twice: nothing is lost or contradicted
                    continue
                first = self._scores[record["key"]]
                problem = (
                    f"mask {record['key']} appears twice with different scores ({first!r} and {record['score']!r})"
                )
            if problem is not None:
                raise JournalError(f"{self.path}: line {number}: {problem}; the journal is damaged")
            self._add(record)
        self._loaded = len(self._records)
        if copies:
            log.warning(
                "%s: ignored %d repeated record(s) of masks journaled twice with equal scores", self.path, copies
            )
        if changed:
            if self.on_new_settings is None:
                raise other_settings_error(self.path, changed)
            self.on_new_settings(stored)  # before the header changes: a kill in between keeps the old result
            log.warning(
                "%s: resuming under other settings (%s); its %d masks evaluated are reused, since a mask's score "
                "does not depend on them",
                self.path,
                "; ".join(changed),
                self.masks_evaluated,
            )
        if dropped:
            log.warning("%s: dropped a last line cut short by an interrupted write (%d bytes)", self.path, len(dropped))
        rewrite = changed or migrated != stored
        if self.writable and (dropped or rewrite):
            header = json.dumps({"journal": JOURNAL_FORMAT, "header": self._header}).encode() if rewrite else lines[0]
            self._rewrite([header, *lines[1:]])
        return True

    def _rewrite(self, lines: list[bytes]) -> None:
        """Written whole and renamed over the old file: a kill leaves the old or the new one."""
        temporary = self.path.with_suffix(".jsonl.tmp")
        with temporary.open("wb") as handle:
            handle.write(b"\n".join(lines) + b"\n")
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temporary, self.path)

    def _check_header(self, stored: dict[str, Any]) -> list[str]:
        """The changes in reusable fields ('settings.seed: 0 → 1'); a JournalError naming
        the first differing field that decides scores."""
        changed = []
        for path, theirs, mine in differences(stored, self._header):
            if path.split(".")[0] in self.reusable:
                changed.append(f"{path}: {theirs} → {mine}")
                continue
            raise JournalError(
                f"{self.path}: header field '{path}' is {theirs} in the journal but {mine} in this search; "
                "its scores belong to another problem: resume with the same value, or choose another --out"
            )
        return changed

    def _add(self, record: dict[str, Any]) -> None:
        self._records.append(record)
        if "values" in record:
            docs = self._values.setdefault(record["key"], {}).setdefault(record["task"], {})
            docs.update((int(doc), float(value)) for doc, value in record["values"].items())
            return
        if "bound" in record and "score" not in record:
            self._bound_pairs.add((record["key"], int(record["examples"]), float(record["bound"])))
        if "score" in record:
            self._scores[record["key"]] = float(record["score"])
            self._bounds.pop(record["key"], None)
        elif record["key"] not in self._scores:  # a bound after a score (two writers) adds nothing
            self._bounds[record["key"]] = record


def _masks_in(lines: Sequence[bytes]) -> int:
    """Distinct masks with a score or a bound among journal lines (values records hold neither)."""
    keys = set()
    for line in lines:
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict) and ("score" in record or "bound" in record):
            keys.add(record.get("key"))
    return len(keys)


def _line_problem(line: bytes, number: int) -> str | None:
    """What is wrong with line ``number`` (1 = the header) of a journal, or None."""
    try:
        value = json.loads(line.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError):
        return "not valid JSON"
    if number == 1:
        if (
            not isinstance(value, dict)
            or value.get("journal") != JOURNAL_FORMAT
            or not isinstance(value.get("header"), dict)
        ):
            return f"not a {JOURNAL_FORMAT} header"
        return None
    if not isinstance(value, dict):
        return "expected a JSON object"
    if not isinstance(value.get("key"), str) or not value["key"]:
        return "field 'key' is missing or not a non-empty string"
    if "values" in value:
        if not isinstance(value.get("task"), str) or not value["task"]:
            return "field 'task' is missing or not a non-empty string"
        if not isinstance(value["values"], dict) or not all(doc.isdigit() for doc in value["values"]):
            return "field 'values' is not an object of document index -> value"
        return _values_problem(value["values"])
    if "bound" in value and "score" not in value:
        bound, examples = value["bound"], value.get("examples")
        if not is_number(bound):
            return f"field 'bound' is {bound!r}, expected a number"
        if not is_int(examples) or examples < 0:
            return f"field 'examples' is {examples!r}, expected the number of examples scored"
        return None
    score = value.get("score")
    if not is_number(score):
        return f"field 'score' is {score!r}, expected a number"
    return None


def _values_problem(values: Mapping[Any, Any]) -> str | None:
    """What is wrong with per-example values ``{document: value}``, or None."""
    if not values:
        return "no values"
    for doc, value in values.items():
        if not is_number(value):
            return f"document {doc}: value {value!r}, expected a number"
    return None
