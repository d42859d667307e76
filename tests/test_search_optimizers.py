"""Black-box binary optimizers: brute-force oracles, a planted optimum, determinism, budgets."""

from __future__ import annotations

import itertools
import math
import os
import random
import signal
from collections.abc import Callable

import pytest

from bosch_eval.search.stages import optimizers
from bosch_eval.search.stages.optimizers import oneplusone
from bosch_eval.search.stages.optimizers import (
    NOMAD_MAX_VARIABLES,
    OPTIMIZERS,
    Optimizer,
    OptimizerResult,
    SubProblem,
    choose_method,
    minimize,
    optimizer_methods,
)

ALPHA = 100.0  # the paper's α (B.2)
SEARCHERS = ("nomad", "oneplusone")

Point = tuple[int, ...]


def penalized(objective: Callable[[Point], float], n: int, k: int) -> Callable[[Point], float]:
    """Eq. 5's shape: the objective plus α(ρ̄_I(z) − ρ̄)², here over the share of ones."""
    return lambda x: objective(x) + ALPHA * (sum(x) / n - k / n) ** 2


def quadratic_objective(n: int, seed: int) -> Callable[[Point], float]:
    """A random pseudo-boolean quadratic: unary weights plus about a third of all pairs."""
    rng = random.Random(seed)
    unary = [rng.gauss(0.0, 1.0) for _ in range(n)]
    pairs = {(i, j): rng.gauss(0.0, 1.0) for i, j in itertools.combinations(range(n), 2) if rng.random() < 0.3}
    return lambda x: sum(w for w, b in zip(unary, x) if b) + sum(v for (i, j), v in pairs.items() if x[i] and x[j])


def points_with_ones(n: int, k: int) -> list[Point]:
    return [tuple(int(i in ones) for i in range(n)) for ones in itertools.combinations(range(n), k)]


class Recorder:
    """A loss that records every call, as the pipeline's journal would."""

    def __init__(self, loss: Callable[[Point], float]) -> None:
        self.loss = loss
        self.calls: list[Point] = []

    def __call__(self, x: Point) -> float:
        self.calls.append(x)
        return self.loss(x)


class TestSubProblem:
    def test_size_is_the_number_of_candidates(self) -> None:
        assert SubProblem(n=16, k=4, budget=10, seed=0).size == 1820

    @pytest.mark.parametrize(
        ("fields", "message"),
        [
            ({"n": 0, "k": 0}, "SubProblem.n"),
            ({"n": 4.0}, "SubProblem.n"),
            ({"k": 5}, "SubProblem.k"),
            ({"k": -1}, "SubProblem.k"),
            ({"budget": 0}, "SubProblem.budget"),
            ({"budget": True}, "SubProblem.budget"),
            ({"seed": "1"}, "SubProblem.seed"),
            ({"x0": (1, 1, 0)}, "SubProblem.x0"),  # wrong length
            ({"x0": [1, 1, 0, 0]}, "SubProblem.x0"),  # not a tuple
            ({"x0": (1, 2, 0, 0)}, "SubProblem.x0"),
            ({"x0": (1, 1, 1, 0)}, "exactly k=2 ones"),
        ],
    )
    def test_bad_fields_are_rejected(self, fields: dict, message: str) -> None:
        with pytest.raises(ValueError, match=message):
            SubProblem(**{"n": 4, "k": 2, "budget": 5, "seed": 0, **fields})


