"""The ``bosch`` adapter's own model_args, converted and validated once.

lm-eval hands model_args to the adapter as Python values it guessed from the command line
(``window=16`` → ``16``, ``memoize_tokens=True`` → ``True``), as strings (a JSON or YAML
config, ``bosch-eval compare`` entries) or as objects (programmatic use: a loaded
:class:`HeadMask`). Each field here names its converter, so ``'16'`` and ``16`` both become
the window 16 and ``'maybe'`` is an error naming the key, before any model loads; what the
adapter does not take goes on to lm-eval's ``HFLM`` (:mod:`.loader_args` sorts the two).

What needs the model's config (the mask's shape, KV quantization's head size, a hybrid
checkpoint's saved mask) is checked by the adapter right after, still before the weights load.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from bosch_eval.masks.head_mask import HeadMask, HeadRanking, check_ratio, check_sinks, check_window
from bosch_eval.masks.mask_sources import MaskRequest
from bosch_eval.models.rope_scaling import check_rope_args
from bosch_eval.runtime.checks import check_int, is_number
from bosch_eval.runtime.errors import SettingsError

KV_CACHES = ("hybrid", "captured", "dynamic")
# Field metadata: the field chooses the head mask, so it can be swapped in place on a loaded
# model (``bosch-eval compare`` shares one load among entries that differ only there).
MASK_SOURCE = "mask_source"
CONVERT = "convert"


def _text(name: str, value: Any) -> str:
    if not isinstance(value, str):
        raise SettingsError(f"{name}: expected a name, got {value!r}")
    return value


def _path_or(kind: type) -> Callable[[str, Any], Any]:
    def convert(name: str, value: Any) -> Any:
        if isinstance(value, (str, Path, kind)):
            return value
        raise SettingsError(
            f"{name}: expected a file path (quote a file named like a number: {name}='{value}'), got {value!r}"
        )

    return convert


def _flag(name: str, value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in ("true", "false"):
        return value.strip().lower() == "true"
    raise SettingsError(f"{name}: expected True or False, got {value!r}")


def _integer(name: str, value: Any) -> int:
    if isinstance(value, str):
        try:
            value = int(value.strip())
        except ValueError:
            raise SettingsError(f"{name}: expected an integer, got {value!r}") from None
    return check_int(value, name)


def _number(name: str, value: Any) -> float:
    if isinstance(value, str):
        try:
            value = float(value.strip())
        except ValueError:
            raise SettingsError(f"{name}: expected a number, got {value!r}") from None
    if not is_number(value):
        raise SettingsError(f"{name}: expected a number, got {value!r}")
    return float(value)


def _arg(default: Any, convert: Callable[[str, Any], Any], *, mask_source: bool = False) -> Any:
    return field(default=default, metadata={CONVERT: convert, MASK_SOURCE: mask_source})


@dataclass(frozen=True)
class AdapterSettings:
    """Every model_arg of ``--model bosch`` that HFLM does not take (see the adapter's module
    docstring for what each does). ``None`` = not given."""

    mask: str | Path | HeadMask | None = _arg(None, _path_or(HeadMask), mask_source=True)  # a file, "full", or a mask
    ranking: str | Path | HeadRanking | None = _arg(None, _path_or(HeadRanking), mask_source=True)
    layers: str | None = _arg(None, _text, mask_source=True)
    ratio: float | None = _arg(None, _number, mask_source=True)
    seed: int | None = _arg(None, _integer, mask_source=True)
    window: int | None = _arg(None, _integer, mask_source=True)
    sink: int | None = _arg(None, _integer)
    attn_backend: str = _arg("auto", _text)
    kv_cache: str = _arg("hybrid", _text)
    memoize_tokens: bool = _arg(False, _flag)
    progress_bars: bool = _arg(True, _flag)
    rope_scaling: str | None = _arg(None, _text)
    rope_factor: float | None = _arg(None, _number)
    rope_original_max_positions: int | None = _arg(None, _integer)
    kv_quant: str | None = _arg(None, _text)
    kv_bits: int | None = _arg(None, _integer)
    kv_window: int | None = _arg(None, _integer)
    kv_group_size: int | None = _arg(None, _integer)
    prefix_cache_mb: int = _arg(0, _integer)
    allow_truncation: bool = _arg(False, _flag)

    def __post_init__(self) -> None:
        for spec in fields(self):
            value = getattr(self, spec.name)
            if value is not None:
                object.__setattr__(self, spec.name, spec.metadata[CONVERT](spec.name, value))
        if self.ratio is not None:
            check_ratio(self.ratio, "ratio")
        if self.window is not None:
            check_window(self.window, "window")
        if self.sink is not None:
            check_sinks(self.sink, "sink")
        if self.kv_cache not in KV_CACHES:
            raise SettingsError(f"kv_cache: expected one of {list(KV_CACHES)}, got {self.kv_cache!r}")
        if self.prefix_cache_mb < 0:
            raise SettingsError(
                f"prefix_cache_mb: expected a whole number of megabytes >= 0 (0 = no cache), got {self.prefix_cache_mb!r}"
            )
        if self.prefix_cache_mb and self.kv_quant not in (None, "none"):
            raise SettingsError(
                "prefix_cache_mb: not with kv_quant (compressed scoring runs its own prefill per request)"
            )
        check_rope_args(self.rope_scaling, self.rope_factor, self.rope_original_max_positions, ROPE_ARGS)

    @classmethod
    def names(cls) -> tuple[str, ...]:
        """Every model_arg the adapter itself takes (the rest are HFLM's)."""
        return tuple(spec.name for spec in fields(cls))

    @classmethod
    def mask_source_names(cls) -> tuple[str, ...]:
        """The model_args that choose the head mask (swappable on a loaded model)."""
        return tuple(spec.name for spec in fields(cls) if spec.metadata[MASK_SOURCE])

    def mask_sources(self) -> dict[str, Any]:
        """The mask-source fields, by name."""
        return {name: getattr(self, name) for name in self.mask_source_names()}

    def mask_request(self) -> MaskRequest:
        """The mask asked for, with the sinks override, as :func:`bosch_eval.masks.mask_sources.resolve_mask` takes it."""
        return MaskRequest(**self.mask_sources(), sinks=self.sink)


ROPE_ARGS = ("rope_scaling", "rope_factor", "rope_original_max_positions")
