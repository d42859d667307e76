"""The static rankings a ``guarded`` search turns into incumbents (:mod:`bosch_eval.search.guard.incumbents`).

``SearchSettings.rankings`` names them: a ranker's name (computed here, on the search's own
calibration set, exactly as ``bosch-eval rank --method M --calib-task T --calib-examples N
--calib-len L --seed S`` computes it) or ``NAME=FILE`` (a ``bosch-ranking/1`` file); None means
every registered ranker. A computed ranking is written to ``<out>/rankings/<method>.json`` and a
resumed search reads it from there when its inputs match, so a ranking is computed once per
search. Each ranking's incumbent is its mask at the search's ratio (⌈ρ·L·G⌉ most local groups).

The rankers read the examples of a calibration set of ``tasks/niah/calibration_sets.py``; a
search calibrated on other tasks gets no computed ranking by default (logged: the layer
heuristics are then its incumbents), and naming a method there is an error.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bosch_eval.masks.head_mask import HeadRanking, ModelShape
from bosch_eval.runtime.errors import SearchError
from bosch_eval.search.journal.store import mask_key
from bosch_eval.search.rankers import RANKERS
from bosch_eval.tasks.niah.calibration_sets import calibration_sets

if TYPE_CHECKING:
    from bosch_eval.search.rankers.driver import RankingInputs

log = logging.getLogger("bosch_eval.search")

RANKINGS_DIR = "rankings"


def split_rankings(rankings: Sequence[str] | None) -> tuple[list[str] | None, list[tuple[str, str]]]:
    """``(methods, files)``: the rankers to compute (None: every registered one) and the
    ``(name, path)`` of each ranking file named ``NAME=FILE``.

    Raises:
        SearchError: an entry ``NAME=`` or ``=FILE``.
    """
    if rankings is None:
        return None, []
    methods, files = [], []
    for entry in rankings:
        name, sep, path = entry.partition("=")
        if sep and (not name or not path):
            raise SearchError(f"rankings: expected a ranker's name or NAME=FILE, got {entry!r}")
        if sep:
            files.append((name, path))
        else:
            methods.append(entry)
    return methods, files


def ranking_sources(
    rankings: Sequence[str] | None, tasks: Sequence[str], include_paths: Sequence[str] = ()
) -> tuple[list[str], list[tuple[str, str]]]:
    """The rankers to compute and the ``(name, path)`` ranking files to read for the incumbents
    of a search calibrated on ``tasks``, checked before anything loads (the search and its
    ``--estimate`` both ask here).

    Raises:
        SearchError: a ranker that does not exist, or one named for calibration tasks the rankers
            cannot read (not one calibration set: ``tasks/niah/calibration_sets.py``, which also reads ``include_paths``).
    """
    methods, files = split_rankings(rankings)
    sets = sorted(calibration_sets(include_paths))
    rankable = len(tasks) == 1 and tasks[0] in sets
    if methods is None:
        if not rankable:
            log.info(
                "incumbents: no ranking is computed, since the rankers read the calibration sets %s and the search "
                "is calibrated on %s; the layer heuristics%s are the incumbents",
                sets, ", ".join(tasks), " and the given ranking files" if files else "",
            )  # fmt: skip
        return (list(RANKERS.names()) if rankable else []), files
    for method in methods:
        RANKERS.lookup(method, field="rankings")
    if methods and not rankable:
        raise SearchError(
            f"rankings: {methods} would be computed on the calibration set, but the rankers read only {sets} "
            f"and the search is calibrated on {list(tasks)}; pass ranking files as NAME=FILE instead"
        )
    return methods, files


def file_incumbents(files: Sequence[tuple[str, str]], shape: ModelShape, ratio: float) -> list[tuple[str, str]]:
    """``(name, mask key)`` of each ranking file's mask at ``ratio``.

    Raises:
        MaskError: a file that is not a ranking of a model of ``shape``.
    """
    pairs = []
    for name, path in files:
        ranking = HeadRanking.load(path)
        ranking.shape.check_matches(shape, f"rankings: {name}={path}")
        pairs.append((name, mask_key(ranking.to_mask(ratio).bits)))
    return pairs


def computed_incumbents(methods: Sequence[str], load: RankingLoad, ratio: float, out: Path) -> list[tuple[str, str]]:
    """``(method, mask key)`` of each ranking computed on the calibration set (or read back from
    ``<out>/rankings/<method>.json`` when made on the same inputs); the model loads once, only
    if some ranking is not on disk."""
    directory = out / RANKINGS_DIR
    pairs, model = [], None
    for method in methods:
        path = directory / f"{method}.json"
        ranking = HeadRanking.load(path) if path.is_file() else None
        if ranking is None or not load.made(ranking):
            if model is None:
                model = load.model()
            log.info("incumbents: computing the %s ranking on the calibration set", method)
            ranking = load.rank(method, *model)
            directory.mkdir(parents=True, exist_ok=True)
            ranking.save(path)
        pairs.append((method, mask_key(ranking.to_mask(ratio).bits)))
    return pairs


class RankingLoad:
    """How the rankings are computed: the model (loaded as ``bosch-eval rank`` loads it) and the
    calibration examples they read (:class:`~bosch_eval.search.rankers.driver.RankingInputs`)."""

    def __init__(
        self, model: str, path: str, inputs: RankingInputs, device: str | None, model_args: dict[str, Any] | None
    ) -> None:
        self.name, self.path, self.inputs, self.device, self.model_args = model, path, inputs, device, model_args

    def made(self, ranking: HeadRanking) -> bool:
        """Whether ``ranking`` was computed on these inputs (so a resume can take it as is)."""
        inputs, provenance = self.inputs, ranking.provenance
        expected = {"window": inputs.window, "calib_examples": inputs.examples, "calib_len": inputs.length,
                    "calib_seed": inputs.seed, "calib_task": inputs.task}  # fmt: skip
        return all(provenance.get(key) == value for key, value in expected.items())

    def model(self) -> tuple[Any, Any]:
        # Here, not at the top: the driver loads torch, and search --help lists the variants, guarded among them.
        from bosch_eval.search.rankers.driver import load_for_ranking

        return load_for_ranking(self.path, "float32", self.device, self.model_args or {})

    def rank(self, method: str, model: Any, tokenizer: Any) -> HeadRanking:
        # Here, not at the top: the driver loads torch, as in model().
        from bosch_eval.search.rankers.driver import RankingCompute, compute_ranking

        return compute_ranking(
            method, model, tokenizer, self.inputs, compute=RankingCompute(device=self.device), model_name=self.name
        )
