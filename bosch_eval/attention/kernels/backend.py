"""What an attention backend is (:class:`Backend`) and the registry of them (:data:`BACKENDS`).

Every backend's module registers itself here as it is imported, so this module imports none
of them: the registry imports the package's modules the first time a name is missing or the
names are listed.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from bosch_eval.attention.kernels.sdpa_full import sdpa_full_attention
from bosch_eval.masks.window import LocalWindow
from bosch_eval.runtime.registry import Registry

SwaKernel = Callable[..., torch.Tensor]


@dataclass(frozen=True)
class LayerPattern:
    """What a whole-layer kernel attends by: which KV groups are windowed, and their window.

    Attributes:
        local: the SWA groups' window and sinks.
        swa_groups: per KV group of the layer, True = windowed by ``local``, False = full causal.
    """

    local: LocalWindow
    swa_groups: tuple[bool, ...]


@dataclass(frozen=True)
class Backend:
    """One attention backend.

    Attributes:
        swa: the windowed kernel (the signature in :mod:`bosch_eval.attention.kernels`).
        full: causal attention for the full groups, in the same family.
        mask_format: ``"sdpa"`` (a 4D mask or None) or ``"flash"`` (``[B, K]`` padding or None).
        layer: a mixed layer in one call, ``layer(module, query, key, value, mask, pattern, ...)``
            with a :class:`LayerPattern` where the SWA kernel takes its ``local``.
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


# ``attn_backend=name`` runs ``BACKENDS[name]``. The built-in modules go first so the names are
# listed in this order (``attn_backend``'s choices, the GPU check's runs), new ones after them.
BACKENDS: Registry[Backend] = Registry(
    "attention backend",
    package="bosch_eval.attention.kernels",
    first=("reference", "blocked", "flex", "flash"),
    field="attn_backend",
)
