"""BOSCH's sub-problems: Stage 1 (Algorithm 1), Stage 3 (Algorithm 3) and the layer-level ablation.

Each stage is a sequence of sub-problems. A sub-problem fixes the mask outside a set of
*variables* (one KV group each, or a whole layer for the layer-level ablation), asks an
optimizer (:mod:`bosch_eval.search.stages.optimizers`) to convert exactly ``k`` of them to SWA
while minimizing the loss of Eq. 5 on the whole model, and commits the best assignment
before the next sub-problem starts.

Quotas. A sub-problem over several layers (a Stage-3 ratio group, a B-multi chunk)
converts exactly ⌈r·G⌉ groups *in each of its layers* (``quota="layer"``, the default):
§2.2.2 says the ratios "serve as quotas for the within-layer head selection in Stage 3",
and Algorithm 3 line 5 sets M_ℓ ← ⌈r_ℓH⌉ per layer. ``quota="chunk"`` asks only for
⌈r·G⌉·|chunk| groups anywhere in the chunk (what Algorithm 3's single index set I_g and
its Eq. 5 penalty would allow if read alone): four layers at r = 0.5 may then end with
0, 1, 7 and 8 SWA groups of 8. It is kept as a named deviation.

Every S(z) goes through a :class:`ScoreBook`: a mask already scored (in this run or in the
journal of a killed one) is never evaluated again, and a new score is journaled before the
next evaluation starts. Replaying a search with the same seed therefore takes exactly the
same steps and reaches the same mask. A racing search also journals every per-example
value as it is scored; its resume replays the killed run's calls from those values (the same
races, bounds and ties) instead of looking scores up, and scores only what was never scored.

Doing less work without changing the answer (issue 18): with ``racing`` the book scores a
candidate of an exhaustive or (1+1)-EA sub-problem only until it provably cannot beat the
optimizer's cutoff (:mod:`bosch_eval.search.objective.racing`); and before each sub-problem it tells
the score function the lowest layer the sub-problem varies, so an adapter with a
prefix-activation cache can reuse the hidden states entering that layer.
"""

from __future__ import annotations

import functools
import itertools
import logging
import math
import zlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from bosch_eval.masks.head_mask import HeadMask, ModelShape, ceil_count
from bosch_eval.search.journal.store import mask_key
from bosch_eval.search.objective.racing import RaceBound
from bosch_eval.search.objective.score_book import Bits, ScoreBook
from bosch_eval.search.objective.scoring import Anchors, subproblem_loss, swa_share
from bosch_eval.search.stages.optimizers import OPTIMIZERS, Bound, Cutoff, SubProblem, choose_method, minimize
from bosch_eval.search.stages.progress import StageProgress

log = logging.getLogger("bosch_eval.search")

Cell = tuple[int, int]  # (layer, KV group)


@dataclass(frozen=True)
class SubResult:
    """What one sub-problem decided (kept for the report and the mask's provenance)."""

    stage: str
    layers: tuple[int, ...]
    target_ratio: float
    variables: int
    converted: int
    method: str
    evaluations: int
    score: float
    loss: float
    crash: str = ""  # why the optimizer stopped before its budget (PyNomad died), if it did
    pruned: int = 0  # of the evaluations, those racing stopped early (bounds, not scores)

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__, layers=list(self.layers))


@dataclass
class StageOutcome:
    bits: Bits
    subproblems: list[SubResult] = field(default_factory=list)


QUOTAS = ("layer", "chunk")


@dataclass(frozen=True)
class LayerQuotas:
    """What Stage 3 (and ``refine``) convert in each layer: ⌈r·G⌉ groups for its Stage-2 ratio r.

    Attributes:
        ratios: r per layer, bottom to top.
        pool: a mask whose SWA groups are the only ones a layer may convert (the ``nested``
            variant: Stage 1's mask); None: every group (the paper's Stage 3).
    """

    ratios: Sequence[float]
    pool: Bits | None = None


