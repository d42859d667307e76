"""Imports point down the layers (docs/conventions.md#layers); a module's layer is its folder's.

Which folders make up each layer is the table of docs/architecture.md#layers, read here: a
``where`` entry ending in ``/`` is a folder (everything under it), any other entry a file
pattern (``fnmatch``, where ``*`` spans folders) that takes precedence over the folders: the
CLI modules of a feature's folder are the CLI's. So a new module goes into a folder, and the
layer of a new folder is written once, in the table a reader sees; a module the table does
not place fails here. The root's own ``bosch_eval/__init__.py`` (a version string) is core.

The rules, read from the source with ``ast`` (nothing imported), at module level or inside a
function alike (a lazy import is still a dependency):

- a module imports nothing from a layer above its own: the core neither the adapter, the
  task code, a feature nor the CLI; the adapter and the tasks no feature; only the CLI may
  import anything;
- a feature does not import another feature's private names (``_name``): what two features
  share moves down a layer;
- every ``bosch_eval`` name imported exists (a module, or a name its module defines).
"""

from __future__ import annotations

import ast
import fnmatch
import re
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.source_tree import REPO, imported_names, locate, source_modules, top_level_names

TABLE = REPO / "docs" / "architecture.md"
ROOT_MODULE = "bosch_eval/__init__.py"
CORE, ADAPTER, FEATURES, CLI = 1, 2, 3, 4


@dataclass(frozen=True)
class Layer:
    number: int
    name: str
    folders: tuple[str, ...]  # "bosch_eval/masks/"
    patterns: tuple[str, ...]  # "*_cli.py"


def read_layers() -> list[Layer]:
    """The rows of the table under ``## Layers`` in docs/architecture.md."""
    section = TABLE.read_text(encoding="utf-8").split("\n## Layers\n", 1)[1].split("\n## ", 1)[0]
    layers = []
    for line in section.splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if not line.startswith("|") or not (number := re.match(r"(\d+)\. (.+)", cells[0])):
            continue
        where = re.findall(r"`([^`]+)`", cells[-1])
        layers.append(
            Layer(
                int(number.group(1)),
                number.group(2),
                tuple(entry for entry in where if entry.endswith("/")),
                tuple(entry for entry in where if not entry.endswith("/")),
            )
        )
    assert [layer.number for layer in layers] == [CORE, ADAPTER, FEATURES, CLI], f"{TABLE}: layers table {layers}"
    return layers


LAYERS = read_layers()


def relative(path: Path) -> str:
    return path.relative_to(REPO).as_posix()


def place(path: Path) -> tuple[Layer, str] | None:
    """The layer of a source module and its unit (the folder that places it, or the file
    itself where a pattern does); None when the table does not place it."""
    name = relative(path)
    folders = [(folder, layer) for layer in LAYERS for folder in layer.folders if name.startswith(folder)]
    unit = max((folder for folder, _ in folders), key=len, default=name)
    if name == ROOT_MODULE:
        return LAYERS[0], name
    for layer in LAYERS:
        if any(fnmatch.fnmatch(name, pattern) for pattern in layer.patterns):
            return layer, unit
    if folders:
        return max(folders, key=lambda pair: len(pair[0]))[1], unit
    return None


MODULES = source_modules()


def test_the_table_names_folders_and_files_that_exist():
    for layer in LAYERS:
        assert layer.folders or layer.patterns, f"{TABLE}: layer {layer.name!r} names no folder"
        for folder in layer.folders:
            assert (REPO / folder).is_dir(), f"{TABLE}: layer {layer.name!r} names {folder}, which is not a folder"
        for pattern in layer.patterns:
            assert any(fnmatch.fnmatch(relative(path), pattern) for path in MODULES), (
                f"{TABLE}: layer {layer.name!r} names {pattern}, which matches no module"
            )


