"""results/ holds data and short narratives (results/README.md): no code of its own, every
command it records runs the package or a tested script of benchmarks/, and every study's
README opens with a table of what was measured and stays short."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "results"
TESTS = REPO / "tests"
MAX_README_LINES = 200
# The package imported from a shell script (inline `python -c` or a heredoc): code no test runs.
INLINE_PYTHON = re.compile(r"\b(import|from) +bosch_eval\b")
SCRIPT_CALL = re.compile(r"python3? +([\w./-]+\.py)\b")


def shell_scripts() -> list[Path]:
    return sorted(RESULTS.rglob("*.sh"))


def study_readmes() -> list[Path]:
    return sorted(RESULTS.glob("*/README.md"))


def opens_with_table(text: str) -> bool:
    """After the ``# `` title, past blank lines and ``>`` notices, the first line is a table row."""
    lines = text.splitlines()
    if not lines or not lines[0].startswith("# "):
        return False
    body = [line for line in lines[1:] if line.strip() and not line.startswith(">")]
    return bool(body) and body[0].startswith("|")


def test_no_python_file_under_results():
    found = [path.relative_to(REPO).as_posix() for path in RESULTS.rglob("*.py")]
    assert not found, (
        f"{found}: a study step is a command of the package or a tested script of benchmarks/ (results/README.md)"
    )


def test_the_walk_sees_the_recorded_commands():
    assert {path.relative_to(RESULTS).as_posix() for path in shell_scripts()} >= {
        "smollm2/commands.sh",
        "toy_optimum/make.sh",
    }


@pytest.mark.parametrize("script", shell_scripts(), ids=lambda path: path.relative_to(RESULTS).as_posix())
def test_recorded_commands_run_no_untested_code(script: Path):
    text = script.read_text(encoding="utf-8")
    inline = [
        f"{script.name}:{number}" for number, line in enumerate(text.splitlines(), 1) if INLINE_PYTHON.search(line)
    ]
    assert not inline, (
        f"{inline}: Python inline in a recorded command; move it into benchmarks/ with a test, or into the CLI"
    )
    for called in SCRIPT_CALL.findall(text):
        assert called.startswith("benchmarks/") and (REPO / called).is_file(), (
            f"{script}: runs {called}; expected a script of benchmarks/"
        )
        assert Path(called).stem in other_tests_text(), (
            f"{script}: runs {called}, which no test in tests/ imports or names"
        )


def other_tests_text() -> str:
    """Every other test module's source."""
    return "\n".join(
        path.read_text(encoding="utf-8") for path in TESTS.glob("test_*.py") if path.name != Path(__file__).name
    )


@pytest.mark.parametrize("readme", study_readmes(), ids=lambda path: path.parent.name)
def test_a_study_readme_opens_with_a_table_and_stays_short(readme: Path):
    text = readme.read_text(encoding="utf-8")
    assert opens_with_table(text), (
        f"{readme}: expected '# title', then (after any '>' notice) a table of what was measured"
    )
    lines = len(text.splitlines())
    assert lines < MAX_README_LINES, (
        f"{readme}: {lines} lines; expected under {MAX_README_LINES} (move long prose to notes/)"
    )


def test_the_table_check_can_fail():
    assert opens_with_table("# t\n\n> void, issue 52\n\n| a | b |\n|---|---|\n")
    assert not opens_with_table("# t\n\nProse first.\n\n| a | b |\n")
    assert not opens_with_table("| a | b |\n")
