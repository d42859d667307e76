"""The checkout stays small enough to carry (issue 55, item 6): tracked files ≤ 25 MB.

The GPU machine receives the tracked files and a build folder in 64 MiB together, and every
clone carries the results' history; data a study needs beyond this goes compressed or into
one file that several runs share (the larger toy model links the smaller one's tokenizer).
"""

from __future__ import annotations

import shutil
import subprocess

import pytest

from tests.source_tree import REPO

MOST_TRACKED_BYTES = 25_000_000


def tracked_bytes() -> dict[str, int]:
    """Each tracked file's size as git stores it (a symbolic link: the length of its target's name)."""
    if shutil.which("git") is None or not (REPO / ".git").exists():
        pytest.fail(f"{REPO} is not a git checkout with git on PATH: the tracked file list comes from `git ls-files`")
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "-z"], cwd=REPO, capture_output=True, text=True, check=True, timeout=60
    ).stdout
    return {
        path: (REPO / path).lstat().st_size
        for path in listed.split("\0")
        if path and ((REPO / path).is_symlink() or (REPO / path).is_file())
    }


def test_tracked_files_fit_in_25_mb():
    sizes = tracked_bytes()
    largest = sorted(sizes.items(), key=lambda item: -item[1])[:5]
    assert sum(sizes.values()) <= MOST_TRACKED_BYTES, (
        f"tracked files hold {sum(sizes.values()):,} bytes; the largest: {largest}"
    )
