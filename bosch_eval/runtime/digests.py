"""The content hash that pins an input by what it is, not where it lies: journals, comparisons,
checks and GGUF conversions all name files by it."""

from __future__ import annotations

import hashlib
from pathlib import Path

# (resolved path, size, mtime) -> hex digest: a file read again in one process is not hashed
# again (a 93 MB GGUF is looked up on every resolve of its alias).
_DIGESTS: dict[tuple[str, int, int], str] = {}


def file_digest(path: str | Path) -> str:
    """The SHA-256 of a file's content (hex), computed once per process for an unchanged file."""
    path = Path(path)
    stat = path.stat()
    key = (str(path.resolve()), stat.st_size, stat.st_mtime_ns)
    if key not in _DIGESTS:
        digest = hashlib.sha256()
        with path.open("rb") as stream:
            for block in iter(lambda: stream.read(1 << 20), b""):
                digest.update(block)
        _DIGESTS[key] = digest.hexdigest()
    return _DIGESTS[key]
