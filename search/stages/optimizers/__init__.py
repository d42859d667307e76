"""Black-box binary optimizers for BOSCH's sub-problems (paper §2.2, Appendix B.2).

A sub-problem has ``n`` binary variables (``1`` = convert that variable to SWA) and asks
for the point with exactly ``k`` ones that minimizes an expensive loss (one LLM
evaluation per point). The variables may be split into consecutive *blocks* with a quota
each (one block per layer: Algorithm 3 converts ⌈r_ℓ·G⌉ groups *in each layer*); the
point must then have exactly its quota of ones in every block. Three optimizers, one module
each, registering itself in :data:`OPTIMIZERS` under its name, chosen by ``auto`` as in
Appendix B.2 (a new optimizer is a new module here, docs/extending.md; ``auto`` takes it only
where none of these fits, so never, since ``oneplusone`` fits every problem):

- ``exhaustive`` (:mod:`.exhaustive`): every feasible point (the product of the blocks' combinations), when
  there are at most ``budget``.
- ``nomad`` (:mod:`.nomad`): MADS (NOMAD 4 through PyNomad) on binary variables, for ``n <= 50`` and
  one block. Not for several blocks: binary MADS with a per-block penalty almost never
  proposes a point that meets every quota (measured, 4 blocks of 8 variables with 2 ones
  each: 2 feasible points among 100 evaluated, each evaluation an LLM call), and an
  integer encoding of each block's choices crashes PyNomad 4.6.0 (``BB_INPUT_TYPE I``:
  "ArrayOfDouble: Array is not defined", then a segfault, even on a 2-variable quadratic).
  ``auto`` gives such problems to the (1+1)-EA.
- ``oneplusone`` (:mod:`.oneplusone`): a (1+1)-EA whose mutations swap a one and a zero *within a block*, for
  larger ``n``.

The loss is defined on every 0/1 point of length ``n``, not only on feasible ones: the
caller adds the paper's penalty α(ρ̄_I(z) − ρ̄)² (Eq. 5; per block when there are
several), so MADS may step off the feasible set and pay for it, but the point returned
is always feasible.

Racing: ``exhaustive`` hands every feasible point to a racing loss of many points
(``race_all``), which may answer a :class:`Bound` for any point that provably is not the
first of least loss. ``oneplusone`` calls a racing loss (``race``) with a :class:`Cutoff`,
the parent's loss an offspring must reach to be accepted; it answers a :class:`Bound` when
the offspring provably cannot. A bounded point counts as evaluated but is never chosen.
NOMAD (its poll and model search read every value) and the EA's start point get exact
losses. Racing losses that never stop early make each optimizer take exactly the steps it
takes without them.

Every optimizer is deterministic: the sequence of loss calls depends only on the seed and
on the values the loss returned. A killed search is resumed by replaying it against the
journaled values, so nothing here may read the clock, the global random state, or the
iteration order of a set.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass

from bosch_eval.runtime.checks import is_int, is_number
from bosch_eval.runtime.registry import Registry

Point = tuple[int, ...]


@dataclass(frozen=True)
class Cutoff:
    """What a candidate's loss must reach to matter: below ``loss`` (the first of equal losses
    wins), or at most ``loss`` when ``ties_win`` (the (1+1)-EA accepts an equal offspring)."""

    loss: float
    ties_win: bool = False

    def reachable(self, lowest_loss: float) -> bool:
        """Whether a candidate whose loss is at least ``lowest_loss`` can still matter."""
        return lowest_loss <= self.loss if self.ties_win else lowest_loss < self.loss


@dataclass(frozen=True)
class Bound:
    """A candidate scored only until its cutoff became unreachable: its loss is at least ``loss``."""

    loss: float


Loss = Callable[[Point], float]
RacingLoss = Callable[[Point, Cutoff], "float | Bound"]
# Every point's loss at once, raced together: exact for the first point of least loss,
# a Bound only for points that provably are not it.
RacingLosses = Callable[[list[Point]], "list[float | Bound]"]

AUTO = "auto"  # not an optimizer: picks one per sub-problem (choose_method)
NOMAD_MAX_VARIABLES = 50  # beyond this, MADS needs too many evaluations per improvement (§2.2, B.2)


@dataclass(frozen=True)
class SubProblem:
    """One black-box search: choose exactly ``k`` of ``n`` binary variables.

    Attributes:
        n: number of binary variables; ``x[i] == 1`` converts variable ``i`` to SWA.
        k: the returned point has exactly ``k`` ones (``0 <= k <= n``).
        budget: the most distinct points the optimizer may evaluate (``>= 1``).
        seed: seeds every random choice of the optimizer.
        x0: the start point (feasible); ``None`` draws one from ``seed``.
        blocks: ``((size, ones), ...)``: consecutive blocks of the variables, each with
            exactly ``ones`` ones in the returned point (sizes sum to ``n``, quotas to
            ``k``). ``None`` is one block ``((n, k),)``.
    """

    n: int
    k: int
    budget: int
    seed: int
    x0: Point | None = None
    blocks: tuple[tuple[int, int], ...] | None = None

    def __post_init__(self) -> None:
        for name in ("n", "k", "budget", "seed"):
            value = getattr(self, name)
            if not is_int(value):
                raise ValueError(f"SubProblem.{name}: expected an integer, got {value!r}")
        if self.n < 1:
            raise ValueError(f"SubProblem.n: expected at least 1 variable, got {self.n}")
        if not 0 <= self.k <= self.n:
            raise ValueError(f"SubProblem.k: expected 0 <= k <= n={self.n}, got {self.k}")
        if self.budget < 1:
            raise ValueError(f"SubProblem.budget: expected at least 1 evaluation, got {self.budget}")
        if self.blocks is not None:
            blocks = self.blocks
            if (
                not isinstance(blocks, tuple)
                or not blocks
                or any(not isinstance(b, tuple) or len(b) != 2 or not all(type(v) is int for v in b) for b in blocks)
                or any(not (size >= 1 and 0 <= ones <= size) for size, ones in blocks)
            ):
                raise ValueError(
                    f"SubProblem.blocks: expected a tuple of (size >= 1, 0 <= ones <= size) pairs, got {blocks!r}"
                )
            if sum(size for size, _ in blocks) != self.n or sum(ones for _, ones in blocks) != self.k:
                raise ValueError(
                    f"SubProblem.blocks: sizes must sum to n={self.n} and quotas to k={self.k}, got {blocks!r}"
                )
        if self.x0 is not None:
            x0 = self.x0
            if (
                not isinstance(x0, tuple)
                or len(x0) != self.n
                or any(b not in (0, 1) or isinstance(b, float) for b in x0)
            ):
                raise ValueError(f"SubProblem.x0: expected a tuple of {self.n} entries 0 or 1, got {x0!r}")
            if sum(x0) != self.k:
                raise ValueError(f"SubProblem.x0: expected exactly k={self.k} ones, got {sum(x0)}")
            if not self.feasible(x0):
                raise ValueError(
                    f"SubProblem.x0: expected exactly the quota of ones in every block {self.parts}, got {x0!r}"
                )

    @property
    def parts(self) -> tuple[tuple[int, int], ...]:
        """The blocks as ``((size, ones), ...)``; one block ``((n, k),)`` when none were given."""
        return self.blocks if self.blocks is not None else ((self.n, self.k),)

    @property
    def size(self) -> int:
        """The number of feasible points: C(n, k), or the product of the blocks' C(size, ones)."""
        return math.prod(math.comb(size, ones) for size, ones in self.parts)

    def feasible(self, point: Point) -> bool:
        """Whether ``point`` has exactly its quota of ones in every block."""
        start = 0
        for size, ones in self.parts:
            if sum(point[start : start + size]) != ones:
                return False
            start += size
        return True