@dataclass(frozen=True)
class StageSettings:
    """The knobs every stage shares.

    Attributes:
        chunk_layers: the most layers one sub-problem searches jointly (B.2's max |G_g|).
        quota: ``layer`` (⌈r·G⌉ SWA groups in every layer) or ``chunk`` (in the chunk as a whole).
        higher_is_better: the calibration metric's direction (for progress lines only;
            the loss gets it from the anchors).
    """

    budget_per_layer: int
    optimizer: str
    alpha: float
    seed: int
    chunk_layers: int
    quota: str = "layer"
    higher_is_better: bool = True


def subproblem_seed(seed: int, label: str) -> int:
    """A stable per-sub-problem seed (Python's hash() of a str changes between processes)."""
    return zlib.crc32(f"{seed}/{label}".encode())


@dataclass(frozen=True)
class Choice:
    """One sub-problem: which variables (each a set of cells switched together) may turn SWA,
    and how many must: ``blocks`` = ``((size, ones), ...)`` over consecutive variables.

    Attributes:
        variables: the cell sets, in order.
        blocks: the quota of each block of consecutive variables.
        target_ratio: ρ̄ of Eq. 5's penalty.
        budget: the optimizer's evaluations.
        stage: the stage journaled with each score (``stage1``, ``stage3``, ``refine``, ``layer``).
        label: names the sub-problem (its optimizer's seed derives from it).
    """

    variables: Sequence[Sequence[Cell]]
    blocks: Sequence[tuple[int, int]]
    target_ratio: float
    budget: int
    stage: str
    label: str


def _with_swa(base: Bits, variables: Sequence[Sequence[tuple[int, int]]], selection: tuple[int, ...]) -> Bits:
    """``base`` with the cells of each chosen variable SWA (0) and of the others full (1)."""
    rows = [list(row) for row in base]
    for chosen, cells in zip(selection, variables, strict=True):
        for layer, group in cells:
            rows[layer][group] = 0 if chosen else 1
    return tuple(tuple(row) for row in rows)


def _subproblem(choice: Choice, blocks: tuple[tuple[int, int], ...], seed: int, start: Bits | None) -> SubProblem:
    """The optimizer's problem: ``choice``'s variables, its blocks' quotas, a start from ``start``'s bits."""
    x0 = None if start is None else tuple(int(start[cells[0][0]][cells[0][1]] == 0) for cells in choice.variables)
    return SubProblem(
        n=len(choice.variables),
        k=sum(ones for _, ones in blocks),
        budget=choice.budget,
        seed=subproblem_seed(seed, choice.label),
        x0=x0,
        blocks=blocks if len(blocks) > 1 else None,
    )


