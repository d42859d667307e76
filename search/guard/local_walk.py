"""The ``guarded`` variant's local search over the whole model (a deviation from the paper).

Stage 3 keeps every layer's Stage-2 quota, and ``refine`` moves groups only within a layer, so
no stage can move a full group from one layer to another: on SmolLM2 at ρ = 0.75 Stage 2's
quotas put Razor's mask outside Stage 3's space (issue 53). This search can: it is one
sub-problem over every KV group of the model, solved by the (1+1)-EA of
:mod:`bosch_eval.search.stages.optimizers`, whose mutations swap SWA and full groups (1 + Poisson(1)
swaps, mostly one) anywhere in the model, so every mask it asks keeps its start's number of SWA
groups. It goes through :func:`bosch_eval.search.stages.subproblems.solve`, so it is journaled, resumed and
raced as every stage is (an offspring stops once it cannot reach its parent's S).
"""

from __future__ import annotations

from dataclasses import replace

from bosch_eval.masks.head_mask import ModelShape
from bosch_eval.search.objective.score_book import Bits, ScoreBook
from bosch_eval.search.objective.scoring import Anchors
from bosch_eval.search.stages.optimizers import OPTIMIZERS
from bosch_eval.search.stages.progress import StageProgress
from bosch_eval.search.stages.subproblems import Choice, StageSettings, SubResult, solve


def walker() -> str:
    """The first optimizer that walks from its start by swaps within a block (the (1+1)-EA)."""
    return next(name for name, optimizer in OPTIMIZERS.items() if optimizer.walks)


def local_search(
    book: ScoreBook,
    anchors: Anchors,
    shape: ModelShape,
    start: Bits,
    calls: int,
    settings: StageSettings,
    label: str,
    progress: bool = True,
) -> tuple[Bits, SubResult]:
    """The best mask the (1+1)-EA finds from ``start`` within ``calls`` new S() calls, swapping
    groups anywhere in the model; ``start`` itself when none scores better (the first of equal
    scores is kept). ``label`` names the run (its seed derives from it); ``progress``: a tqdm
    bar and a log line, as the stages show (minutes of S() calls otherwise pass silently)."""
    cells = [[(layer, group)] for layer in range(shape.num_layers) for group in range(shape.num_kv_heads)]
    swa = sum(row.count(0) for row in start)
    # The start, scored already, is the optimizer's first ask: the budget is one more than the calls.
    choice = Choice(cells, ((len(cells), swa),), swa / len(cells), calls + 1, "local", f"local/{label}")
    with StageProgress(
        f"local search from {label}", [(calls + 1, 0)], book, progress, settings.higher_is_better, complete_swa=swa
    ) as bar:
        bits, result = solve(book, anchors, start, choice, replace(settings, optimizer=walker()), start=start)
        bar.report(result)
    return bits, result
