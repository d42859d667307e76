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
from typing import NamedTuple

import torch

from bosch_eval.caches.kv_quant.packing import Quantized

logger = logging.getLogger(__name__)

# Off when torch.compile is unavailable here (no C++ compiler / Triton); tests switch it.
enabled = True
# Why the compiled path was turned off (the first failure), for the log and for tests.
disabled_reason = ""


class StoredSide(NamedTuple):
    """One side (keys or values) of a layer's store: its full-precision rows and its packed ones."""

    full_precision: torch.Tensor  # [B, G, n_fp, D]
    packed: Quantized  # codes [B, G, n_q, D·bits/8], rows in event order; scale and zero below


class Positions(NamedTuple):
    """Where each stored position lives: its ``row`` in the full-precision or the quantized
    store, and whether it is ``quantized`` (both ``[seen]``)."""

    row: torch.Tensor
    quantized: torch.Tensor


class Packing(NamedTuple):
    """Constants of the compiled code: bits per code (2 or 4), channels per value scale, head dim."""

    bits: int
    group_size: int
    head_dim: int


def gather_dequantize(
    keys: StoredSide,
    values: StoredSide,
    positions: Positions,
    new_keys: torch.Tensor,
    new_values: torch.Tensor,
    packing: Packing,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``[B, G, seen + q, D]`` keys and values: stored positions in order, then the ``q`` new
    ones (``new_keys``, ``new_values``: ``[B, G, q, D]``, this step's states).

    Key scales and zeros are ``[B, G, E, 1, D]``, one per quantization event (``n_q / E`` rows)
    and channel; value scales and zeros ``[B, G, n_q, D / group_size]``.
    """
    quantized = positions.quantized
    q_row = torch.where(quantized, positions.row, 0)  # positions of the other kind read row 0, discarded below
    fp_row = torch.where(quantized, 0, positions.row)
    select = quantized[:, None]
    dtype = keys.full_precision.dtype
    seen_keys = torch.where(
        select, _dequantized_keys(keys.packed, q_row, packing, dtype), keys.full_precision[:, :, fp_row]
    )
    seen_values = torch.where(
        select, _dequantized_values(values.packed, q_row, packing, dtype), values.full_precision[:, :, fp_row]
    )
    return torch.cat([seen_keys, new_keys], dim=2), torch.cat([seen_values, new_values], dim=2)


def _digits(codes: torch.Tensor, q_row: torch.Tensor, bits: int, dtype: torch.dtype) -> torch.Tensor:
    """``[B, G, seen, D]``: the codes of each position's quantized row, unpacked."""
    shifts = torch.arange(0, 8, bits, dtype=torch.uint8, device=codes.device)
    return ((codes[:, :, q_row, :, None] >> shifts) & ((1 << bits) - 1)).flatten(-2).to(dtype)


def _dequantized_keys(packed: Quantized, q_row: torch.Tensor, packing: Packing, dtype: torch.dtype) -> torch.Tensor:
    """Keys are quantized per channel: one scale and zero per quantization event."""
    event = q_row // (packed.codes.shape[2] // packed.scale.shape[2])
    digits = _digits(packed.codes, q_row, packing.bits, dtype)
    return digits * packed.scale[:, :, event, 0].to(dtype) + packed.zero[:, :, event, 0].to(dtype)


def _dequantized_values(packed: Quantized, q_row: torch.Tensor, packing: Packing, dtype: torch.dtype) -> torch.Tensor:
    """Values are quantized per token: one scale and zero per ``group_size`` channels."""
    digits = _digits(packed.codes, q_row, packing.bits, dtype)
    grouped = digits.unflatten(-1, (packing.head_dim // packing.group_size, packing.group_size))  # [B, G, seen, D/g, g]
    dequantized = grouped * packed.scale[:, :, q_row, :, None].to(dtype) + packed.zero[:, :, q_row, :, None].to(dtype)
    return dequantized.flatten(-2)


@functools.cache
def _compiled(packing: Packing) -> Callable[..., tuple[torch.Tensor, torch.Tensor]]:
    # The packing is a constant of the compiled code, and only batch, groups and lengths are
    # dynamic (marked per call): under dynamic=True every int and size is symbolic and the
    # unpacking loops are not vectorized, measured 10-60x slower on CPU.
    def rebuild(
        keys: StoredSide, values: StoredSide, positions: Positions, new_keys: torch.Tensor, new_values: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        return gather_dequantize(keys, values, positions, new_keys, new_values, packing)

    return torch.compile(rebuild)


def compiled_rebuild(
    keys: StoredSide,
    values: StoredSide,
    positions: Positions,
    new_keys: torch.Tensor,
    new_values: torch.Tensor,
    packing: Packing,
) -> tuple[torch.Tensor, torch.Tensor] | None:
    """:func:`gather_dequantize` compiled, or ``None`` where it cannot run compiled (then the
    caller rebuilds eagerly; the first failure is logged and turns this path off)."""
    global enabled, disabled_reason
    if not enabled or torch._dynamo.config.disable:  # TORCHDYNAMO_DISABLE=1 would run the slow eager gather
        return None
    # Contiguous new states: their strides (views of the model's projections) would be guarded.
    new_keys, new_values = new_keys.contiguous(), new_values.contiguous()
    states = (keys.full_precision, *keys.packed, values.full_precision, *values.packed, new_keys, new_values)
    if torch.is_grad_enabled() and any(t.requires_grad for t in states):
        return None  # a backward through the cache: the eager rebuild keeps autograd's graph
    # What varies between calls: batch, groups (a hybrid layer's full-attention groups differ by
    # layer) and lengths; the head dim and the packed bytes are fixed for one model.
    for tensor in states:
        for dim in (0, 1, 2):  # "maybe": a size of 0 or 1 stays specialized, one more compile
            torch._dynamo.maybe_mark_dynamic(tensor, dim)
    for tensor in positions:
        torch._dynamo.maybe_mark_dynamic(tensor, 0)
    try:
        # Each (dtype, bits, group size, head dim, sizes of 0 or 1) is one compile of the same
        # code: a few per model, more across a test suite, so a higher limit than dynamo's 8;
        # past it, fail (and fall back below) rather than let dynamo run the slow eager gather.
        # Automatic dynamic shapes are off: the compiles of all head dims share one code object,
        # so a second head dim made dynamo recompile with the head dim symbolic (the slow
        # unvectorized loop), and such recompiles failed intermittently in its guard building
        # ("sources must not be empty for symbol ...", torch 2.13; seen in CI).
        patch = torch._dynamo.config.patch(
            recompile_limit=64, fail_on_recompile_limit_hit=True, automatic_dynamic_shapes=False
        )
        with torch.no_grad(), patch:
            return _compiled(packing)(keys, values, positions, new_keys, new_values)
    except Exception as err:  # noqa: BLE001 - any compiler failure (no g++, no Triton) leaves the eager rebuild
        enabled = False
        disabled_reason = f"{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ''}"
        logger.warning(
            "kv_quant: torch.compile of the fused dequantization failed (%s); rebuilding with eager "
            "PyTorch instead (same values, slower decode)",
            disabled_reason,
        )
        return None