def solve(
    book: ScoreBook, anchors: Anchors, base: Bits, choice: Choice, settings: StageSettings, start: Bits | None = None
) -> tuple[Bits, SubResult]:
    """Convert exactly ``ones`` of each block of ``choice.variables`` to SWA in ``base``.

    The loss is Eq. 5 with the penalty α(ρ̄ − r)² averaged over the blocks (one block: Eq. 5
    as printed), so every feasible point pays the same penalty and off-quota points more.
    ``start`` (a mask) seeds the optimizer's start point instead of a random one. Where the
    book knows the best S the metric can take, the optimizer stops at the first mask that
    scores it: the first of equal scores wins, so it is the mask the whole budget would return.
    """
    variables, target_ratio, stage = choice.variables, choice.target_ratio, choice.stage
    blocks = tuple((int(size), int(ones)) for size, ones in choice.blocks)
    starts = list(itertools.accumulate((size for size, _ in blocks), initial=0))

    bits_for = functools.partial(_with_swa, base, variables)

    def loss_of(selection: tuple[int, ...], score: float) -> float:
        shares = [swa_share(selection[starts[b] : starts[b + 1]]) for b in range(len(blocks))]
        return subproblem_loss(anchors.normalize(score), shares, target_ratio, settings.alpha)

    def loss(selection: tuple[int, ...]) -> float:
        return loss_of(selection, book.score(bits_for(selection), stage))

    # Ŝ and Eq. 5 are monotone in S: the best reachable S gives the lowest reachable loss.
    def race(selection: tuple[int, ...], cutoff: Cutoff) -> float | Bound:
        outcome = book.race(bits_for(selection), stage, lambda best: cutoff.reachable(loss_of(selection, best)))
        return (
            Bound(loss_of(selection, outcome.score)) if isinstance(outcome, RaceBound) else loss_of(selection, outcome)
        )

    def race_all(selections: list[tuple[int, ...]]) -> list[float | Bound]:
        outcomes = book.race_many(
            [bits_for(x) for x in selections], stage, lambda i, score: loss_of(selections[i], score)
        )
        return [
            Bound(loss_of(x, outcome.score)) if isinstance(outcome, RaceBound) else loss_of(x, outcome)
            for x, outcome in zip(selections, outcomes, strict=True)
        ]

    problem = _subproblem(choice, blocks, settings.seed, start)
    floor = None
    if book.best_possible is not None:  # every feasible point pays the same penalty: any one gives the floor
        feasible = tuple(int(i < ones) for size, ones in blocks for i in range(size))
        floor = loss_of(feasible, book.best_possible)
    with book.varying_from(min(layer for cells in variables for layer, _ in cells)):
        racing = {"race": race, "race_all": race_all} if book.racing else {}
        result = minimize(loss, problem, method=settings.optimizer, floor=floor, **racing)
    best = bits_for(result.best)
    layers = tuple(sorted({layer for cells in variables for layer, _ in cells}, reverse=True))
    summary = SubResult(
        stage=stage,
        layers=layers,
        target_ratio=target_ratio,
        variables=len(variables),
        converted=problem.k,
        method=result.method,
        evaluations=result.evaluations,
        score=book.known[mask_key(best)],
        loss=result.best_loss,
        crash=result.crash,
        pruned=result.pruned,
    )
    if result.crash:
        log.warning(
            "%s layers %s: NOMAD stopped after %d masks asked (%s); the best feasible mask it got is kept",
            stage, list(layers), result.evaluations, result.crash,
        )  # fmt: skip
    return best, summary


def _bare_problem(blocks: Sequence[tuple[int, int]], budget: int) -> SubProblem:
    blocks = tuple(blocks)
    return SubProblem(
        n=sum(size for size, _ in blocks),
        k=sum(ones for _, ones in blocks),
        budget=budget,
        seed=0,
        blocks=blocks if len(blocks) > 1 else None,
    )


def expected_method(blocks: Sequence[tuple[int, int]], budget: int, optimizer: str) -> str:
    """The optimizer a sub-problem with these quota ``blocks`` gets (:func:`choose_method`)."""
    return choose_method(_bare_problem(blocks, budget), optimizer)


def expected_evaluations(blocks: Sequence[tuple[int, int]], budget: int, optimizer: str) -> int:
    """Upper bound on a sub-problem's evaluations (the chosen optimizer's own bound)."""
    problem = _bare_problem(blocks, budget)
    return OPTIMIZERS[choose_method(problem, optimizer)].evaluations(problem)


def unfit_for_chunks(optimizer: str, groups: int, layers: int, quota: str) -> str | None:
    """Why ``optimizer`` cannot take Stage 3's sub-problems of ``layers`` layers of ``groups`` groups
    under ``quota``, whatever quotas Stage 2 gives them (None: it can, or ``auto`` chooses)."""
    if optimizer not in OPTIMIZERS:  # auto: each sub-problem gets an optimizer fit for it
        return None
    # One SWA group per layer, and no budget limit: only what does not wait for Stage 2 is checked.
    return OPTIMIZERS[optimizer].unfit(_bare_problem(quota_blocks(groups, 1, layers, quota), 2**63))


def quota_blocks(groups: int, ones_per_layer: int, layers: int, quota: str) -> tuple[tuple[int, int], ...]:
    """The blocks of a sub-problem over ``layers`` layers of ``groups`` KV groups each
    (:func:`pool_blocks` with equal pools)."""
    return pool_blocks([groups] * layers, ones_per_layer, quota)


