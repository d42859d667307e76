"""Importers: published head patterns → ``bosch-ranking/1`` rankings or ``bosch-mask/1`` masks.

Each importer reads one upstream file format, checks it against the model's shape
(L layers, H query heads, G KV groups) and returns our own type. The formats below were
read from the upstream repositories, not guessed; none of their code is used here.

``duo`` — DuoAttention ``full_attention_heads.tsv``
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

``prulong`` — PruLong ``masks.tsv``
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

``retrieval-json`` — Retrieval-Head / RazorAttention style JSON score files
    Source: nightdessert/Retrieval_Head, ``head_score/*.json`` (written by
    ``retrieval_head_detection.py`` as ``json.dump(self.head_counter, f)``; read back in
    ``needle_in_haystack_with_mask.py`` as ``np.mean`` of each list, sorted descending,
    top heads = retrieval heads). One JSON object, keys ``"<layer>-<head>"`` (query-head
    index), values the list of per-trial retrieval scores; e.g. ``Mistral-7B-v0.2-hf.json``
    has 32×32 keys for a model with 8 KV heads, i.e. per query head. A head's score is the
    mean of its list (a bare number is taken as is — an extension for single-score files
    such as RazorAttention's, §B.3.5 of the BOSCH paper, where smaller = more local).
    **Higher = retrieval head = least local**: ``more_local="lower"``.

Head counts (all formats): a grid with G columns per layer is per KV group and used as
is; one with H ≠ G columns is per query head and, under GQA, a group's score is the mean
over its H/G query heads (BOSCH paper §B.3); any other count is an error. For a binary
PruLong mask the query heads of a group must agree. Every error is a :class:`MaskError`
naming the file, the line/column or key, and the expected value.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from bosch_eval.masks.head_mask import HeadMask, HeadRanking, MaskError, ModelShape, check_window
from bosch_eval.runtime.checks import is_int, is_number

Grid = list[list[float]]

UPSTREAM = {
    "duo": "mit-han-lab/duo-attention (attn_patterns/*/full_attention_heads.tsv)",
    "prulong": "princeton-pli/PruLong (prulong/save_prulong_masks.py: masks.tsv)",
    "retrieval-json": "nightdessert/Retrieval_Head (head_score/*.json)",
}
# Sidecar keys worth keeping: DuoAttention's run arguments, PruLong's checkpoint config.
_SIDECAR_KEYS = {
    "duo": ("model_name", "sink_size", "recent_size", "reg_weight", "lr", "num_steps", "max_length"),
    "prulong": ("_name_or_path", "local_window_size", "sink_size", "toggle_type", "suggested_sparsity"),
}
_KEY = re.compile(r"^(\d+)-(\d+)$")


# -- reading ------------------------------------------------------------------------------
def _read_text(path: Path) -> str:
    if not path.is_file():
        raise MaskError(f"{path}: no such file")
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as err:
        raise MaskError(f"{path}: not a UTF-8 text file ({err})") from None


def read_tsv_grid(path: str | Path, what: str = "gate value") -> Grid:
    """Read a tab-separated grid of finite floats: one line per layer, equal lengths.

    Trailing blank lines are ignored (``np.savetxt`` ends with a newline); any other line
    must hold the same number of values as line 1.

    Raises:
        MaskError: naming the file, the line and column, and what was expected.
    """
    path = Path(path)
    lines = _read_text(path).splitlines()
    while lines and not lines[-1].strip():
        lines.pop()
    if not lines:
        raise MaskError(f"{path}: empty file, expected one tab-separated line of {what}s per layer")
    rows: Grid = []
    for lineno, line in enumerate(lines, start=1):
        cells = line.split("\t")
        if rows and len(cells) != len(rows[0]):
            raise MaskError(
                f"{path}: line {lineno} has {len(cells)} tab-separated values, but line 1 has {len(rows[0])} "
                "(expected the same count, one per head, on every line)"
            )
        row = []
        for column, cell in enumerate(cells, start=1):
            try:
                value = float(cell.strip())
            except ValueError:
                raise MaskError(
                    f"{path}: line {lineno}, column {column} is {cell!r}, expected a number "
                    f"(tab-separated {what}s, one line per layer)"
                ) from None
            if not math.isfinite(value):
                raise MaskError(f"{path}: line {lineno}, column {column} is {value}, expected a finite {what}")
            row.append(value)
        rows.append(row)
    return rows


def _model_suffix(model: str | None) -> str:
    return f" ({model})" if model else ""


def _check_layers(found: str, count: int, shape: ModelShape, model: str | None) -> None:
    """Raise unless ``count`` (described by ``found``, which names the file) is the model's L."""
    if count != shape.num_layers:
        raise MaskError(f"{found}, but the model{_model_suffix(model)} has num_layers={shape.num_layers}")


