"""An exclusive lock on a command's output directory, held for the whole run (search, compare).

Two searches on one ``--out`` (easy to get: the wrapper shell of a backgrounded search is
killed, the Python process lives on, and the user starts ``--resume``) would both append
to one journal, double the work and write duplicate keys; two comparisons would each clear
the other's run in progress. The lock is ``flock`` on ``<out>/.bosch-<job>.lock``
(``.bosch-search.lock``, ``.bosch-compare.lock``): the kernel releases it when its holder
dies (even by SIGKILL), so a lock can never be stale; the file holds the holder's PID, host
and start time, for the message a second run stops with. A file still naming a holder when
the lock is free was left by a process that died holding it: it is taken over, and the log
names that PID. The file is emptied on release, never deleted (a deleted lock file would
let a waiting process and a new one lock two different files). Each command passes its own
error class, so a busy directory is reported (and, in a distributed search, broadcast to
every process) as that command's other errors are.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import socket
import time
from pathlib import Path
from types import TracebackType

log = logging.getLogger("bosch_eval")


def lock_file(job: str) -> str:
    """The lock file's name in an output directory of ``job`` (``search``, ``compare``)."""
    return f".bosch-{job}.lock"


class OutputLock:
    """``with OutputLock(out, "search", JournalError):`` holds ``out`` exclusively (the
    directory is created).

    Raises:
        error: on entry, when another live process holds the directory.
    """

    def __init__(self, directory: str | Path, job: str, error: type[Exception]) -> None:
        self.directory = Path(directory)
        self.job = job
        self.error = error
        self.path = self.directory / lock_file(job)
        self._fd: int | None = None

    def acquire(self) -> None:
        """Take the lock or raise ``error`` naming the process that holds it."""
        self.directory.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _describe(_read(fd))
            os.close(fd)
            raise self.error(
                f"{self.directory}: another {self.job} ({holder}) is running on this --out; wait for it to finish "
                "or stop it, then --resume; or choose another --out"
            ) from None
        previous = _read(fd)
        if previous:
            log.warning(
                "%s: taking over the lock left by %s, which is no longer running (it was killed or crashed)",
                self.directory,
                _describe(previous),
            )
        record = json.dumps(
            {"pid": os.getpid(), "host": socket.gethostname(), "started": time.strftime("%Y-%m-%d %H:%M:%S")}
        )
        os.ftruncate(fd, 0)
        os.pwrite(fd, record.encode(), 0)
        os.fsync(fd)
        self._fd = fd

    def release(self) -> None:
        """Empty the file (no holder) and unlock; a no-op when not held."""
        if self._fd is None:
            return
        os.ftruncate(self._fd, 0)
        os.close(self._fd)  # closing the last descriptor releases the flock
        self._fd = None

    def __enter__(self) -> OutputLock:
        self.acquire()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        self.release()


def _read(fd: int) -> str:
    return os.pread(fd, 4096, 0).decode("utf-8", errors="replace").strip()


def _describe(content: str) -> str:
    """'PID 123 on host h, started ...' from a lock file's content (whatever it holds)."""
    try:
        holder = json.loads(content)
        return f"PID {holder['pid']} on host {holder['host']}, started {holder['started']}"
    except (json.JSONDecodeError, KeyError, TypeError):
        return f"a process that wrote {content[:80]!r}" if content else "a process that has not written its PID yet"
