"""A comparison's finished runs stored as one ``runs.tar.xz`` (results/README.md).

The runs of one comparison share their documents and most of their answers, which gzip file
by file cannot see: one xz stream over every run stores issue 53's ρ = 0.875 study (135
files) in 75 KB, against 602 KB as gzipped files. Members are each finished run's files
under ``runs/<run>/``, uncompressed (a ``.gz`` file is stored as its text, without the
suffix: :func:`bosch_eval.compare.results.read_run` reads either), in name order with no
time or owner, so the same runs give the same archive.

``compare --pack`` moves the finished runs into the archive (a run linked from another
comparison is stored by content). A resumed ``compare`` counts archived runs as finished and
writes new ones to ``runs/`` beside it (the next ``--pack`` adds them); it restores the archive
only to set aside runs it evaluates again. Readers use :func:`readable_runs`.
"""

from __future__ import annotations

import contextlib
import gzip
import io
import lzma
import os
import shutil
import tarfile
import tempfile
from collections.abc import Iterator
from pathlib import Path, PurePosixPath

from bosch_eval.runtime.errors import BoschError

ARCHIVE = "runs.tar.xz"
RUNS = "runs"
RUN_FILE = "run.json"  # the runner writes it last: a run folder holding it is finished
XZ_PRESET = 9 | lzma.PRESET_EXTREME  # 75 KB against 91 KB at the default preset, 3 s for a study


def finished_on_disk(root: str | Path) -> list[Path]:
    """The finished runs under ``root/runs`` (a folder, or a link to one, holding ``run.json``)."""
    runs = Path(root) / RUNS
    return sorted(path for path in runs.iterdir() if (path / RUN_FILE).is_file()) if runs.is_dir() else []


def archived_runs(root: str | Path) -> set[str]:
    """The names of the runs in ``root``'s archive (none without one)."""
    return _run_names(_members(Path(root)))


def finished_runs(root: str | Path) -> set[str]:
    """The names of ``root``'s finished runs, on disk or archived."""
    return {path.name for path in finished_on_disk(Path(root))} | archived_runs(root)


def archive_runs(root: str | Path) -> bool:
    """Move the finished runs of ``root/runs`` into ``root/runs.tar.xz``; whether anything moved.

    Raises:
        BoschError: a run is both on disk and in the archive, or the archive is unreadable.
    """
    root = Path(root)
    on_disk = finished_on_disk(root)
    if not on_disk:
        return False
    members = _members(root)
    _refuse_runs_in_both(root, members)
    for run in on_disk:
        for path in sorted(p for p in run.rglob("*") if p.is_file()):
            data = path.read_bytes()
            name = f"{RUNS}/{run.name}/{path.relative_to(run).as_posix()}"
            if path.suffix == ".gz":
                data, name = gzip.decompress(data), name[: -len(".gz")]
            members[name] = data
    _write(root / ARCHIVE, members)
    for run in on_disk:
        run.unlink() if run.is_symlink() else shutil.rmtree(run)
    with contextlib.suppress(OSError):
        (root / RUNS).rmdir()  # only when nothing else (a run in progress) is left there
    return True


def restore_runs(root: str | Path) -> int:
    """Write the archive's runs back to ``root/runs`` and remove it; the number of runs restored.

    Raises:
        BoschError: a run is both on disk and in the archive, or the archive is unreadable.
    """
    root = Path(root)
    members = _members(root)
    if not members:
        return 0
    _refuse_runs_in_both(root, members)
    _extract(members, root)
    (root / ARCHIVE).unlink()
    return len(_run_names(members))


@contextlib.contextmanager
def readable_runs(root: str | Path) -> Iterator[Path]:
    """A folder holding ``root``'s finished runs as folders, archived or not (read only)."""
    root = Path(root)
    members = _members(root)
    if not members:
        yield root / RUNS
        return
    with tempfile.TemporaryDirectory(prefix="bosch-runs-") as temporary:
        _extract(members, Path(temporary))
        for run in finished_on_disk(root):
            (Path(temporary) / RUNS / run.name).symlink_to(run.resolve(), target_is_directory=True)
        yield Path(temporary) / RUNS


def _run_names(members: dict[str, bytes]) -> set[str]:
    return {PurePosixPath(name).parts[1] for name in members}


def _refuse_runs_in_both(root: Path, members: dict[str, bytes]) -> None:
    """A run in ``root/runs`` (finished or not) and in the archive: which copy holds the run is not ours to guess."""
    on_disk = {path.name for path in (root / RUNS).iterdir()} if (root / RUNS).is_dir() else set()
    both = sorted(on_disk & _run_names(members))
    if both:
        raise BoschError(f"{root}: runs {both} are both in {RUNS}/ and in {ARCHIVE}; remove one copy")


def _members(root: Path) -> dict[str, bytes]:
    """``runs/<run>/<file>`` → its bytes, every regular file of ``root``'s archive ({} without one)."""
    path = root / ARCHIVE
    if not path.is_file():
        return {}
    members = {}
    try:
        with tarfile.open(path, "r:xz") as archive:
            for member in archive:
                parts = PurePosixPath(member.name).parts
                if not member.isfile() or len(parts) < 3 or parts[0] != RUNS or ".." in parts:
                    raise BoschError(f"{path}: member {member.name!r} is not a file under {RUNS}/<run>/")
                members[member.name] = archive.extractfile(member).read()
    except (tarfile.TarError, lzma.LZMAError, EOFError) as err:
        raise BoschError(f"{path}: not a readable tar.xz archive ({err})") from None
    return members


def _write(path: Path, members: dict[str, bytes]) -> None:
    """``members`` as a reproducible tar.xz at ``path``, replaced in one step (a kill leaves the old one)."""
    partial = path.with_name(path.name + ".partial")
    with tarfile.open(partial, "w:xz", preset=XZ_PRESET, format=tarfile.PAX_FORMAT) as archive:
        for name in sorted(members):
            info = tarfile.TarInfo(name)
            info.size, info.mode, info.mtime = len(members[name]), 0o644, 0
            archive.addfile(info, io.BytesIO(members[name]))
    os.replace(partial, path)


def _extract(members: dict[str, bytes], root: Path) -> None:
    for name, data in members.items():
        target = root.joinpath(*PurePosixPath(name).parts)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