class TestChooseMethod:
    def test_auto_is_exhaustive_exactly_when_the_candidates_fit(self) -> None:
        assert choose_method(SubProblem(n=8, k=4, budget=70, seed=0)) == "exhaustive"  # C(8, 4) = 70
        assert choose_method(SubProblem(n=8, k=4, budget=69, seed=0)) == "nomad"

    def test_auto_is_nomad_up_to_the_limit_then_oneplusone(self) -> None:
        assert NOMAD_MAX_VARIABLES == 50
        assert choose_method(SubProblem(n=50, k=10, budget=100, seed=0)) == "nomad"
        assert choose_method(SubProblem(n=51, k=10, budget=100, seed=0)) == "oneplusone"
        assert choose_method(SubProblem(n=64, k=32, budget=100, seed=0)) == "oneplusone"

    @pytest.mark.parametrize("method", optimizer_methods())
    @pytest.mark.parametrize("k", [0, 64])
    def test_a_single_candidate_is_exhaustive_whatever_was_asked(self, method: str, k: int) -> None:
        assert choose_method(SubProblem(n=64, k=k, budget=1, seed=0), method) == "exhaustive"

    def test_explicit_methods_run_when_they_can(self) -> None:
        problem = SubProblem(n=8, k=4, budget=70, seed=0)
        assert [choose_method(problem, m) for m in SEARCHERS + ("exhaustive",)] == ["nomad", "oneplusone", "exhaustive"]

    @pytest.mark.parametrize(
        ("problem", "method", "message"),
        [
            (SubProblem(n=8, k=4, budget=69, seed=0), "exhaustive", r"C\(8, 4\) = 70 .* budget of 69"),
            (SubProblem(n=51, k=4, budget=69, seed=0), "nomad", "at most 50 variables.*'oneplusone'"),
            (
                SubProblem(n=8, k=4, budget=69, seed=0),
                "cma",
                r"^optimizer method: expected one of \['auto', 'exhaustive', 'nomad', 'oneplusone'\], got 'cma'$",
            ),
        ],
    )
    def test_explicit_methods_that_cannot_run_say_why(self, problem: SubProblem, method: str, message: str) -> None:
        with pytest.raises(ValueError, match=message):
            choose_method(problem, method)
        with pytest.raises(ValueError, match=message):
            minimize(lambda x: 0.0, problem, method)

    def test_a_registered_optimizer_runs_by_name_and_auto_keeps_to_b2(self, monkeypatch: pytest.MonkeyPatch) -> None:
        def start_only(memo, problem: SubProblem) -> str:
            optimizers.start_point(memo, problem)
            return ""

        monkeypatch.setitem(OPTIMIZERS.members, "start-only", Optimizer(start_only))
        problem = SubProblem(n=8, k=4, budget=70, seed=0)
        loss = Recorder(lambda x: 1.0)
        result = minimize(loss, problem, "start-only")
        assert (result.method, result.evaluations, len(loss.calls)) == ("start-only", 1, 1)
        assert optimizer_methods()[-1] == "start-only"
        # auto takes the first fit optimizer in registration order: oneplusone takes anything.
        assert [choose_method(SubProblem(n=n, k=4, budget=69, seed=0)) for n in (8, 64)] == ["nomad", "oneplusone"]


class TestExhaustive:
    @pytest.mark.parametrize(("n", "k", "seed"), [(6, 3, 0), (8, 2, 1), (9, 4, 2), (10, 5, 3), (10, 1, 4)])
    def test_equals_brute_force(self, n: int, k: int, seed: int) -> None:
        loss = Recorder(penalized(quadratic_objective(n, seed), n, k))
        result = minimize(loss, SubProblem(n=n, k=k, budget=math.comb(n, k), seed=seed))
        candidates = points_with_ones(n, k)
        brute = min(candidates, key=loss.loss)
        assert result == OptimizerResult(
            best=brute, best_loss=loss.loss(brute), evaluations=math.comb(n, k), method="exhaustive"
        )
        assert loss.calls == candidates  # each candidate once, in lexicographic order

    def test_ties_keep_the_first_candidate(self) -> None:
        result = minimize(lambda x: 1.0, SubProblem(n=5, k=2, budget=10, seed=0))
        assert result.best == (1, 1, 0, 0, 0)

    @pytest.mark.parametrize("method", optimizer_methods())
    @pytest.mark.parametrize("k", [0, 7])
    def test_k_zero_or_n_is_one_evaluation(self, method: str, k: int) -> None:
        loss = Recorder(lambda x: 0.5)
        result = minimize(loss, SubProblem(n=7, k=k, budget=50, seed=0), method)
        assert loss.calls == [(int(k == 7),) * 7]
        assert (result.evaluations, result.method, result.best_loss) == (1, "exhaustive", 0.5)