def _width_error(found: str, shape: ModelShape, model: str | None) -> MaskError:
    return MaskError(
        f"{found}, but the model{_model_suffix(model)} needs num_kv_heads={shape.num_kv_heads} "
        f"(one per KV group) or num_heads={shape.num_heads} (one per query head, averaged over each group)"
    )


def _per_group(rows: Grid, shape: ModelShape, path: Path, unit: str, model: str | None) -> tuple[Grid, bool]:
    """Bring an L×G or L×H grid read from ``path`` to L×G (means over each group's query heads).

    Returns:
        The L×G grid and whether it was per query head.
    """
    _check_layers(f"{path}: {len(rows)} lines, one per layer", len(rows), shape, model)
    width = len(rows[0])
    if width == shape.num_kv_heads:
        return [list(row) for row in rows], False
    if width == shape.num_heads:
        size = shape.group_size
        means = [[math.fsum(row[g * size : (g + 1) * size]) / size for g in range(shape.num_kv_heads)] for row in rows]
        return means, True
    raise _width_error(f"{path}: {width} {unit} per line", shape, model)


def _provenance(fmt: str, path: Path, per_query_head: bool) -> dict[str, Any]:
    provenance: dict[str, Any] = {
        "imported_from": fmt,
        "upstream": UPSTREAM[fmt],
        "source_file": str(path),
        "sha256": hashlib.sha256(path.read_bytes()).hexdigest(),
        "group_score": "mean over query heads" if per_query_head else "per KV group in the file",
    }
    sidecar = path.parent / "config.json"
    if fmt in _SIDECAR_KEYS and sidecar.is_file():
        try:
            config = json.loads(sidecar.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError) as err:
            raise MaskError(f"{sidecar}: not valid JSON ({err}); fix or move it away from {path.name}") from None
        if isinstance(config, dict):
            kept = {key: config[key] for key in _SIDECAR_KEYS[fmt] if key in config}
            provenance["sidecar_config"] = {"file": str(sidecar), **kept}
    return provenance


def _local_sizes(provenance: dict[str, Any], window_key: str, window: int | None) -> dict[str, int | None]:
    """``window`` and ``sinks`` from the sidecar's sink/window sizes; an explicit ``window`` wins."""
    sidecar = provenance.get("sidecar_config", {})
    where = sidecar.get("file", "config.json")
    sinks = sidecar.get("sink_size", 0)
    if not is_int(sinks) or sinks < 0:
        raise MaskError(f"{where}: field 'sink_size' is {sinks!r}, expected an integer >= 0")
    if window is None and sidecar.get(window_key) is not None:
        window = check_window(sidecar[window_key], f"{where}: field '{window_key}'")
    return {"window": None if window is None else check_window(window), "sinks": sinks}


# -- importers ----------------------------------------------------------------------------
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
    grid, per_query = _per_group(read_tsv_grid(path, "gate value"), shape, path, "gate values", model)
    provenance = _provenance("duo", path, per_query)
    return HeadRanking(
        tuple(tuple(row) for row in grid),
        more_local="lower",
        method="duoattention",
        num_heads=shape.num_heads,
        model=model,
        provenance=provenance,
        **_local_sizes(provenance, "recent_size", window),
    )


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
    grid, per_query = _per_group(rows, shape, path, "mask values", model)
    for layer, row in enumerate(grid):
        for group, value in enumerate(row):
            if value not in (0.0, 1.0):
                raise MaskError(
                    f"{path}: line {layer + 1}, KV group {group}: its {shape.group_size} query heads disagree "
                    "(expected one decision per group: under GQA only a whole group can use SWA)"
                )
    provenance = _provenance("prulong", path, per_query)
    return HeadMask.from_rows(
        [[int(value) for value in row] for row in grid],
        shape.num_heads,
        model=model,
        method="prulong",
        provenance=provenance,
        **_local_sizes(provenance, "local_window_size", window),
    )


