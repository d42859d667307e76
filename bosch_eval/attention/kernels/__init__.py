"""The SWA kernels: one signature, one module per backend, each registering itself.

Every kernel computes windowed attention (:class:`~bosch_eval.attention.local_window.LocalWindow`:
window and sinks, one band predicate) for all the query heads it is handed::

    kernel(module, query [B, H, T, D], key [B, G, K, D], value [B, G, K, Dv],
           attention_mask, local: LocalWindow, **kwargs) -> [B, T, H, Dv]

``kwargs`` are transformers' (``scaling``, ``dropout``, ...). Queries are the last T of the
K keys. A :class:`Backend` (:mod:`.backend`) pairs it with the full-attention kernel of the
same family, the mask format transformers must build for it, optionally a whole-layer kernel
that runs a mixed layer (full and SWA groups) in one call (taking a :class:`LayerPattern` where
``local`` stands), and optionally a per-model cache
that the hybrid model owns and hands its kernels as ``kernel_cache=`` (flex: its block masks).

A backend is one module in this package holding its kernel and one line (``reference``,
``blocked``, ``flex``, ``flash``; docs/extending.md)::

    BACKENDS.register("mine", Backend(swa=my_swa_kernel))

``attn_backend=mine`` then finds it: a name the registry does not know yet imports the
package's modules first.
"""

from __future__ import annotations

# Re-exported: members and callers import the registry from the package.
from bosch_eval.attention.kernels.backend import BACKENDS, Backend, LayerPattern, SwaKernel

__all__ = ["BACKENDS", "Backend", "LayerPattern", "SwaKernel"]
