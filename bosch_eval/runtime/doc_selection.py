"""Which documents a limit keeps, per context length.

lm-eval's ``--limit N`` keeps a task's first N documents. RULER-style tasks (upstream
``niah_*``, ``bosch_niah_*``) list their documents ordered by length, so with two lengths
``--limit`` scores only the first length and reports nothing (or -1) for the other. Here a
limit applies to each length separately: the first N documents *of each length* (a
fraction: that share of each length's documents, rounded up as lm-eval rounds). The result
is lm-eval's ``samples`` argument (task → document indices), which replaces ``limit``.
Used by compare (``--limit``) and by the scripts in ``benchmarks/``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any


def _count(limit: int | float, total: int) -> int:
    if isinstance(limit, float) and limit < 1.0:
        return int(math.ceil(total * limit))
    return min(int(limit), total)


def per_length_indices(lengths: Sequence[Any], limit: int | float) -> list[int]:
    """Indices kept by ``limit`` among documents of context ``lengths`` (one per document, in
    order): the first ``limit`` of each length; the first ``limit`` overall unless every
    length is an int."""
    if not lengths or any(not isinstance(n, int) for n in lengths):
        return list(range(_count(limit, len(lengths))))
    by_length: dict[int, list[int]] = {}
    for index, length in enumerate(lengths):
        by_length.setdefault(length, []).append(index)
    kept = [i for indices in by_length.values() for i in indices[: _count(limit, len(indices))]]
    return sorted(kept)


def limited_indices(docs: Sequence[Mapping[str, Any]], limit: int | float) -> list[int]:
    """Indices of the documents kept by ``limit``: per ``max_length`` where docs carry one."""
    return per_length_indices([doc.get("max_length") if isinstance(doc, Mapping) else None for doc in docs], limit)


def samples_for_limit(tasks: Mapping[str, Any], limit: int | float | None) -> dict[str, list[int]] | None:
    """lm-eval ``samples`` for leaf ``tasks`` (name → Task) under ``limit``; None without one."""
    if limit is None:
        return None
    return {name: limited_indices(list(task.eval_docs), limit) for name, task in tasks.items()}
