"""``acc_tiebreak``: accuracy with the answer's probability as a tie-break (issue 29, a
named deviation from the paper's Eq. 4; the search's default metric since issue 67,
``--calib-metric acc`` is the paper's).

Why: with 64 examples and a 0/1 metric, many masks of a sub-problem score exactly the
same S, and the search keeps the first one it met (39–133 distinct masks shared the
winning S in toy-l's Stage 3 journals), so the answer depends on evaluation order.
Here an example is worth ``(1 − ε)·acc + ε·p``, where ``p`` is the probability the model
gives the whole target (``exp`` of lm-eval's loglikelihood) and ``ε = 1 / (2(N + 1))``
for a set of N examples. Then one more correct example always outweighs any change in
the probabilities (``(1 − ε)/N > ε``), so masks are ordered by accuracy first and, among
equal accuracies, by how sure the model is of the answers. Each value stays in [0, 1]
and the task aggregates with lm-eval's mean, so racing stays exact.

``prob`` is ``p`` alone, the mean probability of the answers: a continuous S that the search's
Eq. 2 normalizes between its anchors like any other (``--calib-metric prob``, a deviation
from the paper's accuracy). It orders masks that accuracy ties, and it also moves with
changes in confidence that accuracy would never see, so a mask may gain ``prob`` while it
loses an answer; ``calib-check --calib-metric acc acc_tiebreak prob`` measures which of the
three orders masks as a development split does.
"""

from __future__ import annotations

import math
from typing import Any


def tiebreak_weight(num_examples: int) -> float:
    """ε for a set of ``num_examples``: small enough that accuracy always decides first."""
    return 1.0 / (2 * (num_examples + 1))


def process_results(doc: dict[str, Any], results: list[tuple[float, bool]]) -> dict[str, float]:
    """lm-eval ``process_results`` of a one-continuation loglikelihood task: ``acc`` as
    lm-eval computes it, ``acc_tiebreak`` and ``prob``."""
    ((loglikelihood, is_greedy),) = results
    acc, prob = float(is_greedy), math.exp(loglikelihood)
    weight = tiebreak_weight(doc["num_examples"])
    return {"acc": acc, "acc_tiebreak": (1 - weight) * acc + weight * prob, "prob": prob}
