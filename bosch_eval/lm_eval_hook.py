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

Why not register earlier: 0.4.13's ``get_model`` imports ``lm_eval.models`` only while the
registry is empty, so an early ``bosch`` entry would hide every built-in model.
"""

from __future__ import annotations

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
_WATCHED = "lm_eval.models"


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


class _LoaderProxy:
    """Delegates everything to the real loader; runs :func:`register` after ``exec_module``.

    A proxy rather than patching the loader in place: some loaders are shared objects
    (classes, zip importers) and must not be modified for other modules.
    """

    def __init__(self, loader: object) -> None:
        self._loader = loader

    def create_module(self, spec: ModuleSpec) -> ModuleType | None:
        return self._loader.create_module(spec)  # type: ignore[attr-defined, no-any-return]

    def exec_module(self, module: ModuleType) -> None:
        self._loader.exec_module(module)  # type: ignore[attr-defined]
        _uninstall()
        register()

    def __getattr__(self, name: str) -> object:  # get_source, get_resource_reader, ...
        return getattr(self._loader, name)


class _LmEvalModelsFinder:
    """Meta-path finder that reacts to ``lm_eval.models`` only and finds nothing itself."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> ModuleSpec | None:
        if fullname != _WATCHED:
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


_FINDER = _LmEvalModelsFinder()


def _uninstall() -> None:
    if _FINDER in sys.meta_path:
        sys.meta_path.remove(_FINDER)


def install() -> None:
    """Arrange for :func:`register` to run once ``lm_eval.models`` has been imported."""
    if _WATCHED in sys.modules:  # imported late, after lm-eval already filled its registry
        register()
    elif _FINDER not in sys.meta_path:
        sys.meta_path.insert(0, _FINDER)


install()
