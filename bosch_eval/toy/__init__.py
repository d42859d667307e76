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


def resolve_model(name: str) -> str:
    """``"toy"`` (short for ``pretrained=$(bosch-eval toy-model --path)``) → the bundled
    model's directory; any other model id or path is returned unchanged."""
    return str(model_path()) if name == ALIAS else name