def planted_objective(n: int, k: int, seed: int) -> tuple[Callable[[Point], float], list[float]]:
    """A conversion cost per variable plus pairwise *redundancy*: the paper's entanglement.

    The k individually cheapest variables come in k/2 pairs that back each other up
    (converting one is cheap, converting both costs 1.0 extra), like two retrieval heads
    either of which can serve a query. Next come k/2 cheap independent variables, then
    expensive ones. The optimum converts the cheaper member of every pair plus the
    independent ones; a static ranking of the variables one at a time converts all the
    pairs. Variables are shuffled so that no optimizer profits from their order.

    Returns:
        The objective and each variable's cost when converted alone.
    """
    rng = random.Random(seed)
    half = k // 2
    cost = [c for p in range(half) for c in (0.10 + 0.01 * p, 0.12 + 0.01 * p)]
    cost += [0.30 + 0.02 * i for i in range(half)]
    cost += [rng.uniform(0.8, 1.0) for _ in range(n - len(cost))]
    where = list(range(n))
    rng.shuffle(where)  # variable i of the problem is where[i] here
    shuffled = [0.0] * n
    for i, j in enumerate(where):
        shuffled[i] = cost[j]
    position = {j: i for i, j in enumerate(where)}
    pairs = [(position[2 * p], position[2 * p + 1]) for p in range(half)]

    def objective(x: Point) -> float:
        return sum(c for c, b in zip(shuffled, x) if b) + sum(1.0 for i, j in pairs if x[i] and x[j])

    return objective, shuffled


class TestPlantedOptimum:
    N, K = 16, 4

    @pytest.fixture(scope="class")
    @classmethod
    def planted(cls) -> tuple[Callable[[Point], float], float, float]:
        """The loss, its optimum over all C(16, 4) candidates, and the static ranking's loss."""
        objective, alone = planted_objective(cls.N, cls.K, seed=1)
        loss = penalized(objective, cls.N, cls.K)
        values = sorted(loss(x) for x in points_with_ones(cls.N, cls.K))
        assert values[1] - values[0] > 0.01  # the optimum is unique
        static = sorted(range(cls.N), key=alone.__getitem__)[: cls.K]
        static_loss = loss(tuple(int(i in static) for i in range(cls.N)))
        assert static_loss > values[0] + 1.0  # the per-variable ranking picks a bad set
        return loss, values[0], static_loss

    def test_oneplusone_reaches_the_optimum(self, planted: tuple[Callable[[Point], float], float, float]) -> None:
        # Measured: 100 of seeds 0..99 reach it within 500 evaluations (85 within 300).
        loss, optimum, _ = planted
        for seed in range(10):
            result = minimize(loss, SubProblem(n=self.N, k=self.K, budget=500, seed=seed), "oneplusone")
            assert result.best_loss == pytest.approx(optimum, abs=1e-12), f"seed {seed}"

    def test_nomad_closes_most_of_the_gap(self, planted: tuple[Callable[[Point], float], float, float]) -> None:
        # 100 evaluations keep this test fast (NOMAD's quadratic models cost ~0.1 s per
        # evaluation here). Measured on seeds 0..3: 2 reach the optimum, all get within
        # 2.5% of the way from the static ranking's loss to it. Asserted: within 5%.
        loss, optimum, static_loss = planted
        for seed in range(2):
            result = minimize(loss, SubProblem(n=self.N, k=self.K, budget=100, seed=seed), "nomad")
            assert (result.best_loss - optimum) / (static_loss - optimum) <= 0.05, f"seed {seed}"


