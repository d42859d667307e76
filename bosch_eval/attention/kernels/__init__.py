"""The registry of SWA kernels: one signature, one entry per backend.

Every kernel computes windowed attention (:class:`~bosch_eval.attention.local_window.LocalWindow`:
window and sinks, one band predicate) for all the query heads it is handed::

    kernel(module, query [B, H, T, D], key [B, G, K, D], value [B, G, K, Dv],
           attention_mask, local: LocalWindow, **kwargs) -> [B, T, H, Dv]

``kwargs`` are transformers' (``scaling``, ``dropout``, ...). Queries are the last T of the
K keys. A :class:`Backend` pairs it with the full-attention kernel of the same family, the
mask format transformers must build for it, optionally a whole-layer kernel that runs a
mixed layer (full and SWA groups) in one call, and optionally a per-model cache that the
hybrid model owns and hands its kernels as ``kernel_cache=`` (flex: its block masks).

Adding a backend is one new module in this package, holding its kernel and one line::

    BACKENDS.register("mine", Backend(swa=my_swa_kernel))

``attn_backend=mine`` then finds it: a name the registry does not know yet imports the
package's modules first.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from bosch_eval.attention.kernels.blocked import blocked_swa_attention
from bosch_eval.attention.kernels.flash import flash_full_attention, flash_swa_attention, flash_unavailable
from bosch_eval.attention.kernels.flex import flex_hybrid_layer, flex_swa_attention, flex_unavailable
from bosch_eval.attention.kernels.flex_blocks import BlockMaskCache
from bosch_eval.attention.kernels.reference import masked_swa_attention, sdpa_full_attention
from bosch_eval.runtime.registry import Registry

SwaKernel = Callable[..., torch.Tensor]


@dataclass(frozen=True)
class Backend:
    """One attention backend.

    Attributes:
        swa: the windowed kernel (the signature above).
        full: causal attention for the full groups, in the same family.
        mask_format: ``"sdpa"`` (a 4D mask or None) or ``"flash"`` (``[B, K]`` padding or None).
        layer: a mixed layer in one call, ``layer(..., local, swa_groups=[bool per group])``.
        unavailable: why it cannot run on a device (None: it can).
        cache: makes the per-model state its ``swa``/``layer`` kernels take as
            ``kernel_cache=`` (None: they take none).
    """

    swa: SwaKernel
    full: SwaKernel = sdpa_full_attention
    mask_format: str = "sdpa"
    layer: SwaKernel | None = None
    unavailable: Callable[[torch.device], str | None] = lambda device: None
    cache: Callable[[], Any] | None = None


# ``attn_backend=name`` runs ``BACKENDS[name]``.
BACKENDS: Registry[Backend] = Registry("attention backend", package=__name__, field="attn_backend")

BACKENDS.register("sdpa", Backend(swa=masked_swa_attention))
BACKENDS.register("blocked", Backend(swa=blocked_swa_attention))
BACKENDS.register("flex", Backend(swa=flex_swa_attention, layer=flex_hybrid_layer, unavailable=flex_unavailable, cache=BlockMaskCache))
BACKENDS.register("flash_attention_2", Backend(swa=flash_swa_attention, full=flash_full_attention, mask_format="flash", unavailable=flash_unavailable))
