"""``nomad``: MADS (NOMAD 4 through PyNomad, in a child process: :mod:`..nomad_process`) on
binary variables, for at most ``NOMAD_MAX_VARIABLES`` variables in one block (why not several:
the package's docstring)."""

from __future__ import annotations

from bosch_eval.search.stages.nomad_process import run_nomad_isolated
from bosch_eval.search.stages.optimizers import (
    NOMAD_MAX_VARIABLES,
    OPTIMIZERS,
    Memo,
    Optimizer,
    SubProblem,
    start_point,
)

# PyNomad parameters besides X0, bounds, MAX_BB_EVAL and SEED. NOMAD's defaults otherwise
# (MADS with its quadratic-model search, as in the paper), quiet and single-threaded.
# No *_FILE parameter is set, so NOMAD writes nothing to disk.
_NOMAD_PARAMS = (
    "BB_OUTPUT_TYPE OBJ",
    "BB_INPUT_TYPE * B",
    "DISPLAY_DEGREE 0",
    "NB_THREADS_PARALLEL_EVAL 1",
)
# MAX_EVAL counts NOMAD's cache hits too. Once its mesh is at its finest, MADS keeps
# proposing points it has already seen, more than 10 per new point near the end of a
# run: 100 lets it spend the budget while bounding that circling (on the 2**n points
# there are, when the budget exceeds them). Setting MAX_EVAL also
# stops NOMAD from printing the bound it would otherwise pick itself.
_NOMAD_EVALS_PER_BB_EVAL = 100
# From this dimension on NOMAD turns its quadratic-model search off itself, and says so on
# stdout; asking for it off keeps the run quiet and changes nothing else.
_NOMAD_MODELS_MAX_DIMENSION = 50
# NOMAD's SEED must lie in [0, INT_MAX], and NOMAD seeds its generator by drawing SEED
# numbers from it (measured: ~0.25 µs each, so a seed near 2**31 stalls every run for
# minutes before the first evaluation). 10**5 distinct seeds cost at most ~25 ms.
_NOMAD_SEED_MODULUS = 100_000


def _run_nomad(memo: Memo, problem: SubProblem) -> str:
    """MADS from the start point with NOMAD's cache in front of ``memo``; returns why it stopped early, if it did."""
    x0, _ = start_point(memo, problem)
    n = problem.n
    params = [
        *_NOMAD_PARAMS,
        f"MAX_BB_EVAL {problem.budget}",
        f"MAX_EVAL {_NOMAD_EVALS_PER_BB_EVAL * min(problem.budget, 2**n)}",
        f"SEED {problem.seed % _NOMAD_SEED_MODULUS}",
    ]
    if n >= _NOMAD_MODELS_MAX_DIMENSION:
        params.append("QUAD_MODEL_SEARCH no")
    return run_nomad_isolated(memo, x0, params)


def _nomad_unfit(problem: SubProblem) -> str | None:
    if len(problem.parts) > 1:
        return (
            f"nomad cannot keep a quota in each of {len(problem.parts)} blocks (layers) of one sub-problem: binary MADS "
            "almost never proposes a point that meets them all, and PyNomad's integer variables crash; search one layer "
            "per sub-problem (--chunk-layers 1), use --quota chunk, or 'oneplusone'/'auto'"
        )
    if problem.n > NOMAD_MAX_VARIABLES:
        return (
            f"nomad handles at most {NOMAD_MAX_VARIABLES} variables (B.2), this sub-problem has "
            f"{problem.n}: use 'oneplusone' or split the sub-problem"
        )
    return None


OPTIMIZERS.register("nomad", Optimizer(_run_nomad, _nomad_unfit, raced=False))
