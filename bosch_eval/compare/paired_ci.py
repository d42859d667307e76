"""Paired bootstrap confidence interval of a score difference over the same documents.

Method: paired percentile bootstrap with a fixed seed. Documents are matched by
``(stratum, doc_id)`` between an entry and the reference; each replicate resamples the
documents of every stratum (with replacement, within the stratum) and recomputes the
score difference as the task computes its score: the unweighted mean over strata of the
per-stratum mean differences (a stratum is a context length for RULER-style tasks, whose
score is the mean over lengths; a single stratum otherwise). A mean over tasks (the
leaderboard's headline) is the same with strata ``(task, length)`` weighted
``1 / (tasks × the task's lengths)``. The p-value is the bootstrap's two-sided one: twice the
smaller share of replicates on either side of zero (the smallest it can report is 2 / iters).
"""

from __future__ import annotations

from collections.abc import Hashable, Mapping
from typing import NamedTuple

import numpy as np

DEFAULT_ITERS = 10_000
DEFAULT_SEED = 0


class PairedDifference(NamedTuple):
    """``entry − reference`` over ``n`` paired documents: the difference, its interval, and the
    two-sided bootstrap p-value of "no difference"."""

    difference: float
    low: float
    high: float
    n: int
    p_value: float


def paired_bootstrap_ci(
    entry: Mapping[tuple[Hashable, int], float],
    reference: Mapping[tuple[Hashable, int], float],
    *,
    iters: int = DEFAULT_ITERS,
    seed: int = DEFAULT_SEED,
    level: float = 0.95,
    weights: Mapping[Hashable, float] | None = None,
) -> PairedDifference:
    """Difference ``entry − reference``, its ``level`` interval and p-value.

    Args:
        entry: per-document values keyed by ``(stratum, doc_id)``.
        reference: the same for the reference entry.
        weights: the weight of each stratum's mean difference (default: equal, summing to 1).

    Returns:
        The difference with ``n`` the number of paired documents.

    Raises:
        ValueError: the two do not hold the same documents (a pairing would be wrong).
    """
    if set(entry) != set(reference):
        only = sorted(set(entry) ^ set(reference), key=str)[:5]
        raise ValueError(f"paired CI: the entry and the reference scored different documents, e.g. {only}")
    if not entry:
        raise ValueError("paired CI: no documents")
    strata: dict[Hashable, list[float]] = {}
    for key in sorted(entry, key=str):
        strata.setdefault(key[0], []).append(entry[key] - reference[key])
    weight = {s: 1 / len(strata) for s in strata} if weights is None else weights
    rng = np.random.default_rng(seed)
    point = float(sum(weight[s] * np.mean(d) for s, d in strata.items()))
    replicates = np.zeros(iters)
    for stratum, diffs in strata.items():
        values = np.asarray(diffs)
        picks = rng.integers(0, len(values), size=(iters, len(values)))
        replicates += weight[stratum] * values[picks].mean(axis=1)
    tail = (1 - level) / 2 * 100
    low, high = np.percentile(replicates, [tail, 100 - tail])
    p_value = min(1.0, 2 * min(float(np.mean(replicates <= 0)), float(np.mean(replicates >= 0))))
    return PairedDifference(point, float(low), float(high), len(entry), p_value)
