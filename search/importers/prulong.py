"""``prulong`` — PruLong ``masks.tsv``

Source: princeton-pli/PruLong, ``prulong/save_prulong_masks.py`` (writes
``<checkpoint>/masks.tsv`` or ``masks_sp<sparsity>.tsv`` with ``csv.writer(f,
delimiter="\\t")``, one row per layer of ``get_mask(...)`` thresholded at 0.5 — or 0.0
after ``round_masks_for_sparsity`` — so every cell is ``0.0`` or ``1.0``);
``prulong/training/modeling_flash_llama.py`` keeps one log-alpha per KV head
(``attn_mask_log_alphas`` has ``num_key_value_heads`` entries) and mixes
``z·full + (1 − z)·windowed``: **1 = full attention, 0 = local**, our convention. The
pattern is binary by construction (its SWA ratio is fixed by the file), so it is
imported as a **mask**; a ranking of 0/1 would only break ties arbitrarily.
Non-binary cells are an error (continuous gates belong to ``--format duo``). A
``config.json`` beside the file (the checkpoint's config: ``local_window_size``,
``sink_size``, ``toggle_type``) is recorded in the provenance when present, and its
``sink_size`` / ``local_window_size`` become the mask's sinks and (unless ``window`` is
passed) window. Without a sidecar, sinks stay 0: no size is guessed.
"""

from __future__ import annotations

from pathlib import Path

from bosch_eval.masks.head_mask import HeadMask, ModelShape
from bosch_eval.runtime.errors import MaskError
from bosch_eval.search.importers import IMPORTERS, Importer
from bosch_eval.search.importers.grid import local_sizes, per_group, provenance, read_tsv_grid

UPSTREAM = "princeton-pli/PruLong (prulong/save_prulong_masks.py: masks.tsv)"
# The sidecar keys worth keeping: PruLong's checkpoint config.
SIDECAR_KEYS = ("_name_or_path", "local_window_size", "sink_size", "toggle_type", "suggested_sparsity")


def import_prulong(
    path: str | Path, shape: ModelShape, *, model: str | None = None, window: int | None = None
) -> HeadMask:
    """Import a PruLong ``masks.tsv`` (0/1 per KV head, 1 = full) as a mask."""
    path = Path(path)
    rows = read_tsv_grid(path, "mask value (0 or 1)")
    for lineno, row in enumerate(rows, start=1):
        for column, value in enumerate(row, start=1):
            if value not in (0.0, 1.0):
                raise MaskError(
                    f"{path}: line {lineno}, column {column} is {value}, expected 0 or 1 (PruLong masks.tsv is "
                    "thresholded; import continuous gates with --format duo)"
                )
    grid, per_query = per_group(rows, shape, path, "mask values", model)
    for layer, row in enumerate(grid):
        for group, value in enumerate(row):
            if value not in (0.0, 1.0):
                raise MaskError(
                    f"{path}: line {layer + 1}, KV group {group}: its {shape.group_size} query heads disagree "
                    "(expected one decision per group: under GQA only a whole group can use SWA)"
                )
    record = provenance("prulong", UPSTREAM, path, per_query, SIDECAR_KEYS)
    return HeadMask.from_rows(
        [[int(value) for value in row] for row in grid],
        shape.num_heads,
        model=model,
        method="prulong",
        provenance=record,
        **local_sizes(record, "local_window_size", window),
    )


IMPORTERS.register("prulong", Importer(import_prulong, UPSTREAM, "PruLong 0/1 masks", gives="mask"))