@pytest.mark.parametrize("method", SEARCHERS)
class TestSearchContract:
    """What the pipeline relies on, for both searchers: budget, memo, determinism, k ones."""

    N, K = 12, 5

    def run(self, method: str, seed: int = 3, budget: int = 40, **fields) -> tuple[Recorder, OptimizerResult]:
        loss = Recorder(penalized(quadratic_objective(self.N, 7), self.N, self.K))
        result = minimize(loss, SubProblem(n=self.N, k=self.K, budget=budget, seed=seed, **fields), method)
        return loss, result

    def test_spends_the_budget_on_distinct_points(self, method: str) -> None:
        loss, result = self.run(method)
        assert len(loss.calls) == len(set(loss.calls)) == result.evaluations == 40
        assert all(len(x) == self.N and set(x) <= {0, 1} for x in loss.calls)

    def test_returns_the_best_evaluated_point_with_k_ones(self, method: str) -> None:
        loss, result = self.run(method)
        with_k = [x for x in loss.calls if sum(x) == self.K]
        assert result.best == min(with_k, key=loss.loss)
        assert result.best_loss == loss.loss(result.best)
        assert result.method == method

    def test_same_seed_replays_the_same_calls(self, method: str) -> None:
        first, result = self.run(method)
        journal = {x: first.loss(x) for x in first.calls}
        replay = Recorder(journal.__getitem__)  # the values a resumed search reads back
        again = minimize(replay, SubProblem(n=self.N, k=self.K, budget=40, seed=3), method)
        assert replay.calls == first.calls
        assert again == result

    def test_another_seed_searches_elsewhere(self, method: str) -> None:
        assert self.run(method, seed=3)[0].calls != self.run(method, seed=4)[0].calls

    def test_starts_from_x0(self, method: str) -> None:
        x0 = (0, 1) * 5 + (0, 0)  # K = 5 ones
        loss, _ = self.run(method, x0=x0)
        assert loss.calls[0] == x0

    def test_a_budget_of_one_evaluates_only_the_start(self, method: str) -> None:
        loss, result = self.run(method, budget=1)
        assert len(loss.calls) == 1 and result.best == loss.calls[0] and sum(result.best) == self.K

    def test_loss_errors_propagate_and_stop_the_search(self, method: str) -> None:
        calls = []

        def failing(x: Point) -> float:
            calls.append(x)
            if len(calls) == 3:
                raise RuntimeError("GPU fell off")
            return float(len(calls))

        with pytest.raises(RuntimeError, match="GPU fell off"):
            minimize(failing, SubProblem(n=self.N, k=self.K, budget=40, seed=0), method)
        assert len(calls) == 3

    def test_non_finite_losses_are_rejected(self, method: str) -> None:
        with pytest.raises(ValueError, match="finite"):
            minimize(lambda x: math.nan, SubProblem(n=self.N, k=self.K, budget=40, seed=0), method)


@pytest.mark.parametrize("method", ("exhaustive", *SEARCHERS))
class TestFloor:
    """A known least loss (the metric's best score): the optimizer stops at the first feasible
    point that has it, which is the point the whole budget returns (the first of equal losses)."""

    N, K = 8, 3

    def loss(self) -> Recorder:
        # Half the points share the least value of the feasible ones: a saturated objective.
        objective = quadratic_objective(self.N, 5)
        return Recorder(penalized(lambda x: max(objective(x), 0.0), self.N, self.K))

    def test_stops_at_the_first_point_at_the_floor_with_the_same_answer(self, method: str) -> None:
        problem = SubProblem(n=self.N, k=self.K, budget=56, seed=1)
        whole, stopped = self.loss(), self.loss()
        answer = minimize(whole, problem, method)
        early = minimize(stopped, problem, method, floor=0.0)
        assert answer.best_loss == 0.0  # the floor is reached
        first = next(i for i, x in enumerate(whole.calls) if sum(x) == self.K and whole.loss(x) == 0.0)
        assert first + 1 < len(whole.calls)  # the whole budget asks more
        assert stopped.calls == whole.calls[: first + 1]
        assert (early.best, early.best_loss) == (answer.best, answer.best_loss) and early.evaluations == first + 1

    def test_a_floor_no_point_reaches_changes_nothing(self, method: str) -> None:
        problem = SubProblem(n=self.N, k=self.K, budget=56, seed=1)
        whole, floored = self.loss(), self.loss()
        assert minimize(floored, problem, method, floor=-1.0) == minimize(whole, problem, method)
        assert floored.calls == whole.calls