def pool_blocks(sizes: Sequence[int], ones_per_layer: int, quota: str) -> tuple[tuple[int, int], ...]:
    """The blocks of a sub-problem over layers that choose among ``sizes[i]`` groups each:
    one per layer (``quota="layer"``) or one for all of them (``quota="chunk"``)."""
    if quota == "layer":
        return tuple((size, ones_per_layer) for size in sizes)
    if quota == "chunk":
        return ((sum(sizes), ones_per_layer * len(sizes)),)
    raise ValueError(f"quota: expected one of {list(QUOTAS)}, got {quota!r}")


def _chunks(layers: Sequence[int], max_layers: int) -> list[list[int]]:
    """Split layers into the fewest nearly equal consecutive parts of at most ``max_layers``.

    B.2: "If the number of layers [exceeds] that number, G_g of Algorithm 3 is partitioned
    into smaller equally size subsets." Sizes are equal where the count divides, else
    differ by one (the first parts one larger), as ``numpy.array_split`` splits.
    """
    import numpy as np  # here, not at import: `bosch-eval search --help` must not load numpy

    parts = max(1, math.ceil(len(layers) / max_layers))
    return [
        part.tolist() for part in np.array_split(np.asarray(layers, dtype=int), parts) if len(part)
    ]  # ints, for JSON


def _cells(shape: ModelShape, layers: Sequence[int], pool: Bits | None = None) -> list[list[Cell]]:
    """One variable per KV group of ``layers``: every group, or only those ``pool`` has as SWA."""
    return [[(layer, group)] for layer in layers for group in _pool_groups(shape, layer, pool)]


def _pool_groups(shape: ModelShape, layer: int, pool: Bits | None) -> list[int]:
    """The groups of ``layer`` a stage may convert: all, or those SWA (0) in ``pool``."""
    return [group for group in range(shape.num_kv_heads) if pool is None or pool[layer][group] == 0]


def stage1(
    book: ScoreBook,
    anchors: Anchors,
    shape: ModelShape,
    ratio: float,
    settings: StageSettings,
    layers_per_problem: int = 1,
    progress: bool = True,
) -> tuple[StageOutcome, list[float]]:
    """Algorithm 1: top layer to bottom, convert exactly ⌈ρG⌉ groups per layer on the updated model.

    ``layers_per_problem > 1`` is the B-multi ablation (each sub-problem covers that many
    consecutive layers and converts ⌈ρG⌉ groups in each of them, or in total with
    ``settings.quota == "chunk"``). Returns the stage's mask and s_best per layer (bottom
    to top; in B-multi, every layer of a sub-problem gets its score).
    """
    per_layer = ceil_count(ratio, shape.num_kv_heads)
    problems = _chunks(list(range(shape.num_layers - 1, -1, -1)), layers_per_problem)
    blocks = [quota_blocks(shape.num_kv_heads, per_layer, len(layers), settings.quota) for layers in problems]
    budgets = [settings.budget_per_layer * len(layers) for layers in problems]
    plan = [
        (expected_evaluations(b, budget, settings.optimizer), min(layers))
        for b, budget, layers in zip(blocks, budgets, problems, strict=True)
    ]
    bits: Bits = HeadMask.uniform(shape, full=True).bits
    scores = [0.0] * shape.num_layers
    outcome = StageOutcome(bits)
    complete = sum(ones for layer_blocks in blocks for _, ones in layer_blocks)
    with StageProgress("stage 1", plan, book, progress, settings.higher_is_better, complete_swa=complete) as bar:
        for layers, layer_blocks, budget in zip(problems, blocks, budgets, strict=True):
            label = "stage1/" + ",".join(map(str, layers))
            bits, result = solve(
                book,
                anchors,
                bits,
                Choice(_cells(shape, layers), layer_blocks, ratio, budget, "stage1", label),
                settings,
            )
            for layer in layers:
                scores[layer] = result.score
            outcome.subproblems.append(result)
            bar.report(result)
    outcome.bits = bits
    return outcome, scores


