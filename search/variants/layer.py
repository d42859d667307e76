"""``layer`` (B-layer): one search over whole layers, budget κ·L."""

from __future__ import annotations

from bosch_eval.search.stages.subproblems import layer_level
from bosch_eval.search.variants import VARIANTS, SearchRun, Variant, VariantOutcome


def run_layer(run: SearchRun) -> VariantOutcome:
    """The whole-layer search of :func:`~bosch_eval.search.stages.subproblems.layer_level`."""
    return VariantOutcome.of(
        layer_level(run.book, run.anchors, run.shape, run.settings.ratio, run.stages, run.progress)
    )


VARIANTS.register("layer", Variant(run_layer))
