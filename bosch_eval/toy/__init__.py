"""The bundled toy model: a small Qwen3 trained in this repo (``bosch_eval.toy.train``)
to need both local and long-range heads. Its card is ``model/README.md``."""

from __future__ import annotations

from pathlib import Path

MODEL_DIR = Path(__file__).resolve().parent / "model"


def model_path() -> Path:
    """Directory of the bundled checkpoint, loadable with ``from_pretrained``.

    Raises:
        FileNotFoundError: when the package was installed without its weights.
    """
    if not (MODEL_DIR / "model.safetensors").is_file():
        raise FileNotFoundError(f"{MODEL_DIR}: the bundled toy model's weights (model.safetensors) are missing")
    return MODEL_DIR


ALIAS = "toy"


def resolve_model(name: str, check: bool = True) -> str:
    """The one model resolver of every command: ``"toy"`` (short for
    ``pretrained=$(bosch-eval toy-model --path)``) → the bundled model's directory; any
    other id or path is returned unchanged, after checking (``check``) that it is a
    checkpoint directory or a hub id that resolves.

    Raises:
        bosch_eval.model_check.ModelError: the model does not exist (or the bundled weights are missing).
    """
    from bosch_eval.model_check import ModelError, check_model_exists

    if name == ALIAS:
        try:
            return str(model_path())
        except FileNotFoundError as err:
            raise ModelError(f"model 'toy': {err}") from None
    return check_model_exists(name) if check else name
