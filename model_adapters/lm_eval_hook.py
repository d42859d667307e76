"""Start-up hook that makes ``lm_eval --model bosch`` work with the stock lm-eval 0.4.13.

lm-eval 0.4.13 has no plugin discovery: its model registry only knows the names that
``lm_eval/models/__init__.py`` registers. The ``bosch_eval_lm_eval_hook.pth`` file that
``pip install`` puts into site-packages imports this module at every interpreter start.
It must stay cheap there, so it only appends a meta-path finder (no torch, no lm-eval,
not even ``typing``). The finder waits for ``lm_eval.models`` to be imported and, right
after that module has filled the registry with lm-eval's own lazy placeholders, adds
``bosch`` as one more lazy placeholder ("module:Class" string). Nothing of ours is
imported until someone asks for ``bosch``; then the adapter's ``@register_model("bosch")``
upgrades the placeholder to the class (the registry allows exactly that upgrade).

It lives beside the adapter, above the core: it names the adapter's class and resolves the
bundled models' aliases (:mod:`bosch_eval.models.model_check`), and every import of ours in it
sits inside the function that needs it, so that interpreter start imports nothing of ours.

Why not register earlier: 0.4.13's ``get_model`` imports ``lm_eval.models`` only while the
registry is empty, so an early ``bosch`` entry would hide every built-in model.

Tasks: 0.4.13 has no task discovery either; a ``TaskManager`` indexes lm-eval's own folder
(``include_defaults``) and the ``include_path`` it is given. The same finder waits for
``lm_eval.tasks.manager`` and wraps ``TaskManager.__init__`` so that a manager that indexes
lm-eval's own tasks indexes bosch-eval's folder too (first, so the caller's own paths still
win a name clash): ``lm_eval --tasks bosch_niah_calib`` needs no ``--include_path``. Where the
installed ``TaskManager`` takes no ``include_path``/``include_defaults``, or
``BOSCH_EVAL_NO_TASK_DISCOVERY=1`` keeps lm-eval's task list as shipped, lm-eval's
``Tasks not found`` for one of our task names gains a line saying which ``--include_path``
finds it (in the ``lm_eval`` command).

Two more things, only in the ``lm_eval`` command itself (never in other programs):

* ``--model bosch --model_args pretrained=toy`` (or ``toy-l``, ``smollm2``, a ``.gguf`` file, or
  ``tokenizer=toy``) is rewritten to the model's directory (a GGUF's converted checkpoint,
  converted on first use) before lm-eval reads its arguments: lm-eval hands
  model_args to every task as metadata, and upstream tasks that build their documents with
  the tokenizer (RULER's ``niah_*``) look it up by that name on the Hugging Face hub, which
  failed after a minute of network retries. Only ``key=value`` arguments are rewritten (not
  JSON ones, nor a ``--config`` file).
* Our errors (:class:`bosch_eval.runtime.errors.BoschError` and its subclasses: bad model_args, a model
  that cannot be used, an input longer than the model holds) end the command with one line,
  ``lm_eval: error: <message>``, instead of the message at the bottom of a traceback.
"""

from __future__ import annotations

import os
import sys

# `typing` is not loaded at interpreter start and importing it costs milliseconds;
# type checkers treat any name TYPE_CHECKING as true.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Sequence
    from importlib.machinery import ModuleSpec
    from types import ModuleType

MODEL_NAME = "bosch"
MODEL_TARGET = "bosch_eval.model_adapters.bosch:BoschLM"  # must equal f"{cls.__module__}:{cls.__name__}"
TASK_PREFIX = "bosch_"  # every task and group in bosch_eval/tasks is named bosch_*
NO_TASK_DISCOVERY = "BOSCH_EVAL_NO_TASK_DISCOVERY"
TASKS_HINT = 'hint: {task} is a bosch-eval task; lm-eval finds those with --include_path "$(bosch-eval tasks --path)"'
_tasks_discovered = False  # set once TaskManager indexes our folder by default


# Model args that name a model (the tokenizer is looked up by either).
_MODEL_ARG_KEYS = ("pretrained", "tokenizer")


def _is_lm_eval_cli(argv0: str) -> bool:
    # The console script. `python -m lm_eval` cannot be told apart at interpreter start
    # (sys.argv[0] is still "-m"), so it keeps lm-eval's own behaviour.
    return os.path.basename(argv0) in ("lm_eval", "lm-eval")


