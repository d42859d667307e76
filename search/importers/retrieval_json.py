"""``retrieval-json`` — Retrieval-Head / RazorAttention style JSON score files

Source: nightdessert/Retrieval_Head, ``head_score/*.json`` (written by
``retrieval_head_detection.py`` as ``json.dump(self.head_counter, f)``; read back in
``needle_in_haystack_with_mask.py`` as ``np.mean`` of each list, sorted descending,
top heads = retrieval heads). One JSON object, keys ``"<layer>-<head>"`` (query-head
index), values the list of per-trial retrieval scores; e.g. ``Mistral-7B-v0.2-hf.json``
has 32×32 keys for a model with 8 KV heads, i.e. per query head. A head's score is the
mean of its list (a bare number is taken as is — an extension for single-score files
such as RazorAttention's, §B.3.5 of the BOSCH paper, where smaller = more local).
**Higher = retrieval head = least local**: ``more_local="lower"``.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

from bosch_eval.masks.head_mask import HeadRanking, ModelShape, check_window
from bosch_eval.runtime.checks import is_number
from bosch_eval.runtime.errors import MaskError
from bosch_eval.search.importers import IMPORTERS, Importer
from bosch_eval.search.importers.grid import check_layers, per_group, provenance, read_text, width_error

UPSTREAM = "nightdessert/Retrieval_Head (head_score/*.json)"
_KEY = re.compile(r"^(\d+)-(\d+)$")


def _head_score(value: Any, where: str) -> float:
    """A head's score: the mean of its list of per-trial scores (or a bare number)."""
    values = value if isinstance(value, list) else [value]
    if not values:
        raise MaskError(f"{where} is an empty list, expected at least one retrieval score")
    for item in values:
        if not is_number(item):
            raise MaskError(f"{where} holds {item!r}, expected a number or a list of numbers")
        if not math.isfinite(item):
            raise MaskError(f"{where} holds {item}, expected finite scores")
    return math.fsum(values) / len(values)


def import_retrieval_json(
    path: str | Path, shape: ModelShape, *, model: str | None = None, window: int | None = None
) -> HeadRanking:
    """Import a Retrieval-Head style ``{"layer-head": [scores]}`` JSON file as a ranking.

    A head's score is the mean of its list; under GQA a group's score is the mean over
    its query heads. Higher = retrieval head, so ``more_local="lower"``.
    """
    path = Path(path)
    try:
        data = json.loads(read_text(path))
    except json.JSONDecodeError as err:
        raise MaskError(f"{path}: not valid JSON ({err})") from None
    if not isinstance(data, dict) or not data:
        raise MaskError(
            f'{path}: expected a non-empty JSON object of "<layer>-<head>": [scores], got {type(data).__name__}'
        )
    scores: dict[tuple[int, int], float] = {}
    for key, value in data.items():
        match = _KEY.match(key)
        if match is None:
            raise MaskError(f'{path}: key {key!r} is not of the form "<layer>-<head>" (e.g. "0-3")')
        scores[int(match[1]), int(match[2])] = _head_score(value, f"{path}: key {key!r}")
    num_layers = max(layer for layer, _ in scores) + 1
    width = max(head for _, head in scores) + 1
    check_layers(f"{path}: keys for {num_layers} layers (indices 0…{num_layers - 1})", num_layers, shape, model)
    if width not in (shape.num_kv_heads, shape.num_heads):
        raise width_error(f"{path}: keys for {width} heads per layer (indices 0…{width - 1})", shape, model)
    for layer in range(num_layers):
        for head in range(width):
            if (layer, head) not in scores:
                raise MaskError(
                    f"{path}: key '{layer}-{head}' is missing, expected one key per layer and head "
                    f"({num_layers}×{width} = {num_layers * width} keys, got {len(scores)})"
                )
    rows = [[scores[layer, head] for head in range(width)] for layer in range(num_layers)]
    grid, per_query = per_group(rows, shape, path, "heads", model)  # shape checked above
    return HeadRanking(
        tuple(tuple(row) for row in grid),
        more_local="lower",
        method="retrieval-head",
        num_heads=shape.num_heads,
        window=None if window is None else check_window(window),
        model=model,
        provenance=provenance("retrieval-json", UPSTREAM, path, per_query),
    )


IMPORTERS.register(
    "retrieval-json", Importer(import_retrieval_json, UPSTREAM, "{'layer-head': [scores]}", gives="ranking")
)
