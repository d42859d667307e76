"""The search's optimizers on synthetic objectives with known optima (no model, seconds to minutes).

    OMP_NUM_THREADS=1 python benchmarks/search_optimizers.py

1. The planted 8-layer × 8-group objective of ``tests/test_search_pipeline.py`` (layers do
   not interact, so the best mask for Stage 2's per-layer counts is known): the gap in Ŝ
   the full BOSCH pipeline leaves with the (1+1)-EA (4-layer Stage-3 chunks, per-layer
   quotas) and with NOMAD (one layer per sub-problem), per κ and seed.
2. Why NOMAD gets no multi-layer quotas: binary MADS on 4 layers × 8 groups with 2 SWA
   groups per layer, the per-layer penalty of Eq. 5 in its loss, 100 evaluations: how many
   of the points it evaluated meet every quota.
"""

from __future__ import annotations

import itertools
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bosch_eval.masks.head_mask import ModelShape  # noqa: E402
from bosch_eval.search.run.pipeline import SearchSettings, run_search  # noqa: E402
from tests.test_search_pipeline import Layered  # noqa: E402


def planted_gaps() -> None:
    shape = ModelShape(num_layers=8, num_heads=16, num_kv_heads=8)
    print("| optimizer | κ | Ŝ gap, seeds 0/1/2 | distinct masks evaluated |\n|---|---|---|---|")
    for optimizer, chunk, budget in [
        ("oneplusone", None, 10),
        ("oneplusone", None, 40),
        ("nomad", 1, 20),
        ("nomad", 1, 60),
    ]:
        gaps, evaluations = [], []
        for seed in range(3):
            objective = Layered(seed)
            settings = SearchSettings(
                ratio=0.5, optimizer=optimizer, chunk_layers=chunk, budget_per_layer=budget, seed=seed
            )
            result = run_search(objective, shape, settings, progress=False)
            best = objective.best_for_counts([row.count(0) for row in result.mask.bits])
            gaps.append(f"{result.anchors.normalize(best) - result.anchors.normalize(result.score):.4f}")
            evaluations.append(str(result.evaluations))
        print(f"| {optimizer} | {budget} | {' / '.join(gaps)} | {' / '.join(evaluations)} |", flush=True)


def nomad_feasible_share(budget: int = 100) -> None:
    import PyNomad

    layers, groups, quota = 4, 8, 2
    rng = random.Random(0)
    unary = [rng.gauss(0, 1) for _ in range(layers * groups)]
    pairs = {p: rng.gauss(0, 0.5) for p in itertools.combinations(range(layers * groups), 2) if rng.random() < 0.2}
    seen: dict[tuple[int, ...], float] = {}

    def blackbox(point) -> int:  # noqa: ANN001
        x = tuple(int(round(point.get_coord(i))) for i in range(layers * groups))
        if x not in seen:
            if len(seen) >= budget:
                return 0
            value = sum(u for u, b in zip(unary, x) if b) + sum(v for (i, j), v in pairs.items() if x[i] and x[j])
            shares = [sum(x[layer * groups : (layer + 1) * groups]) / groups for layer in range(layers)]
            seen[x] = value / 10 + 100 * sum((s - quota / groups) ** 2 for s in shares) / layers
        point.setBBO(repr(seen[x]).encode())
        return 1

    x0: list[float] = []
    start = random.Random(0)  # the start point: 2 random SWA groups per layer
    for _ in range(layers):
        ones = set(start.sample(range(groups), quota))
        x0 += [float(g in ones) for g in range(groups)]
    params = [
        "BB_OUTPUT_TYPE OBJ",
        "BB_INPUT_TYPE * B",
        "DISPLAY_DEGREE 0",
        f"MAX_BB_EVAL {budget}",
        f"MAX_EVAL {budget * 100}",
        "SEED 0",
    ]
    PyNomad.optimize(blackbox, x0, [0.0] * len(x0), [1.0] * len(x0), params)
    feasible = sum(all(sum(x[layer * groups : (layer + 1) * groups]) == quota for layer in range(layers)) for x in seen)
    print(
        f"binary NOMAD, {layers} layers × {groups} groups, {quota} SWA each: {feasible} of {len(seen)} evaluated points meet every quota"
    )


if __name__ == "__main__":
    planted_gaps()
    nomad_feasible_share()