def test_only_a_feasible_point_at_the_floor_stops_the_search() -> None:
    memo = optimizers.Memo(lambda x: 0.0, budget=10, floor=0.0, feasible=lambda x: sum(x) == 2)
    memo((1, 0, 0))  # off quota (NOMAD visits such points): it may score below every feasible point
    assert not memo.spent
    memo((1, 1, 0))
    assert memo.spent and memo((0, 1, 1)) is None


class TestNomad:
    def test_visits_other_counts_but_returns_k_ones(self) -> None:
        # Every one gains 1.0 and one extra costs a penalty of 100 / 12² ≈ 0.69, so k + 1
        # ones score best: MADS's single-bit polls find that off the slice of k ones.
        n, k = 12, 4
        loss = Recorder(lambda x: -1.0 * sum(x) + ALPHA * (sum(x) / n - k / n) ** 2)
        result = minimize(loss, SubProblem(n=n, k=k, budget=30, seed=0), "nomad")
        assert any(sum(x) != k for x in loss.calls)
        assert sum(result.best) == k
        assert min(loss.calls, key=loss.loss) != result.best  # k + 1 ones score better

    def test_runs_on_50_variables(self) -> None:
        loss = Recorder(penalized(quadratic_objective(50, 0), 50, 20))
        result = minimize(loss, SubProblem(n=50, k=20, budget=30, seed=0))
        assert (result.method, result.evaluations, sum(result.best)) == ("nomad", 30, 20)
        assert result.best_loss < loss.loss(loss.calls[0])  # it improved on its start

    def test_is_quiet_and_writes_no_files(
        self, tmp_path: os.PathLike, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
    ) -> None:
        monkeypatch.chdir(tmp_path)
        minimize(lambda x: float(sum(x[:3])), SubProblem(n=10, k=3, budget=20, seed=2**32 - 1), "nomad")
        assert os.listdir(tmp_path) == []
        assert capfd.readouterr() == ("", "")

    def test_a_large_seed_starts_at_once(self) -> None:
        # NOMAD's seeding costs time linear in SEED: near 2**31 that was minutes per run.
        def too_slow(signum: int, frame: object) -> None:
            raise TimeoutError("nomad spent 60 s before finishing 3 evaluations")

        previous = signal.signal(signal.SIGALRM, too_slow)
        signal.alarm(60)
        try:
            result = minimize(lambda x: float(sum(x[:2])), SubProblem(n=4, k=2, budget=3, seed=2**31 - 1), "nomad")
        finally:
            signal.alarm(0)
            signal.signal(signal.SIGALRM, previous)
        assert result.evaluations == 3


