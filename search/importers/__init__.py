"""Importers: published head patterns → ``bosch-ranking/1`` rankings or ``bosch-mask/1`` masks.

Each importer reads one upstream file format, checks it against the model's shape (L layers,
H query heads, G KV groups) and returns our own type; the formats were read from the upstream
repositories, not guessed, and none of their code is used here. One module per format
(:mod:`.duo`, :mod:`.prulong`, :mod:`.retrieval_json`; its docstring says what it reads),
registering an :class:`Importer` in :data:`IMPORTERS` under its ``--format`` name; a new
format is a new module here (docs/extending.md). What the formats share (grids, head counts,
provenance) is in :mod:`.grid`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from bosch_eval.masks.head_mask import HeadMask, HeadRanking, ModelShape
from bosch_eval.models.model_check import model_config, resolve_model
from bosch_eval.runtime.errors import MaskError
from bosch_eval.runtime.registry import Registry


@dataclass(frozen=True)
class Importer:
    """One upstream format.

    Attributes:
        read: ``read(path, shape, *, model=None, window=None)``: the file as a ranking or a mask
            of a model of ``shape``; ``window`` (None: none, or the file's own) goes with it.
        upstream: where the format comes from (repository and file), for the provenance and ``--help``.
        what: what the file holds, in a few words, for ``--help``.
        gives: ``"ranking"`` (any ratio) or ``"mask"`` (the file's own ratio).
    """

    read: Callable[..., HeadRanking | HeadMask]
    upstream: str
    what: str
    gives: str


IMPORTERS: Registry[Importer] = Registry("pattern format", package=__name__, field="format", error=MaskError)


def import_pattern(
    fmt: str, path: str | Path, shape: ModelShape, *, model: str | None = None, window: int | None = None
) -> HeadRanking | HeadMask:
    """Import ``path`` in format ``fmt`` (a name in :data:`IMPORTERS`) for a model shape.

    Returns:
        A :class:`HeadRanking` or a :class:`HeadMask`, as the format's :attr:`Importer.gives`.
    """
    return IMPORTERS.lookup(fmt).read(path, shape, model=model, window=window)


def model_shape(model: str) -> ModelShape:
    """L, H, G of a Hugging Face model id or local path (``toy``: the bundled model), from
    its config only (no weights)."""
    return ModelShape.from_config(model_config(resolve_model(model)))
