"""The registry helper every family of interchangeable parts uses (``bosch_eval/runtime/registry.py``)."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import pytest

from bosch_eval.runtime.errors import MaskError, SettingsError
from bosch_eval.runtime.registry import Registry


class TestMembers:
    def test_decorator_and_direct_registration_keep_the_order(self) -> None:
        colours: Registry[object] = Registry("colour")

        @colours.register("red")
        def red() -> str:
            return "red"

        blue = colours.register("blue", object())
        assert colours.names() == ("red", "blue") and list(colours) == ["red", "blue"]
        assert colours["red"] is red and colours.lookup("blue") is blue and red() == "red"
        assert colours.items() == [("red", red), ("blue", blue)]
        assert "red" in colours and "green" not in colours

    def test_an_unknown_name_names_the_field_family_valid_names_and_the_closest(self) -> None:
        colours: Registry[int] = Registry("colour", field="paint", error=MaskError)
        colours.register("red", 1)
        colours.register("blue", 2)
        with pytest.raises(
            MaskError,
            match=r"^paint: unknown colour 'bleu', expected one of \['blue', 'red'\] \(did you mean 'blue'\?\)$",
        ):
            colours["bleu"]
        with pytest.raises(MaskError, match=r"^--paint: unknown colour 'green', expected one of \['blue', 'red'\]$"):
            colours.lookup("green", field="--paint")

    def test_the_default_error_is_a_settings_error(self) -> None:
        with pytest.raises(SettingsError, match=r"^colour: unknown colour 'red', expected one of \[\]$"):
            Registry("colour").lookup("red")

    def test_a_name_is_taken_once(self) -> None:
        colours: Registry[int] = Registry("colour")
        colours.register("red", 1)
        with pytest.raises(ValueError, match=r"colour 'red' is registered twice: 1 and 2"):
            colours.register("red", 2)
        assert colours["red"] == 1

    @pytest.mark.parametrize("name", ["", "a,b", "a=b", "two words", "-x", 3])
    def test_a_name_fits_model_args_and_command_lines(self, name: object) -> None:
        with pytest.raises(ValueError, match="colour name: expected letters, digits"):
            Registry("colour").register(name, 1)  # type: ignore[arg-type]


@pytest.fixture
def plugin_package(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """A package ``bosch_test_plugins`` whose ``__init__`` holds a registry and no member;
    each test writes member modules into it. Removed from ``sys.modules`` afterwards."""
    root = tmp_path / "bosch_test_plugins"
    root.mkdir()
    (root / "__init__.py").write_text(
        "from bosch_eval.runtime.registry import Registry\nPARTS = Registry('part', package=__name__)\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    yield root
    for name in [name for name in sys.modules if name.split(".")[0] == "bosch_test_plugins"]:
        del sys.modules[name]


def write_member(package: Path, module: str, name: str) -> None:
    (package / f"{module}.py").write_text(
        textwrap.dedent(f"""
            from bosch_test_plugins import PARTS

            @PARTS.register({name!r})
            def part() -> str:
                return {name!r}
        """)
    )


class TestPackageDiscovery:
    def test_a_new_module_is_found_without_an_edit_elsewhere(self, plugin_package: Path) -> None:
        write_member(plugin_package, "first", "one")
        write_member(plugin_package, "second", "two")
        from bosch_test_plugins import PARTS

        assert PARTS.members == {}  # nothing imported yet
        assert PARTS["two"]() == "two"
        assert PARTS.names() == ("one", "two")  # modules are imported in name order
        write_member(plugin_package, "third", "three")  # a file added later is found on a miss
        assert "three" in PARTS and PARTS.names() == ("one", "two", "three")

    def test_the_first_modules_come_first_and_the_others_after_them(self, plugin_package: Path) -> None:
        (plugin_package / "__init__.py").write_text(
            "from bosch_eval.runtime.registry import Registry\nPARTS = Registry('part', package=__name__, first=('zulu', 'mike'))\n"
        )
        for module in ("alpha", "zulu", "mike"):
            write_member(plugin_package, module, module)
        import bosch_test_plugins.mike  # noqa: F401 (imported on its own: the first modules still come first)
        from bosch_test_plugins import PARTS

        assert list(PARTS.members) == ["zulu", "mike"]
        assert PARTS.names() == ("zulu", "mike", "alpha")

    def test_a_registered_name_imports_nothing(self, plugin_package: Path) -> None:
        write_member(plugin_package, "first", "one")
        from bosch_test_plugins import PARTS

        PARTS.register("builtin", lambda: "builtin")
        assert PARTS["builtin"]() == "builtin"
        assert "bosch_test_plugins.first" not in sys.modules
        assert PARTS.names() == ("builtin", "one") and "bosch_test_plugins.first" in sys.modules

    def test_an_unknown_name_lists_the_members_of_every_module(self, plugin_package: Path) -> None:
        write_member(plugin_package, "first", "one")
        from bosch_test_plugins import PARTS

        with pytest.raises(
            SettingsError, match=r"part: unknown part 'oen', expected one of \['one'\] \(did you mean 'one'\?\)"
        ):
            PARTS["oen"]

    def test_a_broken_module_is_an_error_not_a_missing_member(self, plugin_package: Path) -> None:
        (plugin_package / "broken.py").write_text("raise ImportError('needs a package that is not installed')\n")
        from bosch_test_plugins import PARTS

        with pytest.raises(ImportError, match="needs a package that is not installed"):
            PARTS.names()


class TestCommandLineStaysCheap:
    """Listing a package family imports its members (torch, transformers): argument parsing and
    ``--help`` must not, so the rank command takes any name and checks it when it runs."""

    def test_rank_help_and_parsing_list_no_ranker(self, monkeypatch: pytest.MonkeyPatch) -> None:
        import argparse

        from bosch_eval.search.cli.rank import add_rank_parser

        def refuse(self: Registry) -> None:
            raise AssertionError(f"{self.family}: members listed while parsing arguments")

        monkeypatch.setattr(Registry, "_discover", refuse)
        parser = argparse.ArgumentParser(prog="bosch-eval")
        rank = add_rank_parser(parser.add_subparsers(dest="command"))
        assert "--method NAME" in rank.format_help()
        args = parser.parse_args(["rank", "--method", "not-yet-known", "--model", "m", "--out", "o"])
        assert args.method == "not-yet-known"

    def test_a_methods_flags_are_its_own_and_its_help_lists_them(self, capsys: pytest.CaptureFixture[str]) -> None:
        import argparse

        from bosch_eval.search.cli.rank import add_rank_parser, method_options

        parser = argparse.ArgumentParser(prog="bosch-eval")
        add_rank_parser(parser.add_subparsers(dest="command"))
        assert "--qada-buffer" not in parser.format_help()
        with pytest.raises(SystemExit):
            parser.parse_args(["rank", "--method", "qada", "--help"])
        text = capsys.readouterr().out
        assert "--method qada's flags" in text and "--qada-buffer BUFFER" in text and "--proxy-gamma" not in text
        parser = argparse.ArgumentParser(prog="bosch-eval")  # one that has not listed qada's flags for --help
        add_rank_parser(parser.add_subparsers(dest="command"))
        args = parser.parse_args(["rank", "--method", "qada", "--model", "m", "--qada-buffer", "8", "--out", "o"])
        assert args.method_flags == ["--qada-buffer", "8"] and method_options(args) == {"buffer": 8}
        args.method = "proxy"
        with pytest.raises(SettingsError, match="--qada-buffer applies to --method qada, not proxy"):
            method_options(args)
        args.method_flags = ["--calib-exampels", "3"]  # a typo of a flag every method takes
        with pytest.raises(SettingsError, match="not a flag of bosch-eval rank, nor of --method proxy"):
            method_options(args)

    @pytest.mark.slow
    def test_the_registries_import_no_heavy_package(self) -> None:
        import subprocess

        code = textwrap.dedent("""
            import argparse, contextlib, io, sys
            from bosch_eval.search.cli.rank import add_rank_parser
            from bosch_eval.search.rankers import RANKERS
            from bosch_eval.masks.layer_heuristics import LAYER_HEURISTICS
            from bosch_eval.search.run.pipeline import VARIANTS
            from bosch_eval.search.stages.optimizers import OPTIMIZERS
            from bosch_eval.search.importers import IMPORTERS
            assert IMPORTERS.names() == ("duo", "prulong", "retrieval-json")
            assert LAYER_HEURISTICS.names() == ("intr", "bme", "rand")
            assert OPTIMIZERS.names() == ("exhaustive", "nomad", "oneplusone")
            assert VARIANTS.names() == ("bosch", "nested", "guarded", "single", "multi", "layer")
            parser = argparse.ArgumentParser(prog="bosch-eval")
            add_rank_parser(parser.add_subparsers(dest="command"))
            with contextlib.redirect_stdout(io.StringIO()), contextlib.suppress(SystemExit):
                parser.parse_args(["rank", "--help"])
            print(sorted(name for name in ("torch", "transformers", "lm_eval", "accelerate") if name in sys.modules))
        """)
        result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
        assert result.stdout.strip() == "[]", result.stdout + result.stderr


def test_the_first_modules_members_are_listed_first_whatever_was_imported_first():
    """A process that imports one kernel module before anything else (``kernels.flex``) still
    lists the backends in their order."""
    import subprocess
    import sys

    code = (
        "import bosch_eval.attention.kernels.flex\n"
        "from bosch_eval.attention.kernels import BACKENDS\n"
        "print(list(BACKENDS.names()))"
    )
    direct = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    plain = subprocess.run(
        [sys.executable, "-c", code.split("\n", 1)[1]], capture_output=True, text=True, check=True
    ).stdout
    assert direct == plain and direct.strip() == "['sdpa', 'blocked', 'flex', 'flash_attention_2']"
