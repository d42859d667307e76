"""Head masks and head rankings: the one data type of bosch-eval, and its JSON files.

A head mask ``z`` has one bit per (layer, KV group): ``1`` = full causal attention,
``0`` = sliding-window attention (SWA), the paper's convention (§2.1). Under GQA every
query head of a KV group shares its group's bit, because only a whole group switching
to SWA shrinks the KV cache.

On disk (``bosch-mask/1``)::

    {"format": "bosch-mask/1", "model": "Qwen/Qwen3-1.7B-Base",
     "num_layers": 28, "num_heads": 16, "num_kv_heads": 8, "window": 1024,
     "swa_ratio": 0.75, "method": "bosch", "mask": [[1, 0, ...], ...],
     "provenance": {...}}

A ranking (``bosch-ranking/1``) scores every KV group; applying a ratio ρ converts the
⌈ρ·L·G⌉ most local groups to SWA.

Both may carry ``"sinks": S`` (attention-sink positions every SWA query also sees,
:class:`~bosch_eval.masks.window.LocalWindow`); it is optional, absent means 0, and it is
written only when S > 0, so files without sinks read and write as before.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bosch_eval.masks.window import LocalWindow, check_sinks, check_window
from bosch_eval.runtime.checks import is_number
from bosch_eval.runtime.errors import MaskError

MASK_FORMAT = "bosch-mask/1"
RANKING_FORMAT = "bosch-ranking/1"

# Ratios such as 0.1 * 30 are 3.0000000000000004 in floating point; ⌈·⌉ must still give 3.
_CEIL_SLACK = 1e-9


def ceil_count(ratio: float, total: int) -> int:
    """Return ⌈ratio·total⌉, robust to floating-point noise in the product."""
    return min(total, max(0, math.ceil(ratio * total - _CEIL_SLACK)))


def check_ratio(ratio: Any, source: str = "ratio") -> float:
    """Validate an SWA ratio: a number in [0, 1].

    Raises:
        MaskError: naming ``source`` when the value is not a number in [0, 1].
    """
    if not is_number(ratio) or not 0.0 <= ratio <= 1.0:
        raise MaskError(f"{source}: expected an SWA ratio in [0, 1], got {ratio!r}")
    return float(ratio)


def uniform_bit(ratio: float) -> int | None:
    """The bit every KV group gets when ``ratio`` leaves one mask: 1 (full) at ratio 0, 0 (SWA)
    at ratio 1; None for a ratio in between, where there is a mask to choose. The one place
    that special case is decided: the search scores just the anchors then, and Stage 3 skips
    such layers."""
    return {0.0: 1, 1.0: 0}.get(check_ratio(ratio))


@dataclass(frozen=True)
class ModelShape:
    """The attention geometry a mask must fit: L layers, H query heads, G KV groups."""

    num_layers: int
    num_heads: int
    num_kv_heads: int

    def __post_init__(self) -> None:
        if min(self.num_layers, self.num_heads, self.num_kv_heads) < 1:
            raise MaskError(f"model shape must be positive, got {self}")
        if self.num_heads % self.num_kv_heads:
            raise MaskError(f"num_heads={self.num_heads} is not a multiple of num_kv_heads={self.num_kv_heads}")

    @classmethod
    def from_config(cls, config: Any) -> ModelShape:
        """Read L, H and G from a transformers config (multimodal configs: their text part)."""
        text = config.get_text_config() if hasattr(config, "get_text_config") else config
        heads = text.num_attention_heads
        kv_heads = getattr(text, "num_key_value_heads", None) or heads
        return cls(text.num_hidden_layers, heads, kv_heads)

    @staticmethod
    def head_dim_of(config: Any) -> int:
        """D, one head's width, from a transformers config (multimodal configs: their text
        part): ``head_dim``, else ``hidden_size // num_attention_heads`` (configs that omit it)."""
        text = config.get_text_config() if hasattr(config, "get_text_config") else config
        return getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads

    @property
    def group_size(self) -> int:
        """Query heads per KV group (H / G)."""
        return self.num_heads // self.num_kv_heads

    def check_matches(self, model: ModelShape, source: str, model_name: str | None = None) -> None:
        """Raise a MaskError naming ``source`` unless this shape (of a file) equals the model's."""
        name = f" ({model_name})" if model_name else ""
        for attr in ("num_layers", "num_heads", "num_kv_heads"):
            got, want = getattr(self, attr), getattr(model, attr)
            if got != want:
                raise MaskError(f"{source}: field '{attr}' is {got}, but the model{name} has {attr}={want}")