def stage1_probes(
    book: ScoreBook, anchors: Anchors, shape: ModelShape, settings: StageSettings, progress: bool = True
) -> tuple[StageOutcome, list[float]]:
    """Stage 1 when ⌈ρG⌉ = G (a deviation from Algorithm 1, the ``guarded`` variant): each layer
    measured alone from the full model, every group of that layer SWA and every other layer full.

    Algorithm 1's cumulative pass turns whole layers SWA from the top when ⌈ρG⌉ = G (SmolLM2's
    G = 3 at ρ > ⅔), reaches the all-SWA floor after a few layers and reads every layer below
    as "no drop" (issue 53). A probe per layer sees each layer's own drop, at the same L calls
    (one candidate per layer either way). Returns the mask the cumulative pass ends with (every
    group SWA, the union of the probes) and S of each probe, bottom to top.
    """
    groups = shape.num_kv_heads
    full: Bits = HeadMask.uniform(shape, full=True).bits
    layers = list(range(shape.num_layers - 1, -1, -1))
    plan = [(1, layer) for layer in layers]
    scores = [0.0] * shape.num_layers
    outcome = StageOutcome(HeadMask.uniform(shape, full=False).bits)
    with StageProgress("stage 1 (probes)", plan, book, progress, settings.higher_is_better, complete_swa=groups) as bar:
        for layer in layers:
            choice = Choice(
                _cells(shape, [layer]),
                ((groups, groups),),
                1.0,
                settings.budget_per_layer,
                "stage1",
                f"stage1-probe/{layer}",
            )
            _, result = solve(book, anchors, full, choice, settings)
            scores[layer] = result.score
            outcome.subproblems.append(result)
            bar.report(result)
    return outcome, scores


def stage3(
    book: ScoreBook,
    anchors: Anchors,
    shape: ModelShape,
    quotas: LayerQuotas,
    settings: StageSettings,
    progress: bool = True,
) -> StageOutcome:
    """Algorithm 3: per ratio group, most localizable first, convert ⌈r·G⌉ groups per layer.

    A group's layers are searched jointly (their head choices interact), split into nearly
    equal parts of at most ``settings.chunk_layers`` layers (B.2). Every layer keeps its
    quota of ⌈r·G⌉ SWA groups unless ``settings.quota == "chunk"``. A layer whose quota is
    0 stays full, and one whose quota is every group it may convert gets them all: nothing
    to search. ``quotas.pool`` (the ``nested`` variant: Stage 1's mask) limits the groups a
    layer may convert to those SWA in it.

    Raises:
        ValueError: a layer's quota exceeds the groups the pool leaves it.
    """
    layer_ratios, pool = quotas.ratios, quotas.pool
    choices = {layer: _pool_groups(shape, layer, pool) for layer in range(shape.num_layers)}
    groups = sorted(set(layer_ratios), reverse=True)
    max_layers = settings.chunk_layers
    problems: list[tuple[float, list[int]]] = []
    rows = [list(row) for row in HeadMask.uniform(shape, full=True).bits]
    quota = {ratio: ceil_count(ratio, shape.num_kv_heads) for ratio in groups}
    for ratio in groups:
        searched = []
        for layer in range(shape.num_layers - 1, -1, -1):
            if layer_ratios[layer] != ratio:
                continue
            if quota[ratio] > len(choices[layer]):
                raise ValueError(
                    f"stage 3: layer {layer} has quota {quota[ratio]} at ratio {ratio:g} but only groups {choices[layer]} to convert"
                )
            if quota[ratio] == len(choices[layer]):  # quota 0 with nothing to convert, or every group it may convert
                for group in choices[layer]:
                    rows[layer][group] = 0
            elif quota[ratio]:
                searched.append(layer)
        problems.extend((ratio, part) for part in _chunks(searched, max_layers))
    bits: Bits = tuple(tuple(row) for row in rows)
    outcome = StageOutcome(bits)
    blocks = [
        pool_blocks([len(choices[layer]) for layer in layers], quota[ratio], settings.quota)
        for ratio, layers in problems
    ]
    plan = [
        (expected_evaluations(b, settings.budget_per_layer * len(layers), settings.optimizer), min(layers))
        for b, (_, layers) in zip(blocks, problems, strict=True)
    ]
    complete = sum(row.count(0) for row in bits) + sum(ones for layer_blocks in blocks for _, ones in layer_blocks)
    with StageProgress("stage 3", plan, book, progress, settings.higher_is_better, complete_swa=complete) as bar:
        for (ratio, layers), layer_blocks in zip(problems, blocks, strict=True):
            label = f"stage3/{ratio}/" + ",".join(map(str, layers))
            budget = settings.budget_per_layer * len(layers)
            choice = Choice(_cells(shape, layers, pool), layer_blocks, ratio, budget, "stage3", label)
            bits, result = solve(book, anchors, bits, choice, settings)
            outcome.subproblems.append(result)
            bar.report(result)
    outcome.bits = bits
    return outcome