class TestNomadCrash:
    """PyNomad runs in a child process: its death ends that sub-problem, never the search."""

    def test_a_killed_child_keeps_what_was_evaluated(self) -> None:
        import psutil

        def segfault_on_the_fifth_point(x: Point) -> float:
            if len(loss.calls) == 5:
                for child in psutil.Process().children():
                    child.send_signal(signal.SIGSEGV)
            return penalized(quadratic_objective(12, 0), 12, 4)(x)

        loss = Recorder(segfault_on_the_fifth_point)
        result = minimize(loss, SubProblem(n=12, k=4, budget=50, seed=0), "nomad")
        assert "status -11" in result.crash
        assert result.evaluations == len(loss.calls) == 5  # the fifth point, during which it died, counts
        feasible = [x for x in loss.calls if sum(x) == 4]
        assert result.best == min(feasible, key=loss.loss)

    def test_pynomad_4_6_crash_near_an_exhausted_cube_is_survived(self) -> None:
        # The reproduction of results/toy_search/optimizers.md: 4 binary variables, MADS
        # evaluates nearly all 16 points, then PyNomad 4.6.0 throws and segfaults (this seed
        # did; before the child process it took pytest down with it).
        rng = random.Random(1)
        table: dict[Point, float] = {}

        def loss(x: Point) -> float:
            if x not in table:
                table[x] = rng.choice([0.0, 0.1, 0.3, 0.5, 0.8, 1.0]) + 2.0 * (sum(x) / 4 - 0.75) ** 2
            return table[x]

        result = minimize(loss, SubProblem(n=4, k=3, budget=100, seed=1, x0=(1, 1, 1, 0)), "nomad")
        assert result.best_loss == min(value for x, value in table.items() if sum(x) == 3)
        assert result.crash == "" or "ArrayOfDouble" in result.crash


class TestOnePlusOne:
    def test_64_variables_route_to_oneplusone(self) -> None:
        loss = Recorder(penalized(quadratic_objective(64, 0), 64, 16))
        result = minimize(loss, SubProblem(n=64, k=16, budget=200, seed=0))
        assert (result.method, result.evaluations, len(set(loss.calls))) == ("oneplusone", 200, 200)
        assert all(sum(x) == 16 for x in loss.calls)  # swaps keep the count
        assert result.best_loss < loss.loss(loss.calls[0])

    def test_stops_when_every_candidate_was_evaluated(self) -> None:
        loss = Recorder(lambda x: 1.0)
        result = minimize(loss, SubProblem(n=6, k=3, budget=100, seed=0), "oneplusone")
        assert sorted(loss.calls) == sorted(points_with_ones(6, 3))
        assert result.evaluations == 20

    def test_stops_when_the_rest_is_out_of_reach(self, monkeypatch: pytest.MonkeyPatch) -> None:
        # With 2 ones among 40, every candidate is within 2 swaps; the last few need the
        # rare double swap, so a small cap on repeated offspring ends the run early.
        monkeypatch.setattr(oneplusone, "_MAX_REPEATED_OFFSPRING", 5)
        loss = Recorder(lambda x: 1.0)
        result = minimize(loss, SubProblem(n=40, k=2, budget=780, seed=0), "oneplusone")
        assert result.evaluations < math.comb(40, 2)


def feasible_points(blocks: tuple[tuple[int, int], ...]) -> list[Point]:
    """Brute force: every point with exactly each block's quota of ones."""
    parts = [points_with_ones(size, ones) for size, ones in blocks]
    return [tuple(itertools.chain.from_iterable(choice)) for choice in itertools.product(*parts)]


def quota_counts(point: Point, blocks: tuple[tuple[int, int], ...]) -> list[int]:
    counts, start = [], 0
    for size, _ in blocks:
        counts.append(sum(point[start : start + size]))
        start += size
    return counts