def resolve_bundled_aliases(argv: list[str]) -> list[str]:
    """``argv`` of ``lm_eval --model bosch`` with ``pretrained=toy``-style arguments given as the
    bundled model's directory (other argv unchanged)."""
    try:
        model = argv[argv.index("--model") + 1]
    except (ValueError, IndexError):
        return argv
    if model != "bosch":
        return argv
    from bosch_eval.models.model_check import names_a_local_model  # no torch: a few ms, lm_eval command only

    def rewrite(text: str) -> str:
        if text.lstrip().startswith("{"):  # JSON model_args: left as given
            return text
        items = text.split(",")
        for i, item in enumerate(items):
            key, sep, value = item.partition("=")
            if sep and key.strip() in _MODEL_ARG_KEYS and names_a_local_model(value.strip()):
                items[i] = f"{key}={_local_directory(value.strip())}"
        return ",".join(items)

    out = list(argv)
    in_model_args = False
    for i, arg in enumerate(out):
        if arg in ("--model_args", "-a"):
            in_model_args = True
        elif arg.startswith("--model_args="):
            out[i] = "--model_args=" + rewrite(arg.removeprefix("--model_args="))
            in_model_args = False
        elif arg.startswith("-"):
            in_model_args = False
        elif in_model_args:  # --model_args takes one or more values (nargs="+")
            out[i] = rewrite(arg)
    return out


def _local_directory(name: str) -> str:
    """The directory of a bundled or packaged model (converting a GGUF on first use), or ``name``
    unchanged when it cannot be resolved: the adapter then fails on it with its one-line error."""
    # Inside the function: the .pth line imports this module at every interpreter start.
    from bosch_eval.models.model_check import resolve_model
    from bosch_eval.runtime.errors import BoschError

    try:
        return resolve_model(name)
    except BoschError:
        return name


def missing_tasks_hint(exc: BaseException) -> str | None:
    """The line that tells where lm-eval finds a bosch-eval task it did not find, when our
    tasks are not indexed by default (``ValueError: Tasks not found: a, b``, lm-eval 0.4.13's
    message); None for any other error, or once they are (then the name is simply wrong)."""
    prefix = "Tasks not found: "
    if _tasks_discovered or not isinstance(exc, ValueError) or not str(exc).startswith(prefix):
        return None
    ours = [name.strip() for name in str(exc).removeprefix(prefix).split(",") if name.strip().startswith(TASK_PREFIX)]
    return TASKS_HINT.format(task=ours[0]) if ours else None


def _one_line_errors(exc_type: type[BaseException], exc: BaseException, tb: object) -> None:
    """sys.excepthook of the ``lm_eval`` command: our errors in one line, the rest as before
    (lm-eval's missing-task error followed by :func:`missing_tasks_hint`)."""
    errors = sys.modules.get("bosch_eval.runtime.errors")  # not loaded: the error cannot be ours
    if errors is not None and isinstance(exc, errors.BoschError):
        sys.stderr.write(f"lm_eval: error: {exc}\n")
        return
    sys.__excepthook__(exc_type, exc, tb)  # type: ignore[arg-type]
    hint = missing_tasks_hint(exc)
    if hint is not None:
        sys.stderr.write(hint + "\n")


def register() -> None:
    """Add ``bosch`` to lm-eval's model registry as a lazy placeholder, unless present.

    An existing entry wins: lm-eval releases with entry-point discovery (which reads our
    ``lm_eval.models`` entry point) or an earlier import of the adapter got there first.
    A failure here must never break lm-eval itself, so it only warns.
    """
    try:
        from lm_eval.api.registry import model_registry

        if MODEL_NAME not in model_registry:
            model_registry.register(MODEL_NAME, target=MODEL_TARGET)
    except Exception as exc:  # noqa: BLE001 - any registry API change: warn, keep lm-eval usable
        import warnings

        warnings.warn(f"bosch_eval: could not register lm-eval model {MODEL_NAME!r}: {exc!r}", RuntimeWarning)


def with_bundled_tasks(include_path: object, tasks_dir: str) -> object:
    """``include_path`` (None, a path or a list of them, as TaskManager takes it) with
    ``tasks_dir`` first, unless it is there already."""
    paths = (
        []
        if include_path is None
        else list(include_path)
        if isinstance(include_path, (list, tuple))
        else [include_path]
    )
    if any(os.path.realpath(str(path)) == os.path.realpath(tasks_dir) for path in paths):
        return include_path
    return [tasks_dir, *paths]


