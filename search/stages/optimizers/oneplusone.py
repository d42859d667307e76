"""``oneplusone``: a (1+1)-EA whose mutations swap a one and a zero within a block, for
problems too large for the others; fit for every problem."""

from __future__ import annotations

import itertools
import math
import random

from bosch_eval.search.stages.optimizers import OPTIMIZERS, Cutoff, Memo, Optimizer, SubProblem, start_point

# The (1+1)-EA stops after this many consecutive offspring that were all evaluated before:
# what is left unexplored is then practically out of its reach.
_MAX_REPEATED_OFFSPRING = 1_000


def _run_oneplusone(memo: Memo, problem: SubProblem) -> str:
    """(1+1)-EA with quota-preserving mutations: swap ``s`` ones with ``s`` zeros of the same block.

    ``s = 1 + Poisson(1)`` (capped at the swaps the blocks allow), the swap count of
    Scharnow, Tinnefeld and Wegener (2004) for permutation problems: mostly single swaps,
    sometimes a jump. Each swap picks a block uniformly among those with a one and a zero
    not yet swapped, then one of each inside it, so every block keeps its quota. The
    offspring replaces the parent when its loss is lower or equal. Offspring evaluated
    before cost nothing and are skipped.
    """
    x0, rng = start_point(memo, problem)
    starts = list(itertools.accumulate((size for size, _ in problem.parts), initial=0))
    capacity = sum(min(ones, size - ones) for size, ones in problem.parts)
    parent, parent_loss = x0, memo.values[x0]
    repeats = 0
    while not memo.spent and memo.evaluated < problem.size and repeats < _MAX_REPEATED_OFFSPRING:
        swaps = min(1 + _poisson_one(rng), capacity)
        ones = [[i for i in range(starts[b], starts[b + 1]) if parent[i]] for b in range(len(problem.parts))]
        zeros = [[i for i in range(starts[b], starts[b + 1]) if not parent[i]] for b in range(len(problem.parts))]
        child = list(parent)
        for _ in range(swaps):
            block = rng.choice([b for b in range(len(ones)) if ones[b] and zeros[b]])
            one = ones[block].pop(rng.randrange(len(ones[block])))
            zero = zeros[block].pop(rng.randrange(len(zeros[block])))
            child[one], child[zero] = 0, 1
        offspring = tuple(child)
        if memo.seen(offspring):
            repeats += 1
            continue
        repeats = 0
        value = memo(offspring, Cutoff(parent_loss, ties_win=True))
        if isinstance(value, float) and value <= parent_loss:
            parent, parent_loss = offspring, value
    return ""


OPTIMIZERS.register("oneplusone", Optimizer(_run_oneplusone, walks=True))


def _poisson_one(rng: random.Random) -> int:
    """A Poisson(1) draw (Knuth's product method) from ``rng`` alone."""
    threshold, product, count = math.exp(-1.0), rng.random(), 0
    while product > threshold:
        product *= rng.random()
        count += 1
    return count
