"""A decode step of the hybrid on its cache runs no more aten ops than the original on
transformers' DynamicCache: the cache writes every part in one op and reads views, and a
steady step passes no SWA mask (counted on CPU, eager, the same 4-layer model; views left out)."""

from __future__ import annotations

import pytest
from transformers import DynamicCache

from bosch_eval.attention.hybrid_attention import hybridize
from bosch_eval.bench.op_count import decode_step_ops
from bosch_eval.caches.hybrid_cache import HybridCache
from bosch_eval.masks.head_mask import HeadMask
from bosch_eval.models.random_model import random_model
from tests.helpers import left_padded_batch

# Every kind of layer: all full, mixed twice (groups of a kind apart), all SWA.
ROWS = [[1, 1, 1, 1], [0, 1, 0, 0], [0, 0, 0, 0], [1, 0, 1, 0]]


@pytest.mark.parametrize("lengths", [[30], [30, 17]], ids=["unpadded", "left-padded"])
@pytest.mark.parametrize("sinks", [0, 4])
def test_a_decode_step_runs_no_more_ops_than_the_original(sinks, lengths):
    model = random_model("qwen3", num_layers=4, seed=5)
    ids, attention = left_padded_batch(model.config.vocab_size, lengths, seed=2)
    original = decode_step_ops(model, DynamicCache(), ids, attention)
    with hybridize(model, HeadMask.from_rows(ROWS, 8, window=8, sinks=sinks), backend="blocked", by_kind=True):
        hybrid = decode_step_ops(model, HybridCache.for_model(model), ids, attention)
    assert hybrid.total <= original.total, (hybrid.counts - original.counts, original.counts - hybrid.counts)
    assert "aten.cat" not in hybrid.counts - original.counts  # the cache grows by no cat
