"""The hybrid spec: what a hybrid model runs, as one immutable value.

``HybridSpec(mask, local, backend)``: the head mask (1 = full, 0 = SWA per KV group), the
SWA groups' window and sinks (:class:`~bosch_eval.attention.local_window.LocalWindow`) and a concrete
kernel backend (:mod:`bosch_eval.attention.kernels`, never ``auto``). Every consumer reads this
one value: the attention function, the deploy-mode cache, the prefix cache, bench and
export. It is built and validated once (:meth:`HybridSpec.build`); search mode makes a new
one per mask (:meth:`HybridSpec.with_mask`, cheap: no model access) and swaps it on the
model's handle (:mod:`bosch_eval.attention.hybrid_attention`).
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass, field
from typing import Any

from bosch_eval.attention import head_order
from bosch_eval.attention.kernels import BACKENDS as KERNELS
from bosch_eval.attention.kernels import Backend
from bosch_eval.attention.kernels.choice import BackendChoice, choose_backend
from bosch_eval.attention.local_window import LocalWindow
from bosch_eval.masks.head_mask import HeadMask, ModelShape, check_window
from bosch_eval.runtime.errors import LocalWindowError, MaskError, SettingsError


def backend_names() -> list[str]:
    """``auto`` and every registered backend."""
    return ["auto", *KERNELS]


def local_window(window: int, sinks: int = 0, source: str = "window") -> LocalWindow:
    """A :class:`LocalWindow`, with errors as :class:`MaskError` naming ``source``."""
    try:
        return LocalWindow(window, sinks)
    except LocalWindowError as err:
        raise MaskError(f"{source}: {err}") from None


def resolve_backend(backend: str, device: Any, dtype: Any = None) -> BackendChoice:
    """Turn ``auto`` into a concrete backend for ``device`` (:func:`choose_backend`, which
    says why it chose it); check that any other can run there.

    Raises:
        SettingsError: an unknown backend, or one that cannot run on ``device``.
    """
    if backend == "auto":
        return choose_backend(device, dtype)
    if backend not in KERNELS:
        raise SettingsError(f"attn_backend: expected one of {backend_names()}, got {backend!r}")
    reason = KERNELS[backend].unavailable(device)
    if reason is not None:
        raise SettingsError(f"attn_backend: {backend!r} {reason}")
    return BackendChoice(backend, "asked for")


@dataclass(frozen=True)
class GroupRun:
    """Consecutive KV groups ``start … stop − 1`` of one kind (full or SWA); ``offset`` is
    the first one's index among the layer's groups of that kind (a cache stores each kind
    apart)."""

    start: int
    stop: int
    offset: int


@dataclass(frozen=True)
class LayerSplit:
    """One layer's KV groups as runs of consecutive full and SWA groups.

    Attention runs once per run on slices of the query, key and value tensors, which are
    views: no gather of the heads of one kind, and each output written once in place.
    """

    full: tuple[GroupRun, ...]
    swa: tuple[GroupRun, ...]
    group_size: int  # query heads per KV group

    @property
    def full_groups(self) -> list[int]:
        return [g for run in self.full for g in range(run.start, run.stop)]

    @property
    def swa_groups(self) -> list[int]:
        return [g for run in self.swa for g in range(run.start, run.stop)]


def _runs(bits: tuple[int, ...], kind: int) -> tuple[GroupRun, ...]:
    runs: list[GroupRun] = []
    offset = 0
    for group, bit in enumerate(bits):
        if bit != kind:
            continue
        if runs and runs[-1].stop == group:
            runs[-1] = GroupRun(runs[-1].start, group + 1, runs[-1].offset)
        else:
            runs.append(GroupRun(group, group + 1, offset))
        offset += 1
    return tuple(runs)


def _split(bits: tuple[int, ...], group_size: int) -> LayerSplit:
    return LayerSplit(full=_runs(bits, 1), swa=_runs(bits, 0), group_size=group_size)


@dataclass(frozen=True)
class RunsOn:
    """Where a spec will run, for :meth:`HybridSpec.build`: the device and dtype ``auto`` picks a
    kernel for, and the model's shape and name the mask is checked against (None: not checked)."""

    device: Any = "cpu"
    dtype: Any = None
    shape: ModelShape | None = None
    model_name: str | None = None