@dataclass(frozen=True)
class HeadMask:
    """A binary L×G head mask: ``bits[l][g] == 1`` keeps full attention, ``0`` is SWA."""

    bits: tuple[tuple[int, ...], ...]
    num_heads: int
    window: int | None = None
    model: str | None = None
    method: str | None = None
    provenance: Mapping[str, Any] = field(default_factory=dict, compare=False)
    sinks: int = 0

    def __post_init__(self) -> None:
        check_sinks(self.sinks)
        if not self.bits or not self.bits[0]:
            raise MaskError("mask: expected a non-empty L×G grid")
        width = len(self.bits[0])
        for layer, row in enumerate(self.bits):
            if len(row) != width:
                raise MaskError(f"mask: row {layer} has {len(row)} entries, expected {width}")
            for group, bit in enumerate(row):
                if bit not in (0, 1) or isinstance(bit, float):
                    raise MaskError(f"mask: entry [{layer}][{group}] is {bit!r}, expected 0 (SWA) or 1 (full)")
        ModelShape(len(self.bits), self.num_heads, width)  # H must be a multiple of G
        if self.window is not None:
            check_window(self.window)

    # -- constructors ---------------------------------------------------------------
    @classmethod
    def from_rows(cls, rows: Sequence[Sequence[int]], num_heads: int, **meta: Any) -> HeadMask:
        """Build a mask from nested sequences of 0/1 (ints or bools)."""
        return cls(tuple(tuple(int(b) if isinstance(b, bool) else b for b in row) for row in rows), num_heads, **meta)

    @classmethod
    def uniform(cls, shape: ModelShape, full: bool, **meta: Any) -> HeadMask:
        """The all-full (``full=True``) or all-SWA mask for a model shape."""
        row = (int(full),) * shape.num_kv_heads
        return cls((row,) * shape.num_layers, shape.num_heads, **meta)

    @classmethod
    def from_swa_groups(cls, shape: ModelShape, swa: set[tuple[int, int]], **meta: Any) -> HeadMask:
        """A mask whose SWA groups are exactly the (layer, group) pairs in ``swa``."""
        rows = [[0 if (layer, g) in swa else 1 for g in range(shape.num_kv_heads)] for layer in range(shape.num_layers)]
        return cls.from_rows(rows, shape.num_heads, **meta)

    # -- geometry ---------------------------------------------------------------------
    @property
    def shape(self) -> ModelShape:
        return ModelShape(len(self.bits), self.num_heads, len(self.bits[0]))

    @property
    def num_swa_groups(self) -> int:
        return sum(row.count(0) for row in self.bits)

    @property
    def local(self) -> LocalWindow | None:
        """The SWA groups' window and sinks (None while the window is unset)."""
        return None if self.window is None else LocalWindow(self.window, self.sinks)

    @property
    def swa_ratio(self) -> float:
        """Share of KV groups (equivalently, of query heads) that use SWA."""
        shape = self.shape
        return self.num_swa_groups / (shape.num_layers * shape.num_kv_heads)

    def query_head_bits(self) -> list[list[int]]:
        """Expand KV-group bits to query heads (group g covers heads g·H/G … (g+1)·H/G − 1)."""
        repeat = self.shape.group_size
        return [[bit for bit in row for _ in range(repeat)] for row in self.bits]

    def with_meta(self, **meta: Any) -> HeadMask:
        """A copy with some of window/sinks/model/method/provenance replaced."""
        fields = {
            "window": self.window,
            "sinks": self.sinks,
            "model": self.model,
            "method": self.method,
            "provenance": self.provenance,
        }
        fields.update(meta)
        return HeadMask(self.bits, self.num_heads, **fields)

    def check_fits(self, shape: ModelShape, source: str = "mask", model: str | None = None) -> None:
        """Raise a MaskError naming ``source`` unless this mask was made for ``shape``."""
        self.shape.check_matches(shape, source, model)

    # -- JSON -------------------------------------------------------------------------
    def to_json(self) -> dict[str, Any]:
        shape = self.shape
        return {
            "format": MASK_FORMAT,
            "model": self.model,
            "num_layers": shape.num_layers,
            "num_heads": shape.num_heads,
            "num_kv_heads": shape.num_kv_heads,
            "window": self.window,
            "swa_ratio": self.swa_ratio,
            "method": self.method,
            "mask": [list(row) for row in self.bits],
            "provenance": dict(self.provenance),
        } | ({"sinks": self.sinks} if self.sinks else {})

    @classmethod
    def from_json(cls, data: Any, source: str = "mask") -> HeadMask:
        """Parse and validate a ``bosch-mask/1`` object; errors name ``source`` and the field."""
        _check_format(data, MASK_FORMAT, source)
        for key in ("num_layers", "num_heads", "num_kv_heads", "mask"):
            if key not in data:
                raise MaskError(f"{source}: missing field '{key}'")
        rows = data["mask"]
        if not isinstance(rows, list) or not all(isinstance(r, list) for r in rows):
            raise MaskError(f"{source}: field 'mask' must be a list of L lists of 0/1, got {type(rows).__name__}")
        if len(rows) != data["num_layers"]:
            raise MaskError(f"{source}: field 'mask' has {len(rows)} rows, expected num_layers={data['num_layers']}")
        for layer, row in enumerate(rows):
            if len(row) != data["num_kv_heads"]:
                raise MaskError(
                    f"{source}: field 'mask' row {layer} has {len(row)} entries, "
                    f"expected num_kv_heads={data['num_kv_heads']}"
                )
            for group, bit in enumerate(row):
                if isinstance(bit, bool) or bit not in (0, 1):
                    raise MaskError(
                        f"{source}: field 'mask' entry [{layer}][{group}] is {bit!r}, expected 0 (SWA) or 1 (full)"
                    )
        window = data.get("window")
        if window is not None:
            check_window(window, f"{source}: field 'window'")
        sinks = check_sinks(data.get("sinks", 0), f"{source}: field 'sinks'")
        try:
            mask = cls.from_rows(
                rows,
                data["num_heads"],
                window=window,
                sinks=sinks,
                model=data.get("model"),
                method=data.get("method"),
                provenance=data.get("provenance") or {},
            )
        except MaskError as err:
            raise MaskError(f"{source}: {err}") from None
        stated = data.get("swa_ratio")
        if stated is not None and abs(stated - mask.swa_ratio) > 1e-6:
            raise MaskError(
                f"{source}: field 'swa_ratio' is {stated}, but the mask has {mask.num_swa_groups} SWA groups "
                f"(ratio {mask.swa_ratio:.6g})"
            )
        return mask

    @classmethod
    def load(cls, path: str | Path) -> HeadMask:
        """Load a ``bosch-mask/1`` JSON file."""
        return cls.from_json(_read_json(path), str(path))

    def save(self, path: str | Path) -> None:
        """Write this mask as ``bosch-mask/1`` JSON (its folder is created if missing)."""
        Path(path).parent.mkdir(parents=True, exist_ok=True)
        Path(path).write_text(json.dumps(self.to_json(), indent=1) + "\n")


