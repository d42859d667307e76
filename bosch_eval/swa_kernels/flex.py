"""FlexAttention kernels (``torch.nn.attention.flex_attention``): the band predicate of
:class:`~bosch_eval.local_window.LocalWindow` is the ``mask_mod``, so a hybrid layer — full
heads causal, SWA heads windowed with sinks, the model's padding on top — is one call.

Compiled with ``torch.compile`` where a probe compile succeeds (Inductor: C++ on CPU,
Triton on CUDA); otherwise flex runs eagerly (exact, but it materializes the scores), with
the reason logged once. Set ``compile_policy`` to ``False`` to force eager (tests, or to
avoid a compile per new sequence length on CPU).
"""

from __future__ import annotations

import functools
import logging
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import torch

from bosch_eval.local_window import LocalWindow, causal

logger = logging.getLogger("bosch_eval")

# None: compile if the probe compiles; True/False: force.
compile_policy: bool | None = None
# Why compiled flex is off here (the probe's failure), for the log and for tests.
disabled_reason = ""


@functools.cache
def _compiled_flex() -> Callable[..., torch.Tensor] | None:
    """``torch.compile(flex_attention)`` if a tiny call compiles and runs here, else None."""
    global disabled_reason
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    compiled = torch.compile(flex_attention, dynamic=False)
    q = torch.randn(1, 1, 16, 16)
    try:
        block_mask = create_block_mask(causal, None, None, 16, 16, device="cpu")
        compiled(q, q, q, block_mask=block_mask)
    except Exception as err:  # noqa: BLE001 - any compiler failure (no C++ compiler, no Triton) leaves eager flex
        disabled_reason = f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"
        logger.warning("flex: torch.compile of flex_attention failed here (%s); running it eagerly (exact, slower)", disabled_reason)
        return None
    return compiled


def _flex_function() -> Callable[..., torch.Tensor]:
    if compile_policy is False:
        return _eager_flex
    compiled = _compiled_flex()
    if compiled is None:
        if compile_policy:
            raise RuntimeError(f"flex: compile_policy=True, but torch.compile of flex_attention fails here ({disabled_reason})")
        return _eager_flex
    return compiled


def _eager_flex(*args: Any, **kwargs: Any) -> torch.Tensor:
    from torch.nn.attention.flex_attention import flex_attention

    with warnings.catch_warnings():
        # Eager is chosen on purpose here (logged once above); flex warns on every call.
        warnings.filterwarnings("ignore", message="flex_attention called without torch.compile")
        return flex_attention(*args, **kwargs)


def flex_attention_layer(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    local: LocalWindow,
    swa_groups: Sequence[bool] | None = None,
    scaling: float | None = None,
) -> torch.Tensor:
    """One flex call over every head.

    Args:
        query: ``[B, H, T, D]``, the last T of the K keys; key, value: ``[B, G, K, D]``.
        attention_mask: the model's boolean ``[B, 1, T, K]`` mask, or None.
        swa_groups: per KV group, True = windowed (``local``), False = full causal;
            None: every group windowed.

    Returns:
        ``[B, T, H, Dv]``.
    """
    from torch.nn.attention.flex_attention import create_block_mask

    if attention_mask is not None and attention_mask.dtype != torch.bool:
        raise TypeError("flex SWA expects a boolean attention mask (the sdpa mask format)")
    batch, heads, q_len, _ = query.shape
    kv_len, device = key.shape[2], query.device
    offset = kv_len - q_len
    band = local.mask_function()
    full_heads = None
    if swa_groups is not None:
        per_group = heads // key.shape[1]
        full_heads = torch.tensor([not swa for swa in swa_groups], device=device).repeat_interleave(per_group)

    def mask_mod(b: torch.Tensor, h: torch.Tensor, q: torch.Tensor, kv: torch.Tensor) -> torch.Tensor:
        position = q + offset  # flex counts queries from 0; the band counts them among the keys
        allowed = band(b, h, position, kv)
        if full_heads is not None:
            allowed = allowed | (full_heads[h] & causal(b, h, position, kv))
        if attention_mask is not None:
            allowed = allowed & attention_mask[b, 0, q, kv]
        return allowed

    block_mask = create_block_mask(
        mask_mod,
        batch if attention_mask is not None else None,
        heads if full_heads is not None else None,
        q_len,
        kv_len,
        device=device,
    )
    out = _flex_function()(query, key, value, block_mask=block_mask, scale=scaling, enable_gqa=key.shape[1] != heads)
    return out.transpose(1, 2)


def flex_swa_attention(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    local: LocalWindow,
    **kwargs: Any,
) -> torch.Tensor:
    """The registered SWA kernel: every head handed is windowed."""
    return flex_attention_layer(query, key, value, attention_mask, local, scaling=kwargs.get("scaling"))


def flex_hybrid_layer(
    module: torch.nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    local: LocalWindow,
    swa_groups: Sequence[bool],
    **kwargs: Any,
) -> torch.Tensor:
    """The registered whole-layer kernel: full and SWA groups in one call."""
    return flex_attention_layer(query, key, value, attention_mask, local, swa_groups, scaling=kwargs.get("scaling"))