def test_the_folders_place_modules_in_their_layers():
    expected = {
        "bosch_eval/masks/head_mask.py": CORE,
        "bosch_eval/attention/kernels/flex.py": CORE,
        "model_adapters/lm_eval_hook.py": ADAPTER,
        "model_adapters/bosch.py": ADAPTER,
        "tasks/niah/haystack.py": ADAPTER,
        "search/run/api.py": FEATURES,
        "bosch_eval/compare/runner.py": FEATURES,
        "bosch_eval/toy/corpus.py": FEATURES,
        "bosch_eval/cli.py": CLI,
        "bosch_eval/mask_cli.py": CLI,
        "bosch_eval/compare/cli.py": CLI,
        "search/cli/rank.py": CLI,
        "search/cli/__init__.py": CLI,
        "search/stages/subproblems.py": FEATURES,
        "bosch_eval/train/__main__.py": CLI,
    }
    assert {name: place(REPO / name)[0].number for name in expected} == expected
    assert (
        place(REPO / "bosch_eval/compare/cli.py")[1]
        == place(REPO / "bosch_eval/compare/runner.py")[1]
        == "bosch_eval/compare/"
    )


@pytest.mark.parametrize("path", MODULES, ids=relative)
def test_module_has_a_layer(path):
    assert place(path) is not None, (
        f"{relative(path)} is in no folder of the layers table ({TABLE.relative_to(REPO)}#layers): "
        "put core code into the folder of its job (bosch_eval/masks/, bosch_eval/attention/, ...), "
        "or add a new folder to the table under its layer"
    )


@pytest.mark.parametrize("path", MODULES, ids=relative)
def test_imports_point_down(path):
    placed = place(path)
    assert placed is not None, f"{relative(path)} has no layer (test_module_has_a_layer says where to put it)"
    layer, unit = placed
    wrong = []
    for line, name in imported_names(path):
        located = locate(name)
        if located is None:
            continue  # not ours
        target, names = located
        if names and names[0] not in top_level_names(target) and not (target.parent / names[0]).is_dir():
            wrong.append(f"line {line}: {name}: {relative(target)} defines no {names[0]!r}")
            continue
        if layer.number == CLI:
            continue
        target_layer, target_unit = place(target) or (None, None)
        if target_layer is None:
            continue  # reported for the target itself
        if target_layer.number > layer.number:
            wrong.append(f"line {line}: {name} ({target_layer.name}, above {layer.name})")
        elif (
            layer.number == FEATURES
            and target_layer.number == FEATURES
            and target_unit != unit
            and any(part.startswith("_") and not part.startswith("__") for part in name.split("."))
        ):
            wrong.append(f"line {line}: {name} (a private name of another feature, {target_unit})")
    assert not wrong, f"{relative(path)} ({layer.name}) imports against the layers: {wrong}"


# The search's rooms (docs/architecture.md, "The search"): each imports only the rooms before it
# here (the stages not the rankers either: S() alone drives them), and no module lies outside a room.
SEARCH_ROOMS = ("importers", "journal", "objective", "rankers", "check", "stages", "guard", "variants", "run")


def search_room(path: Path) -> str | None:
    parts = Path(relative(path)).parts
    return parts[1] if parts[0] == "search" and len(parts) > 2 else None


def test_search_rooms_import_only_the_rooms_before_them():
    rooms = {search_room(path) for path in MODULES} - {None}
    assert rooms == set(SEARCH_ROOMS) | {"cli"}, (
        "a new room of search/: add it to SEARCH_ROOMS and docs/architecture.md"
    )
    wrong = []
    for path in MODULES:
        room = search_room(path)
        if room not in SEARCH_ROOMS:
            continue
        allowed = set(SEARCH_ROOMS[: SEARCH_ROOMS.index(room) + 1]) - ({"rankers"} if room == "stages" else set())
        for line, name in imported_names(path):
            located = locate(name)
            if located is None or not relative(located[0]).startswith("search/"):
                continue
            target = located[0]
            target_room = search_room(target)
            if target_room in allowed:
                continue
            wrong.append(f"{relative(path)}:{line}: {name} ({target_room or relative(target)})")
    assert not wrong, f"search rooms import against their order (docs/architecture.md): {wrong}"