# What a ranker that reads the calibration set records as its ``inputs`` (search/rankers/base.py).
CALIBRATION_INPUTS = "calibration examples (input + ' ' + target)"


@dataclass(frozen=True)
class HeadRanking:
    """Per-KV-group locality scores from a static method (DCAM, Fisher, ...).

    ``more_local`` says which end of the scale marks a group that tolerates SWA best:
    ``"higher"`` means a high score is more local.
    """

    scores: tuple[tuple[float, ...], ...]
    more_local: str
    method: str
    num_heads: int
    window: int | None = None
    model: str | None = None
    provenance: Mapping[str, Any] = field(default_factory=dict, compare=False)
    sinks: int = 0

    def __post_init__(self) -> None:
        check_sinks(self.sinks)
        if self.more_local not in ("higher", "lower"):
            raise MaskError(f"ranking: field 'more_local' is {self.more_local!r}, expected 'higher' or 'lower'")
        width = len(self.scores[0]) if self.scores else 0
        if not width:
            raise MaskError("ranking: field 'scores' must be a non-empty L×G grid")
        for layer, row in enumerate(self.scores):
            if len(row) != width:
                raise MaskError(f"ranking: field 'scores' row {layer} has {len(row)} entries, expected {width}")
            for group, value in enumerate(row):
                if not math.isfinite(value):
                    raise MaskError(
                        f"ranking: field 'scores' entry [{layer}][{group}] is {value}, expected a finite number"
                    )
        ModelShape(len(self.scores), self.num_heads, width)

    @property
    def shape(self) -> ModelShape:
        return ModelShape(len(self.scores), self.num_heads, len(self.scores[0]))

    @property
    def calibration_tasks(self) -> set[str]:
        """The calibration task the scores were computed on (paper B.4: the search's), from the
        provenance; empty for a method that reads none of it (Razor scores random tokens)."""
        task = self.provenance.get("calib_task")
        return {task} if task and self.provenance.get("inputs") == CALIBRATION_INPUTS else set()

    def to_mask(self, ratio: float, window: int | None = None) -> HeadMask:
        """Convert the ⌈ρ·L·G⌉ most local KV groups to SWA.

        Ties are broken by (layer, group) order so that the result is deterministic.
        """
        ratio = check_ratio(ratio)
        shape = self.shape
        cells = [(layer, g) for layer in range(shape.num_layers) for g in range(shape.num_kv_heads)]
        sign = -1.0 if self.more_local == "higher" else 1.0
        cells.sort(key=lambda cell: (sign * self.scores[cell[0]][cell[1]], cell))
        count = ceil_count(ratio, len(cells))
        window = window if window is not None else self.window
        return HeadMask.from_swa_groups(
            shape,
            set(cells[:count]),
            window=window,
            sinks=self.sinks,
            model=self.model,
            method=self.method,
            provenance={"ranking_method": self.method, "ratio": ratio},
        )

    def to_json(self) -> dict[str, Any]:
        shape = self.shape
        return {
            "format": RANKING_FORMAT,
            "method": self.method,
            "model": self.model,
            "num_layers": shape.num_layers,
            "num_heads": shape.num_heads,
            "num_kv_heads": shape.num_kv_heads,
            "window": self.window,
            "more_local": self.more_local,
            "scores": [list(row) for row in self.scores],
            "provenance": dict(self.provenance),
        } | ({"sinks": self.sinks} if self.sinks else {})

    @classmethod
    def from_json(cls, data: Any, source: str = "ranking") -> HeadRanking:
        """Parse and validate a ``bosch-ranking/1`` object; errors name ``source`` and the field."""
        _check_format(data, RANKING_FORMAT, source)
        for key in ("method", "more_local", "scores", "num_heads"):
            if key not in data:
                raise MaskError(f"{source}: missing field '{key}'")
        rows = data["scores"]
        if not isinstance(rows, list) or not all(isinstance(r, list) for r in rows):
            raise MaskError(f"{source}: field 'scores' must be a list of L lists of numbers")
        for layer, row in enumerate(rows):
            for group, value in enumerate(row):
                if not is_number(value):
                    raise MaskError(
                        f"{source}: field 'scores' entry [{layer}][{group}] is {value!r}, expected a number"
                    )
        for key, expected in (("num_layers", len(rows)), ("num_kv_heads", len(rows[0]) if rows else 0)):
            if key in data and data[key] != expected:
                raise MaskError(f"{source}: field '{key}' is {data[key]}, but 'scores' has {expected}")
        try:
            return cls(
                tuple(tuple(float(v) for v in row) for row in rows),
                data["more_local"],
                data["method"],
                data["num_heads"],
                window=data.get("window"),
                model=data.get("model"),
                provenance=data.get("provenance") or {},
                sinks=check_sinks(data.get("sinks", 0), f"{source}: field 'sinks'"),
            )
        except MaskError as err:
            raise MaskError(f"{source}: {err}") from None

    @classmethod
    def load(cls, path: str | Path) -> HeadRanking:
        """Load a ``bosch-ranking/1`` JSON file."""
        return cls.from_json(_read_json(path), str(path))

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_json(), indent=1) + "\n")


def _read_json(path: str | Path) -> Any:
    path = Path(path)
    if not path.is_file():
        raise MaskError(f"{path}: no such file")
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as err:
        raise MaskError(f"{path}: not valid JSON ({err})") from None


def _check_format(data: Any, expected: str, source: str) -> None:
    if not isinstance(data, dict):
        raise MaskError(f"{source}: expected a JSON object, got {type(data).__name__}")
    if data.get("format") != expected:
        raise MaskError(f"{source}: field 'format' is {data.get('format')!r}, expected {expected!r}")