@dataclass(frozen=True)
class OptimizerResult:
    """The best evaluated point with exactly ``k`` ones, and what finding it cost."""

    best: Point
    best_loss: float
    evaluations: int  # distinct points evaluated, i.e. calls to the loss
    method: str  # the name of the optimizer that ran
    crash: str = ""  # why NOMAD ended before its budget (PyNomad died); empty otherwise
    pruned: int = 0  # of the evaluations, those stopped early by racing (a bound, no value)


@dataclass(frozen=True)
class Optimizer:
    """One black-box optimizer of sub-problems.

    Attributes:
        run: evaluates points through the memo (which keeps the budget and the racing
            losses) until it is done; returns why it ended before its budget (a crash) or "".
        unfit: why it cannot take a problem, or None when it can.
        evaluations: the most points it evaluates on a problem (the cost model's bound).
        raced: whether it may be handed racing losses (NOMAD reads every value: never raced).
        walks: whether it moves from its start point by swapping a one and a zero within a
            block, so every point it asks keeps the start's ones per block (the guarded
            search's local search takes the first optimizer that walks).
    """

    run: Callable[[Memo, SubProblem], str]
    unfit: Callable[[SubProblem], str | None] = lambda problem: None
    evaluations: Callable[[SubProblem], int] = lambda problem: problem.budget
    raced: bool = True
    walks: bool = False


