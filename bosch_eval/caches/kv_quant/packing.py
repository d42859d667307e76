"""Asymmetric min/max quantization to 2 or 4 bits, packed into ``uint8``.

Keys are quantized per channel (one scale and zero point per channel over a chunk of
tokens), values per token (one scale and zero point per ``group_size`` channels of one
token), as KIVI does: key outliers sit in fixed channels, value errors should stay local
to a token. Codes are ``round((x − min) / scale)`` in ``[0, 2^bits − 1]``, so the
dequantization error of any element is at most ``scale / 2`` (half a step).

Packed by hand: ``8 / bits`` codes per byte along the last (channel) axis.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

BITS = (2, 4)


class Quantized(NamedTuple):
    """Packed codes ``[..., n, D·bits/8]`` (uint8) with ``scale``/``zero`` broadcastable
    against the unpacked ``[..., n, D]`` (after the reshape ``unpack`` applies)."""

    codes: torch.Tensor
    scale: torch.Tensor
    zero: torch.Tensor


def pack(codes: torch.Tensor, bits: int) -> torch.Tensor:
    """``[..., D]`` integer codes in ``[0, 2^bits)`` → ``[..., D·bits/8]`` uint8."""
    per_byte = 8 // bits
    grouped = codes.to(torch.uint8).unflatten(-1, (-1, per_byte))  # [..., D/per_byte, per_byte]
    shifts = torch.arange(0, 8, bits, dtype=torch.uint8, device=codes.device)
    return (grouped << shifts).sum(dim=-1, dtype=torch.uint8)


def unpack(packed: torch.Tensor, bits: int) -> torch.Tensor:
    """Inverse of :func:`pack`: ``[..., D·bits/8]`` uint8 → ``[..., D]`` uint8 codes."""
    shifts = torch.arange(0, 8, bits, dtype=torch.uint8, device=packed.device)
    mask = (1 << bits) - 1
    return ((packed[..., None] >> shifts) & mask).flatten(-2)


def _quantize(x: torch.Tensor, lo: torch.Tensor, hi: torch.Tensor, bits: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Codes and scale for ``x`` between ``lo`` and ``hi`` (broadcast); a constant slice
    gets scale 1 so it dequantizes exactly to ``lo``."""
    levels = (1 << bits) - 1
    scale = (hi - lo) / levels
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))
    codes = torch.clamp(torch.round((x - lo) / scale), 0, levels)
    return codes, scale


def quantize_keys(keys: torch.Tensor, bits: int) -> Quantized:
    """Per-channel quantization of ``keys [..., n, D]``: one scale per channel over the n tokens.

    Returns scale/zero of shape ``[..., 1, D]``.
    """
    x = keys.float()
    lo, hi = x.amin(dim=-2, keepdim=True), x.amax(dim=-2, keepdim=True)
    codes, scale = _quantize(x, lo, hi, bits)
    return Quantized(pack(codes, bits), scale.to(keys.dtype), lo.to(keys.dtype))


def quantize_values(values: torch.Tensor, bits: int, group_size: int) -> Quantized:
    """Per-token quantization of ``values [..., n, D]`` in groups of ``group_size`` channels.

    Returns scale/zero of shape ``[..., n, D / group_size]``.
    """
    x = values.float().unflatten(-1, (-1, group_size))  # [..., n, D/g, g]
    lo, hi = x.amin(dim=-1, keepdim=True), x.amax(dim=-1, keepdim=True)
    codes, scale = _quantize(x, lo, hi, bits)
    return Quantized(pack(codes.flatten(-2), bits), scale[..., 0].to(values.dtype), lo[..., 0].to(values.dtype))


def dequantize_keys(q: Quantized, bits: int, dtype: torch.dtype, out: torch.Tensor | None = None) -> torch.Tensor:
    """``[..., n, D]`` keys back from per-channel codes (scale/zero ``[..., 1, D]``), written
    into ``out`` when given (a view of the cache's output: one full-size pass less)."""
    return torch.addcmul(q.zero.to(dtype), unpack(q.codes, bits).to(dtype), q.scale.to(dtype), out=out)


def dequantize_values(q: Quantized, bits: int, dtype: torch.dtype, out: torch.Tensor | None = None) -> torch.Tensor:
    """``[..., n, D]`` values back from per-token group codes (scale/zero ``[..., n, D/g]``),
    written into ``out`` when given."""
    codes = unpack(q.codes, bits).to(dtype)
    grouped = codes.unflatten(-1, (q.scale.shape[-1], -1))  # [..., n, D/g, g]
    target = None if out is None else out.unflatten(-1, grouped.shape[-2:])
    return torch.addcmul(q.zero[..., None].to(dtype), grouped, q.scale[..., None].to(dtype), out=target).flatten(-2)
