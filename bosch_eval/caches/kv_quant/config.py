"""The KV-quantization settings (``kv_quant``, ``kv_bits``, ``kv_window``, ``kv_group_size``)."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from bosch_eval.caches.kv_quant.packing import BITS
from bosch_eval.caches.kv_quant.methods import KV_QUANT_METHODS
from bosch_eval.runtime.checks import is_int
from bosch_eval.runtime.errors import SettingsError

DEFAULT_GROUP_SIZE = 64  # the seed's and KIVI's choice, used where it divides the head dim
CONFIG_FIELD = "bosch_kv_quant"  # where a hybrid checkpoint's config.json keeps the settings


@dataclass(frozen=True)
class KVQuantConfig:
    """Which positions of full-attention KV groups are quantized, and how.

    Args:
        method: a name in :data:`~bosch_eval.caches.kv_quant.methods.KV_QUANT_METHODS`: ``logquant``
            (log-sparse full-precision set), ``kivi`` (recent window), ...
        bits: 2 or 4 bits per quantized element.
        window: W_lq; full precision holds ``2W … 3W`` tokens (see ``selection``).
        group_size: channels per value scale (values are quantized per token in groups
            of this many channels); must divide the head dim.
    """

    method: str
    bits: int
    window: int
    group_size: int

    def __post_init__(self) -> None:
        if self.method not in KV_QUANT_METHODS:
            raise SettingsError(f"kv_quant: expected one of {[*KV_QUANT_METHODS.names(), 'none']}, got {self.method!r}")
        if self.bits not in BITS:
            raise SettingsError(f"kv_bits: expected one of {list(BITS)}, got {self.bits!r}")
        if not is_int(self.window) or self.window <= 0:
            raise SettingsError(f"kv_window: expected a positive integer (W_lq, tokens), got {self.window!r}")
        if not is_int(self.group_size) or self.group_size <= 0:
            raise SettingsError(
                f"kv_group_size: expected a positive integer dividing the head dim, got {self.group_size!r}"
            )

    def check_head_dim(self, head_dim: int) -> None:
        """Raise unless ``group_size`` divides ``head_dim``."""
        if head_dim % self.group_size:
            divisors = [d for d in range(1, head_dim + 1) if head_dim % d == 0]
            raise SettingsError(
                f"kv_group_size: {self.group_size} does not divide the head dim {head_dim}; expected one of {divisors}"
            )

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: Any, source: str) -> KVQuantConfig:
        if not isinstance(data, dict) or set(data) != {"method", "bits", "window", "group_size"}:
            raise SettingsError(
                f"{source}: expected an object with fields method, bits, window, group_size; got {data!r}"
            )
        return cls(**data)


def _int_arg(name: str, value: Any) -> int:
    if isinstance(value, bool):
        raise SettingsError(f"{name}: expected an integer, got {value!r}")
    try:
        return int(value)
    except (TypeError, ValueError):
        raise SettingsError(f"{name}: expected an integer, got {value!r}") from None


def parse_kv_quant(
    kv_quant: Any, kv_bits: Any = None, kv_window: Any = None, kv_group_size: Any = None, head_dim: int | None = None
) -> KVQuantConfig | None:
    """Turn the ``--model_args`` strings into a config (``None`` for ``kv_quant=none``).

    Raises:
        SettingsError: naming the argument and its allowed values.
    """
    if kv_quant is None or kv_quant == "none":
        extra = [
            name
            for name, value in (("kv_bits", kv_bits), ("kv_window", kv_window), ("kv_group_size", kv_group_size))
            if value is not None
        ]
        if extra:
            raise SettingsError(
                f"{', '.join(extra)}: only used with kv_quant={'|'.join(KV_QUANT_METHODS.names())}; got kv_quant={kv_quant!r}"
            )
        return None
    if kv_quant not in KV_QUANT_METHODS:
        raise SettingsError(f"kv_quant: expected one of {[*KV_QUANT_METHODS.names(), 'none']}, got {kv_quant!r}")
    if kv_window is None:
        raise SettingsError(f"kv_window: kv_quant={kv_quant} needs kv_window=W_lq (a positive integer)")
    bits = _int_arg("kv_bits", 2 if kv_bits is None else kv_bits)
    if kv_group_size is None:
        group = DEFAULT_GROUP_SIZE if head_dim is None or head_dim % DEFAULT_GROUP_SIZE == 0 else head_dim
    else:
        group = _int_arg("kv_group_size", kv_group_size)
    config = KVQuantConfig(kv_quant, bits, _int_arg("kv_window", kv_window), group)
    if head_dim is not None:
        config.check_head_dim(head_dim)
    return config


def kv_quant_setting(
    args: tuple[Any, Any, Any, Any], saved: KVQuantConfig | None, head_dim: int, kv_cache: str
) -> KVQuantConfig | None:
    """The KV quantization the model_args ``args`` (kv_quant, kv_bits, kv_window, kv_group_size)
    ask for, checked against the head width; a hybrid checkpoint's ``saved`` settings when none
    is given. It lives in the hybrid cache, so any other ``kv_cache`` is refused.

    Raises:
        SettingsError: a bad argument, or a quantization under another cache.
    """
    quant = saved if args == (None, None, None, None) else parse_kv_quant(*args, head_dim=head_dim)
    if quant is not None and kv_cache != "hybrid":
        raise SettingsError(
            f"kv_cache: kv_quant={quant.method} stores its KV in the hybrid cache; got kv_cache={kv_cache!r}"
        )
    return quant
