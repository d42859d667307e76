"""``duo`` — DuoAttention ``full_attention_heads.tsv``

Source: mit-han-lab/duo-attention, ``attn_patterns/<model>/<run>/full_attention_heads.tsv``
(written by ``save_full_attention_heads`` in ``duo_attn/utils.py`` with ``np.savetxt(...,
delimiter="\\t")``; read back by ``load_attn_pattern`` with ``np.loadtxt`` and
``np.clip(·, 0, 1)``). One line per layer, one tab-separated float per KV head
(Meta-Llama-3.1-8B-Instruct: 32 lines × 8 values; the MHA Llama-2-7B-32K: 32 × 32).
The value is the learned gate: ``duo_attn/patch/llama.py`` mixes
``(1 − g)·streaming + g·full``, and ``sparsify_attention_heads`` keeps full attention
for heads at or above the sparsity quantile. So **higher gate = needs full attention =
least local**: imported as a ranking with ``more_local="lower"``. Continuous, hence a
ranking (any ρ). The published files hold small negatives (down to −1.4e−3); we keep
the raw values (their order is finer than the clipped ones, which would all tie at 0)
and only reject non-finite ones. A ``config.json`` beside the file (the run's
arguments: ``sink_size``, ``recent_size``, ``model_name``, ...) is recorded in the
provenance when present; its streaming heads see ``sink_size`` first tokens and
``recent_size`` recent ones, which is our local window with sinks: when the sidecar gives
them, the ranking carries ``sinks = sink_size`` and (unless ``window`` is passed)
``window = recent_size``.
"""

from __future__ import annotations

from pathlib import Path

from bosch_eval.masks.head_mask import HeadRanking, ModelShape
from bosch_eval.search.importers import IMPORTERS, Importer
from bosch_eval.search.importers.grid import local_sizes, per_group, provenance, read_tsv_grid

UPSTREAM = "mit-han-lab/duo-attention (attn_patterns/*/full_attention_heads.tsv)"
# The sidecar keys worth keeping: DuoAttention's run arguments.
SIDECAR_KEYS = ("model_name", "sink_size", "recent_size", "reg_weight", "lr", "num_steps", "max_length")


def import_duo(
    path: str | Path, shape: ModelShape, *, model: str | None = None, window: int | None = None
) -> HeadRanking:
    """Import a DuoAttention ``full_attention_heads.tsv`` as a ranking (high gate = full).

    Args:
        path: the TSV file (one line per layer, one gate per KV head or query head).
        shape: the model's L, H, G.
        model: model name recorded in the ranking and used in messages.
        window: SWA window W to store with the ranking (``None``: set it at use).
    """
    path = Path(path)
    grid, per_query = per_group(read_tsv_grid(path, "gate value"), shape, path, "gate values", model)
    record = provenance("duo", UPSTREAM, path, per_query, SIDECAR_KEYS)
    return HeadRanking(
        tuple(tuple(row) for row in grid),
        more_local="lower",
        method="duoattention",
        num_heads=shape.num_heads,
        model=model,
        provenance=record,
        **local_sizes(record, "recent_size", window),
    )


IMPORTERS.register("duo", Importer(import_duo, UPSTREAM, "DuoAttention gates", gives="ranking"))
