"""A development-split rule's numbers: two masks' lm_eval runs on the same documents (``--log_samples``),
their scores, and the mean paired difference with its standard error (per document, B − A).

    python results/smollm2/paired_dev.py RUN_A RUN_B

RUN_A, RUN_B: lm_eval ``--output_path`` folders (samples plain or gzipped). A document's value is
its ``acc`` (prefill tasks) or its ``score`` (bosch_niah_dev_gen: [length, value]).
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

from bosch_eval.compare.results import doc_values, read_run


def document_values(run: Path) -> dict[tuple[str, object, int], float]:
    """(task, stratum, doc_id) -> the document's value, from the samples under ``run`` (plain or .gz)."""
    samples = read_run(run).samples
    if not samples:
        sys.exit(f"{run}: no samples_*.jsonl[.gz] (run lm_eval with --log_samples)")
    return {(task, *key): value for task, rows in samples.items() for key, value in doc_values(rows, _metric(rows)).items()}


def _metric(rows: list[dict]) -> str:
    """``acc`` for a prefill task's samples, ``score`` for bosch_niah_dev_gen's."""
    return "acc" if "acc" in rows[0] else "score"


def main(run_a: str, run_b: str) -> None:
    a, b = document_values(Path(run_a)), document_values(Path(run_b))
    if a.keys() != b.keys():
        sys.exit(f"{run_a} and {run_b} scored different documents ({len(a)} and {len(b)})")
    differences = [b[key] - a[key] for key in a]
    n = len(differences)
    mean = sum(differences) / n
    se = math.sqrt(sum((d - mean) ** 2 for d in differences) / (n - 1) / n)
    print(f"{n} documents: A {sum(a.values()) / n:.3f}, B {sum(b.values()) / n:.3f}, B − A {mean:+.3f} ± {se:.3f} (SE)")


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    main(*sys.argv[1:])