def layer_level(
    book: ScoreBook, anchors: Anchors, shape: ModelShape, ratio: float, settings: StageSettings, progress: bool = True
) -> StageOutcome:
    """B-layer: one sub-problem over whole layers, exactly ⌈ρL⌉ SWA layers, budget κ·L."""
    layers = list(range(shape.num_layers - 1, -1, -1))
    variables = [[(layer, group) for group in range(shape.num_kv_heads)] for layer in layers]
    k = ceil_count(ratio, shape.num_layers)
    budget = settings.budget_per_layer * shape.num_layers
    plan = [(expected_evaluations(((len(variables), k),), budget, settings.optimizer), 0)]
    complete = k * shape.num_kv_heads
    with StageProgress("layer search", plan, book, progress, settings.higher_is_better, complete_swa=complete) as bar:
        choice = Choice(variables, ((len(variables), k),), ratio, budget, "layer", "layer")
        bits, result = solve(book, anchors, HeadMask.uniform(shape, full=True).bits, choice, settings)
        bar.report(result)
    return StageOutcome(bits, [result])


def refine(
    book: ScoreBook,
    anchors: Anchors,
    shape: ModelShape,
    bits: Bits,
    quotas: LayerQuotas,
    settings: StageSettings,
    passes: int,
    progress: bool = True,
) -> StageOutcome:
    """Coordinate descent after Stage 3 (beyond the paper): up to ``passes`` passes that each
    re-solve every layer's sub-problem with all other layers fixed.

    A layer keeps its number of SWA groups (its Stage-3 quota) and is searched with budget κ
    from its current groups, in Stage 3's order (largest ratio first, top layer first);
    layers with no choice (all full, every group it may convert SWA) are skipped; the pool of
    ``quotas`` (Stage 3's) limits those groups as it limited Stage 3. A layer's new groups replace the
    old only when they score strictly better, so ties never move the mask and the descent
    ends. Stops after the first pass without an improvement.
    """
    layer_ratios, pool = quotas.ratios, quotas.pool
    sizes = {layer: len(_pool_groups(shape, layer, pool)) for layer in range(shape.num_layers)}
    order = sorted(
        (layer for layer in range(shape.num_layers) if 0 < bits[layer].count(0) < sizes[layer]),
        key=lambda layer: (-layer_ratios[layer], -layer),
    )
    outcome = StageOutcome(bits)
    plan = passes * [
        (
            expected_evaluations(
                ((sizes[layer], bits[layer].count(0)),), settings.budget_per_layer, settings.optimizer
            ),
            layer,
        )
        for layer in order
    ]
    complete = sum(row.count(0) for row in bits)  # refinement keeps every layer's count
    with StageProgress("refine", plan, book, progress, settings.higher_is_better, complete_swa=complete) as bar:
        for number in range(1, passes + 1):
            improved = False
            for layer in order:
                current = anchors.normalize(book.score(bits, "refine"))
                choice = Choice(
                    _cells(shape, [layer], pool), ((sizes[layer], bits[layer].count(0)),), layer_ratios[layer],
                    settings.budget_per_layer, "refine", f"refine{number}/{layer}",
                )  # fmt: skip
                candidate, result = solve(book, anchors, bits, choice, settings, start=bits)
                if anchors.normalize(result.score) > current:
                    bits, improved = candidate, True
                outcome.subproblems.append(result)
                bar.report(result)
            if not improved:
                break
    outcome.bits = bits
    return outcome