def test_every_search_module_is_in_a_room():
    loose = [relative(path) for path in MODULES if search_room(path) is None and relative(path).startswith("search/")]
    assert sorted(loose) == ["search/__init__.py", "search/__main__.py"], (
        f"{loose}: a module of search/ lives in a room (SEARCH_ROOMS, docs/architecture.md), not at its top"
    )
    drawn = re.findall(r"^\| `search/(\w+)/` \|", TABLE.read_text(encoding="utf-8"), re.M)
    assert drawn == [*SEARCH_ROOMS, "cli"], f"{TABLE.name}'s search table lists the rooms in import order: {drawn}"


def repeated_folder(path: str) -> str | None:
    """The folder whose name the module at ``path`` (``search/...``) repeats, in its own name or a
    word of it (``journal/journal.py``, ``cli/search_cli.py``, ``stages/stage_progress.py``), or
    beside it (``variants/guarded.py`` next to a ``guarded/`` room); None when it repeats none."""
    parts = Path(path).parts
    folders = {name for folder in parts[:-1] for name in (folder, folder.removesuffix("s"))}
    stem = Path(path).stem
    if stem in ("__init__", "__main__"):
        return None
    words = {stem, *stem.split("_")}
    clash = sorted(words & folders)
    if clash:
        return clash[0]
    return stem if stem in SEARCH_ROOMS and parts[1] != stem else None


def test_repeated_folder_names_are_found():
    assert repeated_folder("search/journal/journal.py") == "journal"
    assert repeated_folder("search/cli/search_cli.py") == "cli"
    assert repeated_folder("search/stages/stage_progress.py") == "stage"
    assert repeated_folder("search/objective/objective_racing.py") == "objective"
    assert repeated_folder("search/variants/guard.py") == "guard"  # beside the guard/ room
    assert repeated_folder("search/stages/subproblems.py") is None
    assert repeated_folder("search/stages/stage2.py") is None
    assert repeated_folder("search/guard/local_walk.py") is None


def test_no_search_module_path_repeats_its_folders_name():
    repeats = {
        relative(path): repeated_folder(relative(path)) for path in MODULES if relative(path).startswith("search/")
    }
    assert not {path: name for path, name in repeats.items() if name}, (
        "a module's path says its folder once: name the module for what it holds"
    )


# The core's folders (docs/architecture.md, "The core's folders"): drawn top to bottom, each
# imports only the folders drawn below it.
def read_core_order() -> list[str]:
    """The core's folders as docs/architecture.md draws them, top to bottom (``bosch_eval/models/``, ...)."""
    section = TABLE.read_text(encoding="utf-8").split("\n### The core's folders\n", 1)[1].split("\n## ", 1)[0]
    drawing = section.split("```\n", 2)[1]
    return [f"bosch_eval/{match.group(1)}/" for line in drawing.splitlines() if (match := re.match(r"(\w+)/\s", line))]


CORE_ORDER = read_core_order()


def core_folder(path: Path) -> str | None:
    return next((folder for folder in CORE_ORDER if relative(path).startswith(folder)), None)


def test_the_drawing_orders_the_core_folders():
    assert sorted(CORE_ORDER) == sorted(LAYERS[0].folders), (
        f"{TABLE}: the core's folders drawn {CORE_ORDER}, the layers table's core {LAYERS[0].folders}"
    )


def test_core_folders_import_only_the_folders_below_them():
    wrong = []
    for path in MODULES:
        if (folder := core_folder(path)) is None:
            continue
        for line, name in imported_names(path):
            located = locate(name)
            target = core_folder(located[0]) if located else None
            if target is not None and CORE_ORDER.index(target) < CORE_ORDER.index(folder):
                wrong.append(f"{relative(path)}:{line}: {name} ({target} is drawn above {folder})")
    assert not wrong, f"core folders import against their order (docs/architecture.md#the-cores-folders): {wrong}"


def type_only_lines(tree: ast.AST) -> set[int]:
    """The lines under ``if TYPE_CHECKING:``: imports there never run."""
    return {
        line
        for node in ast.walk(tree)
        if isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING"
        for statement in node.body
        for line in range(statement.lineno, (statement.end_lineno or statement.lineno) + 1)
    }


