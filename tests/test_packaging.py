"""The built wheel holds every module and data file of the source tree, under its installed name.

An editable install reads the source folders directly and hides a package that the wheel
leaves out (``bosch_eval.attention.kernels`` once was), so this test builds a real wheel from a
copy of the checkout and compares its file list with the source tree. The copy keeps a
stale ``build/`` folder of the checkout out of the wheel. ``.ci/wheel_check`` then installs
such a wheel into a fresh virtual environment and runs it.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests.source_tree import REPO, SOURCE_FOLDERS

# Source folder -> installed path (docs/architecture.md#what-each-folder-holds): the card's
# top-level folders live under the bosch_eval namespace, so nothing generic such as `search`
# lands in site-packages. From the tests' own table, not setup.py's: the test checks setup.py.
INSTALLED_AS = {folder: package.replace(".", "/") for package, folder in SOURCE_FOLDERS.items()}
PTH_NAME = "bosch_eval_lm_eval_hook.pth"


def source_files() -> list[str]:
    """Tracked and untracked-but-not-ignored files of the checkout, as git sees them."""
    if shutil.which("git") is None or not (REPO / ".git").exists():
        pytest.fail(f"{REPO} is not a git checkout with git on PATH: the source file list comes from `git ls-files`")
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout.split("\0")
    # --cached still lists files deleted in the work tree but not yet in the index.
    return sorted(path for path in listed if path and (REPO / path).is_file())


def expected_wheel_files(files: list[str]) -> dict[str, str]:
    """Installed path -> source path for every file under a package folder."""
    expected = {}
    for path in files:
        top, _, rest = path.partition("/")
        if top in INSTALLED_AS and rest:
            expected[f"{INSTALLED_AS[top]}/{rest}"] = path
    return expected


def build_wheel(files: list[str], workdir: Path) -> Path:
    """Build the wheel from a fresh copy of ``files`` with the running interpreter's setuptools (no network)."""
    src = workdir / "src"
    for path in files:
        (src / path).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / path, src / path)
    dist = workdir / "dist"
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            str(src),
            "--no-deps",
            "--no-build-isolation",
            "--no-index",
            "-q",
            "-w",
            str(dist),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, f"pip wheel failed:\n{result.stdout}\n{result.stderr}"
    (wheel,) = dist.glob("bosch_eval-*.whl")
    return wheel


def test_expected_wheel_files_maps_card_folders_under_the_namespace():
    files = ["search/rankers/fisher.py", "tasks/niah/x.yaml", "bosch_eval/cli.py", "tests/test_x.py", "README.md"]
    assert expected_wheel_files(files) == {
        "bosch_eval/search/rankers/fisher.py": "search/rankers/fisher.py",
        "bosch_eval/tasks/niah/x.yaml": "tasks/niah/x.yaml",
        "bosch_eval/cli.py": "bosch_eval/cli.py",
    }


@pytest.mark.slow
def test_wheel_holds_every_source_file_under_its_installed_name(tmp_path):
    files = source_files()
    expected = expected_wheel_files(files)
    assert "bosch_eval/attention/kernels/__init__.py" in expected, "the source tree layout changed: update INSTALLED_AS"
    wheel = build_wheel(files, tmp_path)
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        pth = archive.read(PTH_NAME).decode() if PTH_NAME in names else ""

    missing = sorted(
        source if source == installed else f"{source} (as {installed})"
        for installed, source in expected.items()
        if installed not in names
    )
    assert not missing, f"{wheel.name} lacks {len(missing)} source file(s): " + ", ".join(missing)

    # Nothing else: no stray top-level package, no file the source tree does not have.
    extra = sorted(
        name
        for name in names
        if name not in expected and name != PTH_NAME and not name.startswith("bosch_eval-")  # .dist-info/
    )
    assert not extra, f"{wheel.name} has files that are not in the source tree: {extra}"
    assert "import bosch_eval.model_adapters.lm_eval_hook" in pth, (
        f"{PTH_NAME} missing or wrong in {wheel.name}: {pth!r}"
    )
