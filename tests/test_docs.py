"""The documentation holds together (docs/conventions.md#documentation).

Every relative link in the README, ``docs/`` and the READMEs beside the code and the results
resolves to a file or folder of the checkout, and a ``#anchor`` into a Markdown file to one of
its headings, slugged as GitHub slugs them; the README stays short, keeps the test command CI
extracts, and the code cites ``docs/`` pages that exist instead of files a clone does not have.
Read from the files, nothing rendered.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
README = REPO / "README.md"
DOCS = REPO / "docs"
README_MAX_LINES = 300
# Folders whose README.md files are checked besides README.md and docs/ (model cards, results).
README_ROOTS = ("bosch_eval", "model_adapters", "search", "tasks", "benchmarks", "examples", "results")
# Where code and scripts live that may cite a docs/ page.
CODE_ROOTS = ("bosch_eval", "model_adapters", "search", "tasks", "tests", "benchmarks", "examples", "results", ".ci")
CODE_SUFFIXES = {".py", ".sh", ".yaml", ".yml", ".toml", ""}
# Documents the code once cited that a clone of the repository does not have.
ABSENT_DOCUMENTS = ("CONVENTIONS" + ".md", "DESIGN" + ".md")

FENCE = re.compile(r"^\s*(```|~~~)")
INLINE_CODE = re.compile(r"(`+)(?:(?!\1).)+?\1")
# [text](target "title") and ![alt](target); the text may hold inline code or brackets one deep.
INLINE_LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\[\]]*\])*\]\(\s*<?([^)\s>]*)>?(?:\s+\"[^\"]*\")?\s*\)")
REFERENCE_DEFINITION = re.compile(r"^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+\"[^\"]*\")?\s*$")
HEADING = re.compile(r"^\s{0,3}(#{1,6})\s+(.*?)\s*#*\s*$")
HTML_ANCHOR = re.compile(r"<a\s+(?:id|name)=\"([^\"]+)\"", re.IGNORECASE)
SCHEME = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*:")
DOCS_CITATION = re.compile(r"\bdocs/([\w./-]+\.md)(?:#([\w-]+))?")


def doc_files() -> list[Path]:
    """README.md, every page under docs/, and the README.md of every folder in README_ROOTS."""
    files = [README, *DOCS.rglob("*.md")]
    for root in README_ROOTS:
        files += (REPO / root).rglob("README.md")
    return sorted(set(files))


def outside_fences(text: str) -> Iterator[tuple[int, str]]:
    """(line number, line) of every line outside fenced code blocks."""
    fence = None
    for number, line in enumerate(text.splitlines(), start=1):
        opened = FENCE.match(line)
        if fence is None and opened:
            fence = opened.group(1)
        elif fence is not None and line.strip().startswith(fence):
            fence = None
        elif fence is None:
            yield number, line


def github_slug(heading: str) -> str:
    """The anchor GitHub gives a heading: its text as rendered (link targets and markup
    dropped), lowercased, every character other than a letter, digit, space, hyphen or
    underscore removed, spaces turned into hyphens (a repeated slug gets -1, -2, ... elsewhere)."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # [text](url) -> text
    text = re.sub(r"<[^>]+>", "", text)  # inline HTML tags
    text = text.replace("`", "").replace("*", "")
    text = re.sub(r"[^\w\- ]", "", text.lower())
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """Every anchor a link may name in a Markdown file: its headings' slugs (the n-th repeat of
    a slug gets ``-n``) and explicit HTML anchors."""
    found: set[str] = set()
    seen: dict[str, int] = {}
    for _, line in outside_fences(path.read_text(encoding="utf-8")):
        found.update(HTML_ANCHOR.findall(line))
        heading = HEADING.match(line)
        if heading:
            slug = github_slug(heading.group(2))
            found.add(slug if slug not in seen else f"{slug}-{seen[slug]}")
            seen[slug] = seen.get(slug, 0) + 1
    return found


def links(path: Path) -> list[tuple[int, str]]:
    """(line, target) of every Markdown link and reference definition outside code."""
    found = []
    for number, line in outside_fences(path.read_text(encoding="utf-8")):
        line = INLINE_CODE.sub(lambda span: " " * len(span.group(0)), line)  # `[x](y)` in code is not a link
        found += [(number, target) for target in INLINE_LINK.findall(line)]
        definition = REFERENCE_DEFINITION.match(line)
        if definition:
            found.append((number, definition.group(1)))
    return found


def broken_links(path: Path) -> list[str]:
    """Each relative link of ``path`` whose file, folder or heading does not exist,
    as ``file:line: target (why)``."""
    broken = []
    for number, target in links(path):
        if not target or SCHEME.match(target):
            continue  # external (https:, mailto:) links are not checked: no network in the tests
        where = f"{path.relative_to(REPO)}:{number}: {target}"
        file_part, _, anchor = target.partition("#")
        if not file_part:
            resolved = path
        elif file_part.startswith("/"):  # GitHub reads a leading / as the repository's root
            resolved = REPO / file_part.lstrip("/")
        else:
            resolved = path.parent / file_part
        resolved = resolved.resolve()
        if not resolved.is_relative_to(REPO):
            broken.append(f"{where} (points outside the repository)")
        elif not resolved.exists():
            broken.append(f"{where} (no such file or folder: {resolved.relative_to(REPO)})")
        elif anchor and resolved.suffix == ".md" and anchor not in anchors(resolved):
            broken.append(f"{where} (no heading with anchor #{anchor} in {resolved.relative_to(REPO)})")
    return broken