def import_graph() -> dict[Path, set[Path]]:
    """Module -> the modules of ours it imports when it runs (at module level or inside a function)."""
    graph = {}
    for path in MODULES:
        skipped = type_only_lines(ast.parse(path.read_text(encoding="utf-8")))
        located = (locate(name) for line, name in imported_names(path) if line not in skipped)
        graph[path] = {found[0] for found in located if found is not None and found[0] != path}
    return graph


def import_cycles(graph: dict[Path, set[Path]]) -> list[list[Path]]:
    """The groups of modules that reach each other through imports (Tarjan's strongly connected
    components), each of more than one module."""
    index: dict[Path, int] = {}
    low: dict[Path, int] = {}
    stack: list[Path] = []
    cycles = []

    def visit(module: Path) -> None:
        index[module] = low[module] = len(index)
        stack.append(module)
        for target in graph.get(module, ()):
            if target not in index:
                visit(target)
                low[module] = min(low[module], low[target])
            elif target in stack:
                low[module] = min(low[module], index[target])
        if low[module] == index[module]:
            component = [stack.pop()]
            while component[-1] != module:
                component.append(stack.pop())
            if len(component) > 1:
                cycles.append(sorted(component))

    for module in sorted(graph):
        if module not in index:
            visit(module)
    return cycles


def test_import_cycles_are_found():
    a, b, c = (REPO / name for name in ("a.py", "b.py", "c.py"))
    assert import_cycles({a: {b}, b: {c}, c: {a}}) == [[a, b, c]]
    assert import_cycles({a: {b}, b: {c}, c: set()}) == []


def test_no_two_modules_import_each_other():
    cycles = [[relative(path) for path in cycle] for cycle in import_cycles(import_graph())]
    assert not cycles, (
        f"modules that import each other, through a chain of imports (docs/architecture.md#the-cores-folders): {cycles}"
    )


def imports_ours(node: ast.AST) -> bool:
    """Whether ``node`` is an import of one of our modules (a relative one always is)."""
    if isinstance(node, ast.ImportFrom):
        return bool(node.level) or locate(node.module or "") is not None
    return isinstance(node, ast.Import) and any(locate(alias.name) is not None for alias in node.names)


# Imports of ours inside functions (docs/architecture.md#the-cores-folders): each says why in a
# comment, and outside the CLI there are at most MOST_DEFERRED of them (issue 55 item 1). The
# reasons (issue 68 item 4): start-up time (``--help``, the interpreter start the ``.pth`` line
# runs) kept free of the heavy library the comment names, or an import cycle broken.
MOST_DEFERRED = 10
REASON = re.compile(
    r"torch|transformers|lm[-_]eval|accelerate|numpy|matplotlib|flash[-_]attn|pynomad|nltk"
    r"|--help|interpreter start|start-up|\bcycle",
    re.IGNORECASE,
)
# Scripts of ours outside the package (run as files: benchmarks/, examples/), held to the same
# reasons: their --help stays free of torch.
SCRIPTS = sorted(path for folder in ("benchmarks", "examples") for path in (REPO / folder).rglob("*.py"))


@dataclass(frozen=True)
class Deferred:
    """One import statement of ours inside a function."""

    path: Path
    line: int
    function: str
    reason: bool  # a comment says why: start-up time (naming what it keeps out) or a cycle

    @property
    def is_the_clis(self) -> bool:
        """The CLI's deferred command modules: an import inside a function of a module the layers
        table places in the CLI (layer 4), whose top level stays free of torch for ``--help``
        (tests/test_cli_help.py); the commands' work is imported when a command runs."""
        placed = place(self.path)
        return placed is not None and placed[0].number == CLI


