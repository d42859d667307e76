"""lm-eval's RULER tasks, offline: one line that says what is missing instead of two that mislead.

Importing ``lm_eval/tasks/ruler/prepare_niah.py`` (any RULER task: ``niah_single_1`` too)
calls ``nltk.download("punkt_tab")`` when nltk's sentence splitter is not installed, and
then prints "Downloaded punkt_tab on rank 0" whatever the download did. Without a network
that is four ``[nltk_data] Error loading punkt_tab ... refusing to connect`` lines followed
by a claim that it was downloaded (issue 40), and neither says that most RULER tasks never
use it: only the essay haystacks (``niah_single_2/3``, ``niah_multikey_1``,
``niah_multivalue``, ``niah_multiquery``) split sentences.

:func:`nltk_download_explained` wraps task building: the download is still tried (where a
network exists it succeeds and nothing changes), quietly; if it fails, one warning names
what is missing, which tasks need it and how to install it, and the false "Downloaded"
line is dropped.
"""

from __future__ import annotations

import contextlib
import io
import logging
import sys
from collections.abc import Iterator
from typing import Any

log = logging.getLogger("bosch_eval")

FALSE_CLAIM = "Downloaded punkt_tab on rank 0"  # lm-eval 0.4.13, ruler/prepare_niah.py
ESSAY_TASKS = "niah_single_2, niah_single_3, niah_multikey_1, niah_multivalue, niah_multiquery"


class _DropLine(io.TextIOBase):
    """A text stream that passes everything to ``target`` except whole lines equal to ``line``
    while ``drop()`` says so."""

    def __init__(self, target: Any, line: str, drop: Any) -> None:
        self.target, self.line, self.drop, self.pending = target, line, drop, ""

    def write(self, text: str) -> int:
        self.pending += text
        *lines, self.pending = self.pending.split("\n")
        for line in lines:
            if not (self.drop() and line == self.line):
                self.target.write(line + "\n")
        if self.pending and not self.line.startswith(self.pending):  # not the start of the line to drop
            self.target.write(self.pending)
            self.pending = ""
        return len(text)

    def isatty(self) -> bool:  # what progress bars and colour checks ask of stdout
        return self.target.isatty()

    def fileno(self) -> int:
        return self.target.fileno()

    @property
    def encoding(self) -> str:  # type: ignore[override]
        return getattr(self.target, "encoding", "utf-8")

    def flush(self) -> None:
        if self.pending:
            self.target.write(self.pending)
            self.pending = ""
        self.target.flush()


@contextlib.contextmanager
def nltk_download_explained() -> Iterator[None]:
    """While lm-eval builds tasks: a failed ``nltk.download`` of punkt_tab is one warning,
    not nltk's error lines and lm-eval's false success line (nothing changes if nltk is not
    installed or the download works)."""
    try:
        import nltk
    except ImportError:
        yield
        return
    real = nltk.download
    failed: list[str] = []

    def download(info_or_id: Any = None, *args: Any, **kwargs: Any) -> bool:
        if info_or_id not in ("punkt_tab", "punkt"):
            return real(info_or_id, *args, **kwargs)
        errors = io.StringIO()
        ok = real(info_or_id, *args, **{**kwargs, "quiet": True, "print_error_to": errors})
        if not ok:
            failed.append(info_or_id)
            log.warning(
                "nltk's %s (its sentence splitter) is not installed and could not be downloaded here; lm-eval's RULER "
                "tasks need it only for their essay haystacks (%s), the others run without it. Where a network is "
                "reachable: python -m nltk.downloader %s",
                info_or_id, ESSAY_TASKS, info_or_id,
            )  # fmt: skip
        return bool(ok)

    nltk.download = download
    stdout = _DropLine(sys.stdout, FALSE_CLAIM, lambda: bool(failed))
    try:
        with contextlib.redirect_stdout(stdout):
            yield
    finally:
        stdout.flush()
        nltk.download = real