def _head_score(value: Any, where: str) -> float:
    """A head's score: the mean of its list of per-trial scores (or a bare number)."""
    values = value if isinstance(value, list) else [value]
    if not values:
        raise MaskError(f"{where} is an empty list, expected at least one retrieval score")
    for item in values:
        if not is_number(item):
            raise MaskError(f"{where} holds {item!r}, expected a number or a list of numbers")
        if not math.isfinite(item):
            raise MaskError(f"{where} holds {item}, expected finite scores")
    return math.fsum(values) / len(values)


def import_retrieval_json(
    path: str | Path, shape: ModelShape, *, model: str | None = None, window: int | None = None
) -> HeadRanking:
    """Import a Retrieval-Head style ``{"layer-head": [scores]}`` JSON file as a ranking.

    A head's score is the mean of its list; under GQA a group's score is the mean over
    its query heads. Higher = retrieval head, so ``more_local="lower"``.
    """
    path = Path(path)
    try:
        data = json.loads(_read_text(path))
    except json.JSONDecodeError as err:
        raise MaskError(f"{path}: not valid JSON ({err})") from None
    if not isinstance(data, dict) or not data:
        raise MaskError(
            f"{path}: expected a non-empty JSON object of \"<layer>-<head>\": [scores], got {type(data).__name__}"
        )
    scores: dict[tuple[int, int], float] = {}
    for key, value in data.items():
        match = _KEY.match(key)
        if match is None:
            raise MaskError(f"{path}: key {key!r} is not of the form \"<layer>-<head>\" (e.g. \"0-3\")")
        scores[int(match[1]), int(match[2])] = _head_score(value, f"{path}: key {key!r}")
    num_layers = max(layer for layer, _ in scores) + 1
    width = max(head for _, head in scores) + 1
    _check_layers(f"{path}: keys for {num_layers} layers (indices 0…{num_layers - 1})", num_layers, shape, model)
    if width not in (shape.num_kv_heads, shape.num_heads):
        raise _width_error(f"{path}: keys for {width} heads per layer (indices 0…{width - 1})", shape, model)
    for layer in range(num_layers):
        for head in range(width):
            if (layer, head) not in scores:
                raise MaskError(
                    f"{path}: key '{layer}-{head}' is missing, expected one key per layer and head "
                    f"({num_layers}×{width} = {num_layers * width} keys, got {len(scores)})"
                )
    rows = [[scores[layer, head] for head in range(width)] for layer in range(num_layers)]
    grid, per_query = _per_group(rows, shape, path, "heads", model)  # shape checked above
    return HeadRanking(
        tuple(tuple(row) for row in grid),
        more_local="lower",
        method="retrieval-head",
        num_heads=shape.num_heads,
        window=None if window is None else check_window(window),
        model=model,
        provenance=_provenance("retrieval-json", path, per_query),
    )


Importer = Callable[..., "HeadRanking | HeadMask"]
IMPORTERS: dict[str, Importer] = {
    "duo": import_duo,
    "prulong": import_prulong,
    "retrieval-json": import_retrieval_json,
}


def import_pattern(
    fmt: str, path: str | Path, shape: ModelShape, *, model: str | None = None, window: int | None = None
) -> HeadRanking | HeadMask:
    """Import ``path`` in format ``fmt`` (a key of :data:`IMPORTERS`) for a model shape.

    Returns:
        A :class:`HeadRanking` (``duo``, ``retrieval-json``) or a :class:`HeadMask` (``prulong``).
    """
    if fmt not in IMPORTERS:
        raise MaskError(f"format: {fmt!r} is not a known pattern format, expected one of {sorted(IMPORTERS)}")
    return IMPORTERS[fmt](path, shape, model=model, window=window)


def model_shape(model: str) -> ModelShape:
    """L, H, G of a Hugging Face model id or local path (``toy``: the bundled model), from
    its config only (no weights)."""
    from bosch_eval.models.model_check import model_config, resolve_model

    return ModelShape.from_config(model_config(resolve_model(model)))


__all__: Sequence[str] = (
    "IMPORTERS",
    "UPSTREAM",
    "import_duo",
    "import_pattern",
    "import_prulong",
    "import_retrieval_json",
    "model_shape",
    "read_tsv_grid",
)