@dataclass(frozen=True)
class HybridSpec:
    """What a hybrid model runs: mask, window and sinks, backend.

    Attributes:
        mask: the head mask as given (its own ``window``/``sinks`` fields may differ from
            ``local`` when they were overridden).
        local: the SWA groups' window W and sinks S.
        backend: a registered backend (``sdpa``, ``blocked``, ``flex``,
            ``flash_attention_2``, ...), never ``auto``.
        backend_reason: why this backend (``auto``'s choice, or "asked for"); not part of
            the value's identity.
        by_kind: each layer's heads permuted in the weights so that its full and its SWA
            groups are one run each (:mod:`bosch_eval.attention.head_order`); the mask stays
            in the model's order, the layout (:meth:`layout_split`) is the weights'.
    """

    mask: HeadMask
    local: LocalWindow
    backend: str
    backend_reason: str = field(default="asked for", compare=False)
    by_kind: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.mask, HeadMask):
            raise TypeError(f"HybridSpec.mask: expected a HeadMask, got {type(self.mask).__name__}")
        if not isinstance(self.local, LocalWindow):
            raise TypeError(f"HybridSpec.local: expected a LocalWindow, got {type(self.local).__name__}")
        if self.backend not in KERNELS:
            raise SettingsError(
                f"attn_backend: expected one of {list(KERNELS)} (a concrete backend), got {self.backend!r}"
            )

    @classmethod
    def build(
        cls,
        mask: HeadMask,
        window: int | None = None,
        sinks: int | None = None,
        backend: str = "auto",
        *,
        on: RunsOn = RunsOn(),
        source: str = "mask",
    ) -> HybridSpec:
        """Validate everything once and resolve ``auto`` for ``on``'s device and dtype.

        Args:
            window, sinks: W and S; default to the mask's own fields.
            on: where it runs; its shape is checked against the mask's (None: not checked here).
            source: how to name the mask in error messages (e.g. its file).

        Raises:
            MaskError: the mask does not fit ``shape``; no window; a bad window or sink count.
            SettingsError: an unknown backend, or one that cannot run on ``device``.
        """
        if on.shape is not None:
            mask.check_fits(on.shape, source=source, model=on.model_name)
        window = mask.window if window is None else window
        if window is None:
            raise MaskError(f"{source}: field 'window' is missing; pass window= explicitly")
        local = local_window(check_window(window), mask.sinks if sinks is None else sinks, "sink")
        choice = resolve_backend(backend, _device(on.device), on.dtype)
        return cls(mask, local, choice.name, choice.reason)

    def with_mask(self, mask: HeadMask, window: int | None = None, sinks: int | None = None) -> HybridSpec:
        """The same spec with another mask (search mode); window and sinks stay unless given.

        Raises:
            MaskError: the mask has another shape, or a bad window or sink count.
        """
        mask.check_fits(self.mask.shape, source="set_mask", model=self.mask.model)
        window = self.local.window if window is None else check_window(window)
        local = local_window(window, self.local.sinks if sinks is None else sinks, "sink")
        return dataclasses.replace(self, mask=mask, local=local)

    @property
    def window(self) -> int:
        return self.local.window

    @property
    def sinks(self) -> int:
        return self.local.sinks

    @property
    def kernels(self) -> Backend:
        return KERNELS[self.backend]

    def layer_split(self, layer: int) -> LayerSplit:
        """The head partition of ``layer`` in the model's head order (built once per spec)."""
        return self._splits[layer]

    def layout_split(self, layer: int) -> LayerSplit:
        """The head partition of ``layer`` in the weights' order: what the attention function
        and the cache read (:attr:`by_kind`: one run per kind)."""
        return self._layout_splits[layer]

    @functools.cached_property
    def group_orders(self) -> tuple[tuple[int, ...], ...]:
        """Per layer, the model's group at each position of the weights (identity unless
        :attr:`by_kind`)."""
        return tuple(head_order.by_kind(bits) if self.by_kind else tuple(range(len(bits))) for bits in self.mask.bits)

    def layout_bits(self, layer: int) -> tuple[int, ...]:
        """The mask's bits of ``layer`` in the weights' order."""
        bits = self.mask.bits[layer]
        return tuple(bits[group] for group in self.group_orders[layer])

    @functools.cached_property
    def _splits(self) -> tuple[LayerSplit, ...]:
        # cached_property writes the instance __dict__ directly, so it works on a frozen value.
        return tuple(_split(bits, self.mask.shape.group_size) for bits in self.mask.bits)

    @functools.cached_property
    def _layout_splits(self) -> tuple[LayerSplit, ...]:
        if not self.by_kind:
            return self._splits
        return tuple(
            _split(self.layout_bits(layer), self.mask.shape.group_size) for layer in range(len(self.mask.bits))
        )

    def same_layout(self, other: HybridSpec) -> bool:
        """True when a KV cache built for ``other`` holds what this spec reads: the same
        group split in every layer, the same head order and the same window and sinks."""
        return self is other or (
            self.mask.bits == other.mask.bits and self.local == other.local and self.by_kind == other.by_kind
        )


def _device(device: Any) -> Any:
    import torch

    return torch.device(device)