def code_files() -> list[Path]:
    files = []
    for root in CODE_ROOTS:
        files += [
            path
            for path in (REPO / root).rglob("*")
            if path.is_file() and path.suffix in CODE_SUFFIXES and "__pycache__" not in path.parts
        ]
    return sorted(files)


# -- the checker itself --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("heading", "slug"),
    [
        ("Export: running a mask outside bosch-eval", "export-running-a-mask-outside-bosch-eval"),
        ("`--model bosch` arguments", "--model-bosch-arguments"),
        ("How `lm_eval` finds `bosch`", "how-lm_eval-finds-bosch"),
        (
            "Is the calibration set fit for the search? (`bosch-eval calib-check`)",
            "is-the-calibration-set-fit-for-the-search-bosch-eval-calib-check",
        ),
        ("KV-cache quantization (`bench --kv-quant`, CPU)", "kv-cache-quantization-bench---kv-quant-cpu"),
        ("Rankings: `bosch-ranking/1`", "rankings-bosch-ranking1"),
        ("See [the search](search.md)", "see-the-search"),
        ("Against every baseline (in-sample)", "against-every-baseline-in-sample"),
    ],
)
def test_github_slug(heading, slug):
    assert github_slug(heading) == slug


def test_the_checker_reports_broken_links_and_anchors(tmp_path, monkeypatch):
    monkeypatch.setattr(sys.modules[__name__], "REPO", tmp_path)
    (tmp_path / "pages").mkdir()
    (tmp_path / "pages" / "page.md").write_text("# Page\n\n## A `code` section\n\n## Twice\n\n## Twice\n")
    readme = tmp_path / "README.md"
    readme.write_text(
        "# Title\n\n"
        "[ok](pages/page.md) [ok](pages/page.md#a-code-section) [ok](pages/page.md#twice-1) [ok](#title)\n"
        "[ok](pages/) [ok](https://example.org/missing.md) ![ok](pages/page.md) [ok](/pages/page.md#twice)\n"
        "```\n[in a code block](missing.md)\n```\n"
        "`[in inline code](missing.md)`\n"
        "[gone](pages/missing.md)\n"
        "[no such heading](pages/page.md#nowhere)\n"
        "[here neither](#nowhere)\n"
        "[outside](../elsewhere.md)\n"
        "[ref]: pages/absent.md\n"
    )
    reported = broken_links(readme)
    assert [line.split(":")[1] for line in reported] == ["9", "10", "11", "12", "13"], reported
    assert "no such file or folder: pages/missing.md" in reported[0]
    assert "no heading with anchor #nowhere in pages/page.md" in reported[1]
    assert "no heading with anchor #nowhere in README.md" in reported[2]
    assert "points outside the repository" in reported[3]
    assert "pages/absent.md" in reported[4]


# -- the documentation ---------------------------------------------------------------------


def test_the_walk_sees_the_documentation():
    names = {path.relative_to(REPO).as_posix() for path in doc_files()}
    assert {"README.md", "docs/index.md", "docs/conventions.md", "docs/architecture.md", "results/README.md"} <= names


@pytest.mark.parametrize("path", doc_files(), ids=lambda path: path.relative_to(REPO).as_posix())
def test_every_relative_link_resolves(path):
    broken = broken_links(path)
    assert not broken, f"{len(broken)} broken link(s):\n" + "\n".join(broken)


def test_every_docs_page_is_listed_in_the_index():
    listed = {target.partition("#")[0] for _, target in links(DOCS / "index.md")}
    pages = {path.relative_to(DOCS).as_posix() for path in DOCS.rglob("*.md")} - {"index.md"}
    assert not pages - listed, f"docs/index.md does not link to: {sorted(pages - listed)}"


def test_readme_is_short():
    lines = README.read_text(encoding="utf-8").count("\n")
    assert lines <= README_MAX_LINES, f"README.md has {lines} lines, more than {README_MAX_LINES}: move detail to docs/"


def test_readme_keeps_the_test_command_ci_runs():
    # .ci/run takes the ```bash block after the marker, verbatim.
    text = README.read_text(encoding="utf-8")
    marker = "<!-- test-command -->\n```bash\n"
    assert marker in text, "README.md lost its '<!-- test-command -->' marker or the ```bash block after it"
    command = text.split(marker, 1)[1].split("\n```", 1)[0]
    assert command.count("\n") == 0 and "pytest" in command, command


def test_conventions_page_exists_and_is_what_the_code_cites():
    assert (DOCS / "conventions.md").is_file()
    citing = {
        path.relative_to(REPO).as_posix()
        for path in code_files()
        if "docs/conventions.md" in path.read_text(encoding="utf-8", errors="replace")
    }
    assert "tests/test_layers.py" in citing, citing
    assert any(name.startswith("bosch_eval/") for name in citing), citing


def test_code_cites_no_document_the_repository_lacks():
    stale = [
        f"{path.relative_to(REPO)}:{number}: {name}"
        for path in code_files()
        for number, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), start=1)
        for name in ABSENT_DOCUMENTS
        if name in line and not (REPO / name).exists()
    ]
    assert not stale, "cite docs/conventions.md or docs/architecture.md instead:\n" + "\n".join(stale)


def test_docs_pages_the_code_cites_exist():
    broken = []
    for path in code_files():
        text = path.read_text(encoding="utf-8", errors="replace")
        for number, line in enumerate(text.splitlines(), start=1):
            for page, anchor in DOCS_CITATION.findall(line):
                target = DOCS / page
                if not target.is_file():
                    broken.append(f"{path.relative_to(REPO)}:{number}: docs/{page} does not exist")
                elif anchor and anchor not in anchors(target):
                    broken.append(f"{path.relative_to(REPO)}:{number}: docs/{page} has no heading #{anchor}")
    assert not broken, "\n".join(broken)
