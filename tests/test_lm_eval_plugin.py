"""The stock ``lm_eval`` finds ``--model bosch`` through the installed start-up hook.

The hook acts at interpreter start (``bosch_eval_lm_eval_hook.pth`` in site-packages), so
most checks run in fresh interpreters. They need the package installed with the .pth
(``pip install -e .[test]`` or ``pip install .``); a source checkout on PYTHONPATH is not enough.
"""

from __future__ import annotations

import json
import os
import site
import subprocess
import sys
from pathlib import Path

import pytest

import bosch_eval
from bosch_eval.model_adapters import lm_eval_hook
from bosch_eval.runtime.lm_eval_session import bundled_tasks_dir

PTH_NAME = "bosch_eval_lm_eval_hook.pth"
FIXTURE_TASKS = Path(__file__).parent / "fixtures" / "tasks"
HEAVY = ("torch", "transformers", "lm_eval")


def run_python(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, cwd=cwd, timeout=120, check=False)


def python_json(code: str, cwd: Path) -> dict:
    result = run_python("-c", code, cwd=cwd)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def pth_file() -> Path:
    site_dirs = [*site.getsitepackages(), site.getusersitepackages()]
    for directory in site_dirs:
        if (path := Path(directory, PTH_NAME)).is_file():
            return path
    pytest.fail(
        f"{PTH_NAME} is not in any site-packages directory {site_dirs}: the lm-eval hook is not installed; "
        "install the package with `pip install -e .` or `pip install .` (setup.py writes the file)"
    )


@pytest.mark.slow
def test_hook_is_active_at_start_and_imports_nothing_heavy(pth_file, tmp_path):
    state = python_json(
        "import json, sys; print(json.dumps({'hook': 'bosch_eval.model_adapters.lm_eval_hook' in sys.modules,"
        f" 'heavy': sorted(m for m in sys.modules if m.split('.')[0] in {HEAVY!r}"
        f" or m.startswith(('bosch_eval.model_adapters.', 'bosch_eval.models')) and m != {lm_eval_hook.__name__!r})}}))",
        cwd=tmp_path,
    )
    assert state["hook"], f"{pth_file} did not import bosch_eval.model_adapters.lm_eval_hook at interpreter start"
    assert state["heavy"] == []


@pytest.mark.slow
def test_lingering_pth_without_package_is_silent(pth_file, tmp_path):
    """An uninstalled bosch_eval must not make every interpreter start print errors."""
    line = pth_file.read_text(encoding="utf-8").strip()
    assert line.startswith("import ")  # site.py executes only lines that start with "import"
    # -I -S: no site-packages, no cwd, so bosch_eval cannot be imported, as after an uninstall.
    result = run_python("-I", "-S", "-c", f"{line}\nimport sys; assert 'bosch_eval' not in sys.modules", cwd=tmp_path)
    assert result.returncode == 0 and result.stderr == "", result.stderr


@pytest.mark.slow
def test_registry_has_builtin_models_and_lazy_bosch(pth_file, tmp_path):
    """0.4.13's get_model imports lm_eval.models only while the registry is empty: bosch must not pre-empt it."""
    state = python_json(
        """
import json, sys
from lm_eval.api.registry import get_model, model_registry
before = len(model_registry)
hf = get_model("hf")
placeholder = dict(model_registry.items())["bosch"]
adapter_loaded_early = "bosch_eval.model_adapters.bosch" in sys.modules
try:
    get_model("no-such-model")
except ValueError as exc:
    listing = str(exc)
bosch = get_model("bosch")
print(json.dumps({"before": before, "hf": f"{hf.__module__}:{hf.__name__}", "placeholder": placeholder,
                  "adapter_loaded_early": adapter_loaded_early, "listing": listing, "bosch": bosch.__name__,
                  "bosch_mro": [f"{c.__module__}:{c.__name__}" for c in bosch.__mro__],
                  "upgraded": dict(model_registry.items())["bosch"] is bosch}))
""",
        cwd=tmp_path,
    )
    assert state["before"] == 0
    assert state["hf"] == "lm_eval.models.huggingface:HFLM"
    assert state["placeholder"] == lm_eval_hook.MODEL_TARGET == "bosch_eval.model_adapters.bosch:BoschLM"
    assert not state["adapter_loaded_early"]
    names = state["listing"].split("Supported model names:")[1].replace(",", " ").split()
    assert {"hf", "vllm", "bosch"} <= set(names)
    assert state["bosch"] == "BoschLM" and "lm_eval.models.huggingface:HFLM" in state["bosch_mro"]
    assert state["upgraded"]


@pytest.mark.slow
def test_importing_the_adapter_first_upgrades_the_placeholder(pth_file, tmp_path):
    """``@register_model("bosch")`` meets our placeholder (its own HFLM import loads lm_eval.models): no duplicate error."""
    state = python_json(
        """
import json
from bosch_eval.model_adapters.bosch import BoschLM
from lm_eval.api.registry import get_model
print(json.dumps({"same": get_model("bosch") is BoschLM, "hf": get_model("hf").__name__}))
""",
        cwd=tmp_path,
    )
    assert state == {"same": True, "hf": "HFLM"}


