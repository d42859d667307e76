"""Stage 1 alone: ``single`` returns its mask (B-single), ``multi`` runs it over chunks of
``chunk_layers`` layers (B-multi)."""

from __future__ import annotations

from bosch_eval.search.variants import VARIANTS, Variant
from bosch_eval.search.variants.common import stage1_outcome

VARIANTS.register("single", Variant(lambda run: stage1_outcome(run, 1)))
VARIANTS.register("multi", Variant(lambda run: stage1_outcome(run, run.stages.chunk_layers), chunks=True))