# Registration order is B.2's preference: ``auto`` takes the first optimizer fit for a problem.
OPTIMIZERS: Registry[Optimizer] = Registry(
    "optimizer",
    package=__name__,
    first=("exhaustive", "nomad", "oneplusone"),
    field="optimizer method",
    error=ValueError,
)


def optimizer_methods() -> tuple[str, ...]:
    """What ``method`` may be: ``auto`` or a registered optimizer's name."""
    return (AUTO, *OPTIMIZERS.names())


def choose_method(problem: SubProblem, method: str = AUTO) -> str:
    """Resolve ``method`` for ``problem`` as in Appendix B.2, or say why it cannot run.

    ``auto`` is the first registered optimizer fit for the problem: ``exhaustive`` when the
    feasible points fit the budget, else ``nomad`` up to ``NOMAD_MAX_VARIABLES`` variables
    in one block, else ``oneplusone``. A problem with a single candidate (``k`` is 0 or
    ``n``) gets ``auto``'s choice whatever was asked: there is nothing to search.

    Raises:
        ValueError: for an unknown method, or one that cannot take ``problem`` (``exhaustive``
            when the feasible points exceed the budget, ``nomad`` on more than
            ``NOMAD_MAX_VARIABLES`` variables or on several blocks).
    """
    if method not in optimizer_methods():
        raise ValueError(f"optimizer method: expected one of {list(optimizer_methods())}, got {method!r}")
    if method == AUTO or problem.size == 1:
        return next(name for name, optimizer in OPTIMIZERS.items() if optimizer.unfit(problem) is None)
    reason = OPTIMIZERS[method].unfit(problem)
    if reason is not None:
        raise ValueError(reason)
    return method


def minimize(
    loss: Loss,
    problem: SubProblem,
    method: str = "auto",
    race: RacingLoss | None = None,
    race_all: RacingLosses | None = None,
    floor: float | None = None,
) -> OptimizerResult:
    """Find the point with exactly ``k`` ones that minimizes ``loss`` within the budget.

    Args:
        loss: maps any 0/1 tuple of length ``n`` to a finite float; expensive, so it (or
            ``race``) is called at most once per distinct point and at most ``budget`` times.
        problem: the sub-problem.
        method: ``auto`` or a name in :data:`OPTIMIZERS` (see :func:`choose_method`).
        race: the same loss, told a :class:`Cutoff`: it may stop early and return a
            :class:`Bound` when the point provably cannot reach the cutoff (``oneplusone``).
        race_all: the same loss of a list of points, raced together (``exhaustive``).
        floor: the least loss any feasible point can have (the loss of the metric's best
            score), when known: the optimizer stops at the first feasible point that has it,
            which is the point it would have returned after the whole budget.

    Returns:
        The best evaluated feasible point (the first one found on ties). If PyNomad died
        mid-run (see ``nomad_process``), it is the best among the points evaluated until
        then, and ``crash`` says so.

    Raises:
        ValueError: when ``method`` cannot run on ``problem``, or ``loss`` returns
            something other than a finite number.
    """
    method = choose_method(problem, method)
    memo = Memo(loss, problem.budget, race, race_all, floor, problem.feasible)
    crash = OPTIMIZERS[method].run(memo, problem)
    # min() keeps the first of equal losses, and memo.values is in evaluation order.
    best, best_loss = min(
        ((point, value) for point, value in memo.values.items() if problem.feasible(point)), key=lambda item: item[1]
    )
    return OptimizerResult(
        best=best, best_loss=best_loss, evaluations=memo.evaluated, method=method, crash=crash, pruned=len(memo.bounds)
    )