def test_register_keeps_an_existing_entry(pth_file):
    import lm_eval.models  # noqa: F401  (runs the hook if this process has not yet)
    from lm_eval.api.registry import model_registry

    before = dict(model_registry.items())["bosch"]
    lm_eval_hook.register()
    assert dict(model_registry.items())["bosch"] is before


@pytest.mark.slow
def test_stock_lm_eval_cli_runs_model_bosch(pth_file, tiny_model_dir, tmp_path):
    executable = Path(sys.executable).parent / "lm_eval"
    assert executable.exists(), f"no {executable}: lm-eval is not installed in this environment"
    result = subprocess.run(
        [str(executable), "--model", "bosch",
         "--model_args", f"pretrained={tiny_model_dir},dtype=float32,layers=bme,ratio=0.5,window=4",
         "--tasks", "bosch_test_choice", "--include_path", str(FIXTURE_TASKS),
         "--device", "cpu", "--batch_size", "4", "--limit", "4"],
        capture_output=True, text=True, cwd=tmp_path, timeout=300, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    assert "bosch ({'pretrained'" in result.stdout and "|bosch_test_choice|" in result.stdout


class TestLmEvalCommand:
    """Only in the ``lm_eval`` command: bundled aliases become paths before lm-eval reads them
    (its tasks look the tokenizer up by the pretrained= name), and our errors end in one line."""

    TOY = str(Path(bosch_eval.__file__).parent / "toy" / "model")  # bosch_eval/toy/model

    @pytest.mark.parametrize(
        ("argv", "expected"),
        [
            (["--model", "bosch", "--model_args", "pretrained=toy,mask=full"], ["--model", "bosch", "--model_args", "pretrained=TOY,mask=full"]),
            (["--model", "bosch", "--model_args=mask=full,pretrained=toy"], ["--model", "bosch", "--model_args=mask=full,pretrained=TOY"]),
            (["--model", "bosch", "-a", "pretrained=toy", "tokenizer=toy", "--tasks", "toy"], ["--model", "bosch", "-a", "pretrained=TOY", "tokenizer=TOY", "--tasks", "toy"]),
            (["--model", "hf", "--model_args", "pretrained=toy"], ["--model", "hf", "--model_args", "pretrained=toy"]),
            (["--model", "bosch", "--model_args", '{"pretrained": "toy"}'], ["--model", "bosch", "--model_args", '{"pretrained": "toy"}']),
            (["--model", "bosch", "--model_args", "pretrained=toyish"], ["--model", "bosch", "--model_args", "pretrained=toyish"]),
        ],
    )  # fmt: skip
    def test_bundled_aliases_become_paths(self, argv, expected):
        resolved = lm_eval_hook.resolve_bundled_aliases(["lm_eval", *argv])
        assert resolved == ["lm_eval", *(a.replace("TOY", self.TOY) for a in expected)]

    def fake_lm_eval(self, tmp_path: Path, body: str) -> Path:
        """A script named lm_eval: the start-up hook treats it as the lm_eval command."""
        script = tmp_path / "lm_eval"
        script.write_text(f"#!{sys.executable}\n{body}\n")
        script.chmod(0o755)
        return script

    @pytest.mark.slow
    def test_argv_is_rewritten_at_interpreter_start(self, pth_file, tmp_path):
        script = self.fake_lm_eval(tmp_path, "import json, sys; print(json.dumps(sys.argv[1:]))")
        result = subprocess.run(
            [str(script), "--model", "bosch", "--model_args", "pretrained=toy"],
            capture_output=True,
            text=True,
            check=True,
        )
        assert json.loads(result.stdout) == ["--model", "bosch", "--model_args", f"pretrained={self.TOY}"]

    @pytest.mark.slow
    def test_our_errors_end_in_one_line_and_others_keep_the_traceback(self, pth_file, tmp_path):
        script = self.fake_lm_eval(
            tmp_path,
            "import sys\nfrom bosch_eval.runtime.errors import SettingsError\nraise (SettingsError if sys.argv[1] == 'ours' else KeyError)('kv_cache: expected one of')",
        )
        ours = subprocess.run([str(script), "ours"], capture_output=True, text=True)
        assert ours.returncode == 1 and ours.stderr == "lm_eval: error: kv_cache: expected one of\n"
        other = subprocess.run([str(script), "other"], capture_output=True, text=True)
        assert other.returncode == 1 and "Traceback" in other.stderr and "KeyError" in other.stderr


class TestTaskDiscovery:
    """lm-eval 0.4.13 has no task discovery: the hook makes every TaskManager that indexes
    lm-eval's own tasks index ours too, and where it cannot, lm-eval's "Tasks not found" for
    one of ours says which --include_path finds it."""

    def fake_manager_module(self, signature: str = "include_path=None, include_defaults=True, metadata=None"):
        """A module whose TaskManager records what it was given (no lm-eval index is built)."""
        namespace: dict = {}
        exec(
            f"class TaskManager:\n    def __init__(self, verbosity=None, {signature}):\n        self.given = dict(locals())\n",
            namespace,
        )
        return type("module", (), {"TaskManager": namespace["TaskManager"]})

    def test_our_folder_comes_first_once(self):
        ours = bundled_tasks_dir()
        assert lm_eval_hook.with_bundled_tasks(None, ours) == [ours]
        assert lm_eval_hook.with_bundled_tasks("mine", ours) == [
            ours,
            "mine",
        ]  # later paths win a name clash: the user's
        assert lm_eval_hook.with_bundled_tasks(["a", "b"], ours) == [ours, "a", "b"]
        assert lm_eval_hook.with_bundled_tasks(("a", Path(ours) / "."), ours) == (
            "a",
            Path(ours) / ".",
        )  # there already

    def test_a_manager_with_lm_evals_defaults_gets_our_folder(self, monkeypatch):
        monkeypatch.setattr(lm_eval_hook, "_tasks_discovered", False)
        module = self.fake_manager_module()
        lm_eval_hook.discover_tasks(module)
        assert module.TaskManager(include_path="mine").given["include_path"] == [bundled_tasks_dir(), "mine"]
        assert module.TaskManager(None, ["mine"], False).given["include_path"] == [
            "mine"
        ]  # only lm-eval's defaults get ours
        assert (
            lm_eval_hook._tasks_discovered
            and lm_eval_hook.missing_tasks_hint(ValueError("Tasks not found: bosch_x")) is None
        )

    def test_a_manager_without_those_arguments_is_left_alone_and_the_hint_applies(self, monkeypatch):
        monkeypatch.setattr(lm_eval_hook, "_tasks_discovered", False)
        module = self.fake_manager_module("paths=None")
        init = module.TaskManager.__init__
        lm_eval_hook.discover_tasks(module)
        assert module.TaskManager.__init__ is init and not lm_eval_hook._tasks_discovered
        hint = lm_eval_hook.missing_tasks_hint(ValueError("Tasks not found: arc_easyy, bosch_niah_calib"))
        assert (
            hint
            == 'hint: bosch_niah_calib is a bosch-eval task; lm-eval finds those with --include_path "$(bosch-eval tasks --path)"'
        )
        assert lm_eval_hook.missing_tasks_hint(ValueError("Tasks not found: arc_easyy")) is None
        assert lm_eval_hook.missing_tasks_hint(KeyError("Tasks not found: bosch_niah")) is None

    def test_the_switch_keeps_lm_evals_task_list(self, monkeypatch):
        monkeypatch.setattr(lm_eval_hook, "_tasks_discovered", False)
        monkeypatch.setenv(lm_eval_hook.NO_TASK_DISCOVERY, "1")
        module = self.fake_manager_module()
        init = module.TaskManager.__init__
        lm_eval_hook.discover_tasks(module)
        assert module.TaskManager.__init__ is init

    @pytest.mark.slow
    def test_task_manager_in_process_finds_our_tasks(self, pth_file):
        from lm_eval.tasks import TaskManager

        manager = TaskManager()  # lm-eval's own index too: ~12 s
        assert {"bosch_niah_calib", "bosch_niah", "bosch_longbench", "arc_easy"} <= set(manager.all_tasks)
        assert "bosch_niah_calib" not in TaskManager(include_defaults=False).all_tasks

    @pytest.mark.slow
    def test_stock_lm_eval_cli_finds_our_tasks_without_include_path(self, pth_file, tmp_path):
        result = run_lm_eval(["--model", "bosch", "--model_args", "pretrained=toy,mask=full", "--tasks", "bosch_niah_calib",
                              "--metadata", '{"seq_len": 256, "num_examples": 2}', "--device", "cpu", "--limit", "2"], tmp_path)  # fmt: skip
        assert result.returncode == 0, result.stderr[-3000:]
        assert "|bosch_niah_calib|" in result.stdout

    @pytest.mark.slow
    def test_without_discovery_the_missing_task_error_says_where_it_is(self, pth_file, tmp_path):
        result = run_lm_eval(["--model", "bosch", "--model_args", "pretrained=toy,mask=full", "--tasks", "bosch_niah_calib", "--device", "cpu"],
                             tmp_path, **{lm_eval_hook.NO_TASK_DISCOVERY: "1"})  # fmt: skip
        assert result.returncode != 0
        *_, error, hint = result.stderr.rstrip().splitlines()
        assert error == "ValueError: Tasks not found: bosch_niah_calib"
        assert (
            hint
            == 'hint: bosch_niah_calib is a bosch-eval task; lm-eval finds those with --include_path "$(bosch-eval tasks --path)"'
        )


def run_lm_eval(args: list[str], cwd: Path, **env: str) -> subprocess.CompletedProcess[str]:
    """The stock ``lm_eval`` command of this environment."""
    executable = Path(sys.executable).parent / "lm_eval"
    assert executable.exists(), f"no {executable}: lm-eval is not installed in this environment"
    environment = {**os.environ, "OMP_NUM_THREADS": "1", **env}
    return subprocess.run(
        [str(executable), *args], capture_output=True, text=True, cwd=cwd, env=environment, timeout=600, check=False
    )