def discover_tasks(manager_module: ModuleType) -> None:
    """Wrap ``manager_module.TaskManager.__init__`` so that a manager indexing lm-eval's own
    tasks also indexes bosch-eval's (see the module docstring). A TaskManager without
    ``include_path`` and ``include_defaults`` is left alone (then the missing-task hint
    applies); an unexpected failure only warns, lm-eval must stay usable."""
    global _tasks_discovered
    if os.environ.get(NO_TASK_DISCOVERY, "") not in ("", "0"):
        return
    try:
        import functools
        import inspect

        from bosch_eval.runtime.lm_eval_session import (
            bundled_tasks_dir,
        )  # torch, numpy: once lm-eval's TaskManager loads

        manager = manager_module.TaskManager
        init = manager.__init__
        signature = inspect.signature(init)
        if getattr(init, "bosch_tasks_added", False) or not {"include_path", "include_defaults"} <= set(
            signature.parameters
        ):
            _tasks_discovered = getattr(init, "bosch_tasks_added", False)
            return
        tasks_dir = bundled_tasks_dir()

        @functools.wraps(init)
        def __init__(self: object, *args: object, **kwargs: object) -> None:
            bound = signature.bind(self, *args, **kwargs)
            bound.apply_defaults()
            if bound.arguments["include_defaults"]:
                bound.arguments["include_path"] = with_bundled_tasks(bound.arguments["include_path"], tasks_dir)
            init(*bound.args, **bound.kwargs)

        # Our wrapper, marked: a second run of the hook wraps nothing twice.
        __init__.bosch_tasks_added = True  # type: ignore[attr-defined]
        manager.__init__ = __init__
        _tasks_discovered = True
    except Exception as exc:  # noqa: BLE001 - any TaskManager change: warn, keep lm-eval usable
        import warnings

        warnings.warn(f"bosch_eval: could not add its tasks to lm-eval's default task paths: {exc!r}", RuntimeWarning)


# Watched module -> what runs right after it has been executed.
_ON_IMPORT = {"lm_eval.models": lambda module: register(), "lm_eval.tasks.manager": discover_tasks}


class _LoaderProxy:
    """Delegates everything to the real loader; runs the module's :data:`_ON_IMPORT` action
    after ``exec_module``.

    A proxy rather than patching the loader in place: some loaders are shared objects
    (classes, zip importers) and must not be modified for other modules.
    """

    def __init__(self, loader: object) -> None:
        self._loader = loader

    def create_module(self, spec: ModuleSpec) -> ModuleType | None:
        return self._loader.create_module(spec)  # type: ignore[attr-defined, no-any-return]

    def exec_module(self, module: ModuleType) -> None:
        self._loader.exec_module(module)  # type: ignore[attr-defined]
        if all(name in sys.modules for name in _ON_IMPORT):
            _uninstall()
        _ON_IMPORT[module.__name__](module)

    def __getattr__(self, name: str) -> object:  # get_source, get_resource_reader, ...
        return getattr(self._loader, name)


class _LmEvalFinder:
    """Meta-path finder that reacts to the :data:`_ON_IMPORT` modules only and finds nothing itself."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> ModuleSpec | None:
        if fullname not in _ON_IMPORT:
            return None
        # Ask the finders after us (the normal path finder, editable-install finders, ...).
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec: ModuleSpec | None = finder.find_spec(fullname, path, target)
            if spec is not None:
                if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                    spec.loader = _LoaderProxy(spec.loader)  # type: ignore[assignment]
                return spec
        return None


_FINDER = _LmEvalFinder()


def _uninstall() -> None:
    if _FINDER in sys.meta_path:
        sys.meta_path.remove(_FINDER)


def install() -> None:
    """Arrange for :func:`register` to run once ``lm_eval.models`` has been imported, and
    :func:`discover_tasks` once ``lm_eval.tasks.manager`` has; in the ``lm_eval`` command,
    also resolve bundled-model aliases and print our errors in one line."""
    argv = getattr(sys, "argv", None)  # absent in some embedded interpreters
    if argv and _is_lm_eval_cli(argv[0]):
        sys.argv[:] = resolve_bundled_aliases(sys.argv)
        if sys.excepthook is sys.__excepthook__:  # someone else's hook wins
            sys.excepthook = _one_line_errors
    for name, action in _ON_IMPORT.items():
        if name in sys.modules:  # imported late, after lm-eval already filled its registry
            action(sys.modules[name])
    if not all(name in sys.modules for name in _ON_IMPORT) and _FINDER not in sys.meta_path:
        sys.meta_path.insert(0, _FINDER)


install()
