"""The bundled toy models: small Qwen3s trained in this repo (``bosch_eval.toy.train``)
to need both local and long-range heads. Their cards are ``model/README.md`` (``toy``) and
``model_l/README.md`` (``toy-l``)."""

from __future__ import annotations

from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent

# Alias -> checkpoint directory. "toy" has 4 layers x 4 KV groups (16 head-selection
# variables, small enough to enumerate); "toy-l" has 8 x 8 (64 variables), where the search
# space is too large to guess.
BUNDLED_MODELS: dict[str, Path] = {"toy": PACKAGE_DIR / "model", "toy-l": PACKAGE_DIR / "model_l"}


def model_path(name: str = "toy") -> Path:
    """Directory of a bundled checkpoint (``"toy"`` or ``"toy-l"``), loadable with ``from_pretrained``.

    Raises:
        KeyError: ``name`` is not a bundled model.
        FileNotFoundError: when the package was installed without its weights.
    """
    if name not in BUNDLED_MODELS:
        raise KeyError(f"{name!r} is not a bundled model; expected one of {sorted(BUNDLED_MODELS)}")
    directory = BUNDLED_MODELS[name]
    if not (directory / "model.safetensors").is_file():
        raise FileNotFoundError(f"{directory}: the bundled model {name!r}'s weights (model.safetensors) are missing")
    return directory


def bundled_alias(path: str) -> str | None:
    """The alias of a bundled model's directory, or None for any other path or id."""
    return next((alias for alias, directory in BUNDLED_MODELS.items() if path == str(directory)), None)


def resolve_model(name: str, check: bool = True) -> str:
    """The one model resolver of every command: ``"toy"`` or ``"toy-l"`` (short for
    ``pretrained=$(bosch-eval toy-model --path [--name toy-l])``) → the bundled model's
    directory; any other id or path is returned unchanged, after checking (``check``) that
    it is a checkpoint directory or a hub id that resolves.

    Raises:
        bosch_eval.model_check.ModelError: the model does not exist (or the bundled weights are missing).
    """
    from bosch_eval.model_check import ModelError, check_model_exists

    if name in BUNDLED_MODELS:
        try:
            return str(model_path(name))
        except FileNotFoundError as err:
            raise ModelError(f"model {name!r}: {err}") from None
    return check_model_exists(name) if check else name
