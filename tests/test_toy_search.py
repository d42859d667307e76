"""BOSCH on the bundled toy model, on a shortened calibration (16 examples of 512 tokens).

The planted-objective tests show the optimizers work; this one shows the whole loop works
on a model where the choice of heads decides retrieval: the anchors separate, and the
searched mask beats random masks of the same ratio and the Stage-1-only ablation.
"""

from __future__ import annotations

import pytest

from bosch_eval.masks.layer_heuristics import random_masks
from bosch_eval.search.objective.loading import CalibrationSettings, LoadSettings, build_objective
from bosch_eval.search.run.pipeline import SearchSettings, run_search

pytestmark = pytest.mark.slow

WINDOW = 32  # the toy model's recommended window


@pytest.fixture(scope="module")
def objective():
    return build_objective("toy", CalibrationSettings(examples=16, length=512), LoadSettings(window=WINDOW))


def test_search_beats_random_masks_and_the_stage1_ablation(objective) -> None:
    shape = objective.shape
    found = run_search(objective, shape, SearchSettings(ratio=0.5), progress=False)
    single = run_search(objective, shape, SearchSettings(ratio=0.5, variant="single"), progress=False)
    randoms = [objective(mask) for mask in random_masks(shape, 0.5, range(5), WINDOW)]

    assert found.anchors.all_swa < found.anchors.all_full  # all-SWA loses the needles
    assert found.mask.num_swa_groups == 8  # ⌈0.5 · 4 layers · 4 groups⌉
    assert found.score >= max(randoms)
    assert found.score >= single.score
