"""What every pattern format shares: tab-separated grids, a grid brought to the model's KV
groups, and the provenance and local sizes of an imported file.

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
from pathlib import Path
from typing import Any

from bosch_eval.masks.head_mask import ModelShape
from bosch_eval.masks.window import check_sinks, check_window
from bosch_eval.runtime.errors import MaskError

Grid = list[list[float]]


def read_text(path: Path) -> str:
    """The text of ``path``, or a :class:`MaskError` saying why there is none."""
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
    lines = read_text(path).splitlines()
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


def model_suffix(model: str | None) -> str:
    return f" ({model})" if model else ""


def check_layers(found: str, count: int, shape: ModelShape, model: str | None) -> None:
    """Raise unless ``count`` (described by ``found``, which names the file) is the model's L."""
    if count != shape.num_layers:
        raise MaskError(f"{found}, but the model{model_suffix(model)} has num_layers={shape.num_layers}")


def width_error(found: str, shape: ModelShape, model: str | None) -> MaskError:
    return MaskError(
        f"{found}, but the model{model_suffix(model)} needs num_kv_heads={shape.num_kv_heads} "
        f"(one per KV group) or num_heads={shape.num_heads} (one per query head, averaged over each group)"
    )


def per_group(rows: Grid, shape: ModelShape, path: Path, unit: str, model: str | None) -> tuple[Grid, bool]:
    """Bring an L×G or L×H grid read from ``path`` to L×G (means over each group's query heads).

    Returns:
        The L×G grid and whether it was per query head.
    """
    check_layers(f"{path}: {len(rows)} lines, one per layer", len(rows), shape, model)
    width = len(rows[0])
    if width == shape.num_kv_heads:
        return [list(row) for row in rows], False
    if width == shape.num_heads:
        size = shape.group_size
        means = [[math.fsum(row[g * size : (g + 1) * size]) / size for g in range(shape.num_kv_heads)] for row in rows]
        return means, True
    raise width_error(f"{path}: {width} {unit} per line", shape, model)


def provenance(
    fmt: str, upstream: str, path: Path, per_query_head: bool, sidecar_keys: tuple[str, ...] = ()
) -> dict[str, Any]:
    """What an imported file records: its format and origin, its digest, how group scores were
    made, and ``sidecar_keys`` of a ``config.json`` beside it (none: no sidecar is read)."""
    provenance: dict[str, Any] = {
        "imported_from": fmt,
        "upstream": upstream,
        "source_file": str(path),
        "sha256": hashlib.sha256(path.read_bytes()).hexdigest(),
        "group_score": "mean over query heads" if per_query_head else "per KV group in the file",
    }
    sidecar = path.parent / "config.json"
    if sidecar_keys and sidecar.is_file():
        try:
            config = json.loads(sidecar.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError) as err:
            raise MaskError(f"{sidecar}: not valid JSON ({err}); fix or move it away from {path.name}") from None
        if isinstance(config, dict):
            kept = {key: config[key] for key in sidecar_keys if key in config}
            provenance["sidecar_config"] = {"file": str(sidecar), **kept}
    return provenance


def local_sizes(record: dict[str, Any], window_key: str, window: int | None) -> dict[str, int | None]:
    """``window`` and ``sinks`` from the sidecar's sink/window sizes in a :func:`provenance`
    ``record``; an explicit ``window`` wins."""
    sidecar = record.get("sidecar_config", {})
    where = sidecar.get("file", "config.json")
    sinks = check_sinks(sidecar.get("sink_size", 0), f"{where}: field 'sink_size'")
    if window is None and sidecar.get(window_key) is not None:
        window = check_window(sidecar[window_key], f"{where}: field '{window_key}'")
    return {"window": None if window is None else check_window(window), "sinks": sinks}
