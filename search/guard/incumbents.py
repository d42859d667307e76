"""Incumbents: the cheap masks a ``guarded`` search scores before Stage 1 (a deviation from the paper).

Static rankings and layer heuristics cost minutes, the search hours. On SmolLM2 at ρ = 0.875 the
paper's search returned a mask that scored 0.688 on its own calibration set where Razor's
ranking scored 0.984 (issue 53), having never scored Razor's mask nor anything near it. So the
``guarded`` variant scores them first, with the search's own S(), and keeps the best as the bar
its result must clear (:mod:`bosch_eval.search.guard.verdict`).

The incumbents are the masks named in ``SearchSettings.incumbents`` (the api puts every static
ranking's mask at the target ratio there, computed on the calibration set when not given) and
every layer heuristic of :data:`~bosch_eval.masks.layer_heuristics.LAYER_HEURISTICS` at the
target ratio (``rand`` with the search's seed). A layer heuristic turns ⌈ρL⌉ whole layers SWA,
which may be more KV groups than ⌈ρLG⌉: such a mask is as cheap or cheaper, so it competes on S.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

from bosch_eval.masks.head_mask import ModelShape
from bosch_eval.masks.layer_heuristics import LAYER_HEURISTICS, layer_heuristic_mask
from bosch_eval.search.journal.store import mask_key
from bosch_eval.search.objective.racing import RaceBound
from bosch_eval.search.objective.score_book import Bits, ScoreBook
from bosch_eval.search.objective.scoring import Anchors
from bosch_eval.search.objective.tie_break import tie_key_bits

log = logging.getLogger("bosch_eval.search")

Outcome = float | RaceBound


def incumbent_masks(shape: ModelShape, ratio: float, given: tuple[tuple[str, str], ...], seed: int) -> dict[str, Bits]:
    """The incumbents by name: the ``given`` (name, mask key) pairs, then every layer heuristic
    at ``ratio`` (``rand`` drawn with ``seed``, named ``rand:<seed>``)."""
    masks = {name: tie_key_bits(key) for name, key in given}
    for name in LAYER_HEURISTICS.names():
        label = f"{name}:{seed}" if name == "rand" else name
        masks[label] = layer_heuristic_mask(name, shape, ratio, seed).bits
    return masks


def score_incumbents(book: ScoreBook, anchors: Anchors, masks: Mapping[str, Bits]) -> dict[str, Outcome]:
    """S of each distinct incumbent mask, by mask key, journaled as stage ``incumbent``.

    With racing the masks are raced together (:meth:`ScoreBook.race_many`): only the best needs
    its exact S, the bar the search must clear; the others may stop at a bound below it. Masks
    several incumbents share are scored once.
    """
    bits = {mask_key(mask): mask for mask in masks.values()}
    keys = list(bits)
    if book.racing:
        outcomes = book.race_many([bits[key] for key in keys], "incumbent", lambda _, score: -anchors.normalize(score))
    else:
        outcomes = [book.score(bits[key], "incumbent") for key in keys]
    return dict(zip(keys, outcomes, strict=True))


def best_incumbent(masks: Mapping[str, Bits], scores: Mapping[str, Outcome], higher_is_better: bool) -> str:
    """The name of the first incumbent with the best exact S (one racing stopped cannot be it)."""
    sign = 1.0 if higher_is_better else -1.0
    exact = [name for name, mask in masks.items() if not isinstance(scores[mask_key(mask)], RaceBound)]
    return max(exact, key=lambda name: sign * float(scores[mask_key(masks[name])]))  # max keeps the first of equals