class TestBlocks:
    """Per-layer quotas: a sub-problem over several layers keeps ⌈r·G⌉ ones in each (Algorithm 3)."""

    BLOCKS = ((4, 2), (4, 1), (4, 3))

    def test_size_is_the_product_of_the_blocks_combinations(self) -> None:
        assert SubProblem(n=12, k=6, budget=1, seed=0, blocks=self.BLOCKS).size == 6 * 4 * 4

    @pytest.mark.parametrize(
        ("blocks", "message"),
        [(((4, 2), (4, 1)), "sum to n=12"), (((4, 5), (8, 1)), "0 <= ones <= size"), ([(12, 6)], "tuple of")],
    )
    def test_bad_blocks_are_rejected(self, blocks, message: str) -> None:
        with pytest.raises(ValueError, match=message):
            SubProblem(n=12, k=6, budget=1, seed=0, blocks=blocks)

    def test_x0_off_quota_is_rejected(self) -> None:
        with pytest.raises(ValueError, match="quota of ones in every block"):
            SubProblem(n=12, k=6, budget=5, seed=0, blocks=self.BLOCKS, x0=(1, 1, 1, 0) + (0, 0, 0, 0) + (1, 1, 1, 0))

    @pytest.mark.parametrize("seed", [0, 1])
    def test_exhaustive_equals_brute_force_over_the_product(self, seed: int) -> None:
        objective = quadratic_objective(12, seed)
        recorder = Recorder(objective)
        result = minimize(recorder, SubProblem(n=12, k=6, budget=96, seed=0, blocks=self.BLOCKS), "exhaustive")
        candidates = feasible_points(self.BLOCKS)
        assert sorted(recorder.calls) == sorted(candidates)  # each feasible point once, nothing else
        assert result.best_loss == min(objective(x) for x in candidates)

    def test_oneplusone_evaluates_only_points_that_keep_every_quota(self) -> None:
        recorder = Recorder(quadratic_objective(12, 3))
        result = minimize(recorder, SubProblem(n=12, k=6, budget=60, seed=0, blocks=self.BLOCKS), "oneplusone")
        assert len(recorder.calls) == 60
        assert all(quota_counts(x, self.BLOCKS) == [2, 1, 3] for x in recorder.calls)
        assert quota_counts(result.best, self.BLOCKS) == [2, 1, 3]

    def test_oneplusone_closes_the_gap_of_a_block_problem(self) -> None:
        """4 layers × 8 groups, 2 SWA each: 28⁴ = 614656 candidates, 400 evaluations."""
        blocks = ((8, 2),) * 4
        rng = random.Random(7)
        # The optimum, by brute force per block only when blocks do not interact: use a
        # separable objective (unary + pairs inside a block) so that it is computable.
        pairs = [{(i, j): rng.gauss(0.0, 1.0) for i, j in itertools.combinations(range(8), 2)} for _ in range(4)]
        unary = [[rng.gauss(0.0, 1.0) for _ in range(8)] for _ in range(4)]

        def block_loss(b: int, ones: tuple[int, ...]) -> float:
            return sum(unary[b][i] for i in ones) + sum(pairs[b][p] for p in itertools.combinations(ones, 2))

        def separable(x: Point) -> float:
            return sum(block_loss(b, tuple(i for i in range(8) if x[8 * b + i])) for b in range(4))

        per_block = [[block_loss(b, ones) for ones in itertools.combinations(range(8), 2)] for b in range(4)]
        optimum, worst = sum(map(min, per_block)), sum(map(max, per_block))
        for seed in range(3):
            result = minimize(separable, SubProblem(n=32, k=8, budget=400, seed=seed, blocks=blocks), "oneplusone")
            assert result.best_loss - optimum <= 0.02 * (worst - optimum)

    def test_auto_gives_block_problems_to_the_ea_and_nomad_refuses_them(self) -> None:
        problem = SubProblem(n=32, k=8, budget=400, seed=0, blocks=((8, 2),) * 4)
        assert choose_method(problem, "auto") == "oneplusone"
        with pytest.raises(ValueError, match="quota in each of 4 blocks"):
            choose_method(problem, "nomad")
        one_block = SubProblem(n=32, k=8, budget=400, seed=0, blocks=((32, 8),))
        assert choose_method(one_block, "auto") == "nomad"

    def test_one_block_is_the_unblocked_problem(self) -> None:
        recorder, plain = Recorder(quadratic_objective(8, 2)), Recorder(quadratic_objective(8, 2))
        minimize(recorder, SubProblem(n=8, k=3, budget=30, seed=4, blocks=((8, 3),)), "oneplusone")
        minimize(plain, SubProblem(n=8, k=3, budget=30, seed=4), "oneplusone")
        assert recorder.calls == plain.calls