def says_why(lines: list[str], node: ast.stmt, run: set[int]) -> bool:
    """A comment that gives one of the reasons (:data:`REASON`): on one of the import's lines,
    or heading the run of imports it is in (``run``: the lines of the function's imports; a
    formatter may wrap one over several lines), the comment lines right above the run."""
    comments = [lines[n].partition("#")[2] for n in range(node.lineno, (node.end_lineno or node.lineno) + 1)]
    above = node.lineno - 1
    while above > 0 and above in run:
        above -= 1
    while above > 0 and lines[above].strip().startswith("#"):
        comments.append(lines[above])
        above -= 1
    return any(REASON.search(comment) for comment in comments)


def deferred_imports(path: Path) -> list[Deferred]:
    text = path.read_text(encoding="utf-8")
    lines = ["", *text.splitlines()]  # lines[n] is line n
    found = {}
    for function in ast.walk(ast.parse(text)):
        if isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)):
            imports = [node for node in ast.walk(function) if isinstance(node, (ast.Import, ast.ImportFrom))]
            run = {n for node in imports for n in range(node.lineno, (node.end_lineno or node.lineno) + 1)}
            for node in imports:
                if imports_ours(node):  # an import in a nested function is the innermost's (walked last)
                    found[node.lineno] = Deferred(path, node.lineno, function.name, says_why(lines, node, run))
    return list(found.values())


DEFERRED = [item for path in MODULES for item in deferred_imports(path)]
SCRIPT_DEFERRED = [item for path in SCRIPTS for item in deferred_imports(path)]


def test_deferred_imports_are_found_with_their_reasons(tmp_path):
    module = tmp_path / "m.py"
    module.write_text(
        "def f():\n"
        "    # torch: not for --help\n"
        "    from bosch_eval.masks import head_mask\n"
        "    from bosch_eval.masks import window\n"
        "\n"
        "    from bosch_eval.masks import mask_sources\n"
        "    import json\n"
        "    from . import sibling  # a cycle: relative\n"
        "\n"
        "    # numpy: wrapped by a formatter\n"
        "    from bosch_eval.masks import (\n"
        "        head_mask,\n"
        "    )\n"
        "    from bosch_eval.masks import window\n"
        "\n"
        "    from bosch_eval.masks import (\n"
        "        window,  # torch: its comment moved to the name's line\n"
        "    )\n"
        "\n"
        "    # lm-eval's start-up,\n"
        "    # said over two lines\n"
        "    from bosch_eval.masks import window\n"
        "\n"
        "    # likewise\n"
        "    from bosch_eval.masks import window  # a comment that gives no reason\n"
    )
    found = [(item.line, item.reason) for item in deferred_imports(module)]
    assert found == [
        (3, True),
        (4, True),
        (6, False),
        (8, True),
        (11, True),
        (14, True),
        (16, True),
        (22, True),
        (25, False),
    ]


def test_imports_of_ours_inside_functions_say_why():
    """An import of ours inside a function is there for start-up time (``--help`` and interpreter
    start free of torch) or a heavy dependency deferred on purpose, or to break an import cycle,
    and a comment says which (:data:`REASON`): on its line, or heading its run of imports."""
    silent = sorted(f"{relative(item.path)}:{item.line}" for item in DEFERRED if not item.reason)
    assert not silent, (
        f"imports of ours inside functions with no comment saying why; move them to the top, or say why (docs/architecture.md#the-cores-folders): {silent}"
    )


def test_scripts_imports_of_ours_inside_functions_say_why():
    """The same for the scripts of benchmarks/ and examples/: what a script imports inside a
    function is there to keep its --help free of torch, and says so; the rest goes to its top."""
    assert any(relative(path) == "benchmarks/gpu_check.py" for path in SCRIPTS)
    silent = sorted(f"{relative(item.path)}:{item.line}" for item in SCRIPT_DEFERRED if not item.reason)
    assert not silent, (
        f"imports of ours inside functions of scripts with no comment saying why; move them to the top, or say why: {silent}"
    )


def test_at_most_ten_deferred_imports_outside_the_cli():
    others = sorted(f"{relative(item.path)}:{item.line}" for item in DEFERRED if item.reason and not item.is_the_clis)
    assert len(others) <= MOST_DEFERRED, (
        f"{len(others)} imports of ours inside functions outside the CLI (at most {MOST_DEFERRED}): {others}"
    )
