"""``exhaustive``: every feasible point (the product of the blocks' combinations), when there
are at most ``budget``; raced together when the loss races many points at once."""

from __future__ import annotations

import itertools
from collections.abc import Iterator

from bosch_eval.search.stages.optimizers import OPTIMIZERS, Memo, Optimizer, Point, SubProblem


def _k_subsets(n: int, k: int) -> Iterator[Point]:
    """Every point with exactly k ones, in lexicographic order of the positions of the ones."""
    for ones in itertools.combinations(range(n), k):
        point = [0] * n
        for i in ones:
            point[i] = 1
        yield tuple(point)


def _feasible_points(problem: SubProblem) -> Iterator[Point]:
    """Every feasible point: the product of the blocks' k-subsets, each in lexicographic order."""
    per_block = [list(_k_subsets(size, ones)) for size, ones in problem.parts]
    for parts in itertools.product(*per_block):
        yield tuple(itertools.chain.from_iterable(parts))


def _run_exhaustive(memo: Memo, problem: SubProblem) -> str:
    """Every feasible point, raced together when the memo has a racing loss of many points."""
    if memo.race_all is not None:
        points = list(_feasible_points(problem))
        for point, value in zip(points, memo.race_all(points), strict=True):
            memo.record(point, value)
    else:
        for point in _feasible_points(problem):
            if memo.spent:  # at the floor: no later point can be the answer
                break
            memo(point)
    return ""


def _exhaustive_unfit(problem: SubProblem) -> str | None:
    if problem.size <= problem.budget:
        return None
    return (
        f"exhaustive search needs C({problem.n}, {problem.k}) = {problem.size} evaluations, "
        f"more than the budget of {problem.budget}: raise the budget or use 'nomad'/'oneplusone'"
    )


OPTIMIZERS.register(
    "exhaustive", Optimizer(_run_exhaustive, _exhaustive_unfit, evaluations=lambda problem: problem.size)
)
