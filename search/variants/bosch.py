"""``bosch``: Stages 1–3 (Algorithms 1–3), the paper's search; ``nested`` (beyond the paper):
the same with Stages 2–3 kept within Stage 1's mask (:class:`~bosch_eval.search.stages.subproblems.LayerQuotas`)."""

from __future__ import annotations

from bosch_eval.search.variants import VARIANTS, Variant
from bosch_eval.search.variants.common import run_bosch

VARIANTS.register("bosch", Variant(run_bosch, stage2=True, chunks=True))
VARIANTS.register("nested", Variant(run_bosch, stage2=True, chunks=True, nested=True))
