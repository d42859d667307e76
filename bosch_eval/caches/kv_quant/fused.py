"""A decode step's keys and values rebuilt from the quantized store in one compiled pass.

The store's eager rebuild (unpack, dequantize, scatter into the original positions) makes
several full-length passes over temporaries: at T = 8192 it costs 4–8× the unquantized
cache's per-step ``cat``, so a 2-bit cache decoded slower than a 32-bit one
(``benchmarks/kv_quant_decode_step.py``). Written instead as a gather per output position
(take the position's row from the full-precision store or from the codes, dequantize it)
and compiled with ``torch.compile`` (Inductor: C++/OpenMP on CPU, Triton on CUDA), every
output element is produced once, straight from the packed bytes, in a single loop. The
same formulation run eagerly is far slower than the store's own rebuild (indexing with
64-bit gathers over every channel), so without a compiler the store keeps its eager path.

Values equal the eager rebuild up to floating-point rounding of ``codes·scale + zero``
(a fused multiply-add); full-precision positions are copied exactly.
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Callable

import torch

logger = logging.getLogger(__name__)

# Off when torch.compile is unavailable here (no C++ compiler / Triton); tests switch it.
enabled = True
# Why the compiled path was turned off (the first failure), for the log and for tests.
disabled_reason = ""


def gather_dequantize(
    fp_keys: torch.Tensor,
    fp_values: torch.Tensor,
    key_codes: torch.Tensor,
    key_scale: torch.Tensor,
    key_zero: torch.Tensor,
    value_codes: torch.Tensor,
    value_scale: torch.Tensor,
    value_zero: torch.Tensor,
    row: torch.Tensor,
    quantized: torch.Tensor,
    new_keys: torch.Tensor,
    new_values: torch.Tensor,
    bits: int,
    group_size: int,
    head_dim: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``[B, G, seen + q, D]`` keys and values: stored positions in order, then the ``q`` new ones.

    Args:
        fp_keys, fp_values: ``[B, G, n_fp, D]`` full-precision rows.
        key_codes, value_codes: ``[B, G, n_q, D·bits/8]`` packed codes, rows in event order.
        key_scale, key_zero: ``[B, G, E, 1, D]``, one per event (``n_q / E`` rows) and channel.
        value_scale, value_zero: ``[B, G, n_q, D / group_size]``.
        row: ``[seen]`` each position's row in the full-precision or the quantized store.
        quantized: ``[seen]`` whether the position is stored quantized.
        new_keys, new_values: ``[B, G, q, D]`` this step's states.
        bits: 2 or 4.
        group_size: channels per value scale.
        head_dim: ``D``.
    """
    dtype = fp_keys.dtype
    shifts = torch.arange(0, 8, bits, dtype=torch.uint8, device=key_codes.device)
    levels = (1 << bits) - 1
    q_row = torch.where(quantized, row, 0)  # positions of the other kind read row 0, discarded below
    fp_row = torch.where(quantized, 0, row)
    select = quantized[:, None]

    key_digits = ((key_codes[:, :, q_row, :, None] >> shifts) & levels).flatten(-2).to(dtype)  # [B, G, seen, D]
    event = q_row // (key_codes.shape[2] // key_scale.shape[2])
    keys = torch.where(select, key_digits * key_scale[:, :, event, 0].to(dtype) + key_zero[:, :, event, 0].to(dtype), fp_keys[:, :, fp_row])

    value_digits = ((value_codes[:, :, q_row, :, None] >> shifts) & levels).flatten(-2).to(dtype)
    grouped = value_digits.unflatten(-1, (head_dim // group_size, group_size))  # [B, G, seen, D/g, g]
    dequantized = grouped * value_scale[:, :, q_row, :, None].to(dtype) + value_zero[:, :, q_row, :, None].to(dtype)
    values = torch.where(select, dequantized.flatten(-2), fp_values[:, :, fp_row])
    return torch.cat([keys, new_keys], dim=2), torch.cat([values, new_values], dim=2)


@functools.cache
def _compiled(bits: int, group_size: int, head_dim: int) -> Callable[..., tuple[torch.Tensor, torch.Tensor]]:
    # ``bits``, ``group_size`` and the head dim are constants of the compiled code, and only
    # batch, groups and lengths are dynamic (marked per call): under dynamic=True every int and size is
    # symbolic and the unpacking loops are not vectorized, measured 10-60x slower on CPU.
    def rebuild(*tensors: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return gather_dequantize(*tensors, bits=bits, group_size=group_size, head_dim=head_dim)

    return torch.compile(rebuild)


# The dims of each argument of gather_dequantize that vary between calls: batch, groups (a
# hybrid layer's full-attention groups differ by layer) and lengths. The rest (head dim,
# packed bytes) are fixed for one model.
_VARYING_DIMS = ((0, 1, 2),) * 8 + ((0,), (0,), (0, 1, 2), (0, 1, 2))


def compiled_rebuild(*tensors: torch.Tensor, bits: int, group_size: int) -> tuple[torch.Tensor, torch.Tensor] | None:
    """:func:`gather_dequantize` compiled, or ``None`` where it cannot run compiled (then the
    caller rebuilds eagerly; the first failure is logged and turns this path off)."""
    global enabled, disabled_reason
    if not enabled or torch._dynamo.config.disable:  # TORCHDYNAMO_DISABLE=1 would run the slow eager gather
        return None
    if torch.is_grad_enabled() and any(t.requires_grad for t in tensors):
        return None  # a backward through the cache: the eager rebuild keeps autograd's graph
    # Contiguous new states: their strides (views of the model's projections) would be guarded.
    tensors = (*tensors[:-2], tensors[-2].contiguous(), tensors[-1].contiguous())
    for tensor, dims in zip(tensors, _VARYING_DIMS, strict=True):
        for dim in dims:  # "maybe": a size of 0 or 1 stays specialized, one more compile
            torch._dynamo.maybe_mark_dynamic(tensor, dim)
    try:
        # Each (dtype, bits, group size, head dim, sizes of 0 or 1) is one compile of the same
        # code: a few per model, more across a test suite, so a higher limit than dynamo's 8;
        # past it, fail (and fall back below) rather than let dynamo run the slow eager gather.
        # Automatic dynamic shapes are off: the compiles of all head dims share one code object,
        # so a second head dim made dynamo recompile with the head dim symbolic (the slow
        # unvectorized loop), and such recompiles failed intermittently in its guard building
        # ("sources must not be empty for symbol ...", torch 2.13; seen in CI).
        patch = torch._dynamo.config.patch(recompile_limit=64, fail_on_recompile_limit_hit=True, automatic_dynamic_shapes=False)
        with torch.no_grad(), patch:
            return _compiled(bits, group_size, tensors[0].shape[-1])(*tensors)
    except Exception as err:  # noqa: BLE001 - any compiler failure (no g++, no Triton) leaves the eager rebuild
        enabled = False
        disabled_reason = f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"
        logger.warning("kv_quant: torch.compile of the fused dequantization failed (%s); rebuilding with eager "
                       "PyTorch instead (same values, slower decode)", disabled_reason)
        return None