class Memo:
    """The loss behind a cache, as an optimizer's ``run`` sees it: each distinct point costs
    one call, up to the budget (``memo(point)`` answers ``None`` once it is spent).

    ``values`` holds exact losses, ``bounds`` the points racing stopped early; both count
    against the budget, so racing never changes which points an optimizer evaluates.

    ``floor``: the least loss a feasible point can have (``feasible`` says which are). Once a
    feasible point has it, the memo is spent: the first of least loss wins, so no later
    point can be the answer, and the optimizer stops with the answer it would have ended with.
    """

    def __init__(
        self,
        loss: Loss,
        budget: int,
        race: RacingLoss | None = None,
        race_all: RacingLosses | None = None,
        floor: float | None = None,
        feasible: Callable[[Point], bool] = lambda point: True,
    ) -> None:
        self.loss = loss
        self.race = race
        self.race_all = race_all
        self.budget = budget
        self.floor = floor
        self.feasible = feasible
        self.values: dict[Point, float] = {}  # insertion-ordered: the order of the calls
        self.bounds: dict[Point, Bound] = {}
        self.at_floor = False  # a feasible point reached ``floor``

    @property
    def evaluated(self) -> int:
        return len(self.values) + len(self.bounds)

    @property
    def spent(self) -> bool:
        return self.at_floor or self.evaluated >= self.budget

    def seen(self, point: Point) -> bool:
        return point in self.values or point in self.bounds

    def __call__(self, point: Point, cutoff: Cutoff | None = None) -> float | Bound | None:
        """The loss at ``point`` (a :class:`Bound` if racing stopped it below ``cutoff``);
        ``None`` when it is new and the budget is spent. A point is never scored twice: a
        bound is kept, since every later cutoff of the same optimizer is at least as strict."""
        if point in self.values:
            return self.values[point]
        if point in self.bounds:
            return self.bounds[point]
        if self.spent:
            return None
        value = self.loss(point) if cutoff is None or self.race is None else self.race(point, cutoff)
        if isinstance(value, Bound) and (cutoff is None or cutoff.reachable(value.loss)):
            raise ValueError(f"loss{point}: stopped early at {value.loss!r}, which does not rule it out of {cutoff}")
        return self.record(point, value)

    def record(self, point: Point, value: float | Bound) -> float | Bound:
        """Keep ``point``'s loss (or racing bound)."""
        if isinstance(value, Bound):
            self.bounds[point] = value
            return value
        if not is_number(value) or not math.isfinite(value):
            raise ValueError(f"loss{point}: expected a finite number, got {value!r}")
        self.values[point] = float(value)
        if self.floor is not None and value <= self.floor and self.feasible(point):
            self.at_floor = True
        return float(value)


def random_point(problem: SubProblem, rng: random.Random) -> Point:
    """A feasible point drawn from ``rng``: in each block, its quota of ones at random places."""
    point: list[int] = []
    for size, k in problem.parts:
        ones = set(rng.sample(range(size), k))
        point.extend(int(i in ones) for i in range(size))
    return tuple(point)


def start_point(memo: Memo, problem: SubProblem) -> tuple[Point, random.Random]:
    """The start point (``x0``, else drawn from the seed), evaluated, and the generator that drew it."""
    rng = random.Random(problem.seed)
    x0 = problem.x0 if problem.x0 is not None else random_point(problem, rng)
    memo(x0)  # the start point is always evaluated: a point with k ones exists
    return x0, rng
