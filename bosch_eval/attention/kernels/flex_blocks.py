"""FlexAttention block masks for hybrid layers, from block arithmetic, and their cache.

A ``BlockMask`` tells flex which ``128 × 128`` tiles of the score matrix hold any allowed
entry (the kernel runs ``mask_mod`` there) and which hold only allowed entries (it skips
``mask_mod``); every other tile is skipped, which is where an SWA head's O(T·W) comes from.
``create_block_mask`` finds the tiles by evaluating ``mask_mod`` on every (b, h, q, kv):
O(B·H·T·K) memory and time, in every layer of every forward (48 GiB at 32k tokens). Here
the tiles of the two kinds of heads come from interval arithmetic on the band
(:class:`~bosch_eval.attention.local_window.LocalWindow`), O((T/128)·(K/128)); the model's 4D mask,
when there is one, is reduced per tile once per forward. The ``mask_mod`` is still the
exact predicate, so a tile marked partial that holds no allowed entry costs time, never
correctness; a tile is marked full only when every entry is allowed.
"""

from __future__ import annotations

import inspect
from collections import OrderedDict
from typing import Any

import torch

from bosch_eval.attention.kernels.row_sinks import row_sinks
from bosch_eval.attention.local_window import LocalWindow

BLOCK = 128  # torch's default sparse block size (both axes)

Tiles = tuple[torch.Tensor, torch.Tensor]  # (any allowed, all allowed) per tile, boolean


def kind_tiles(q_len: int, kv_len: int, local: LocalWindow | None, device: torch.device, block: int = BLOCK) -> Tiles:
    """``[Qb, Kb]`` tiles of one kind of head: windowed by ``local``, or causal (None).

    Query ``i`` sits at key position ``p = kv_len − q_len + i``; key ``k`` is allowed iff
    ``k ≤ p`` and (``k < S`` or ``k > p − W``). For a tile of positions ``[p0, p1]`` and keys
    ``[k0, k1]``: some entry is allowed iff ``k0 ≤ p1`` and (``k1 ≥ p0 − W + 1`` or
    ``k0 < S``) — the union of the queries' windows is the interval ``[p0 − W + 1, p1]``;
    every entry is iff ``k1 ≤ p0`` and every key at or past S lies in the last query's
    window (``max(k0, S) > k1`` or ``max(k0, S) ≥ p1 − W + 1``). Tiles cut by the end of
    the sequence are never full (as ``create_block_mask`` pads them with masked entries).
    """
    offset = kv_len - q_len
    q_start = torch.arange(0, q_len, block, device=device)[:, None]
    k0 = torch.arange(0, kv_len, block, device=device)[None, :]
    p0, p1 = q_start + offset, (q_start + block).clamp(max=q_len) - 1 + offset
    k1 = (k0 + block).clamp(max=kv_len) - 1
    whole = ((q_start + block) <= q_len) & ((k0 + block) <= kv_len)
    if local is None:
        return k0 <= p1, (k1 <= p0) & whole
    window, sinks = local.window, local.sinks
    some = (k0 <= p1) & ((k1 >= p0 - window + 1) | (k0 < sinks))
    first_unsunk = k0.clamp(min=sinks)
    every = (k1 <= p0) & ((first_unsunk > k1) | (first_unsunk >= p1 - window + 1)) & whole
    return some, every


def mask_tiles(attention_mask: torch.Tensor, block: int = BLOCK) -> Tiles:
    """``[B, Qb, Kb]`` tiles of the model's boolean ``[B, 1, T, K]`` mask."""
    batch, _, q_len, kv_len = attention_mask.shape
    q_blocks, k_blocks = -(-q_len // block), -(-kv_len // block)
    padded = attention_mask[:, 0]
    if q_len % block or kv_len % block:  # a copy only where a tile is cut
        padded = torch.nn.functional.pad(padded, (0, k_blocks * block - kv_len, 0, q_blocks * block - q_len))
    tiles = padded.reshape(batch, q_blocks, block, k_blocks, block)
    return tiles.any(dim=4).any(dim=2), tiles.all(dim=4).all(dim=2)


def row_sink_tiles(
    q_len: int, kv_len: int, local: LocalWindow, sink_keys: torch.Tensor, device: torch.device, block: int = BLOCK
) -> Tiles:
    """``[B, 1, Qb, Kb]`` tiles of windowed heads whose sinks are each row's own
    (``sink_keys [B, K]``): a tile holds an allowed entry where the window reaches it, or
    where it holds a row's sink at or before its last query; it is full only where every
    query's window covers it (its sinks need ``mask_mod``)."""
    window_some, window_every = kind_tiles(q_len, kv_len, LocalWindow(local.window), device, block)
    k_blocks = -(-kv_len // block)
    sinks = (
        torch.nn.functional.pad(sink_keys.bool(), (0, k_blocks * block - kv_len))
        .view(sink_keys.shape[0], k_blocks, block)
        .any(dim=-1)
    )
    causal_some, _ = kind_tiles(q_len, kv_len, None, device, block)
    some = window_some | (causal_some & sinks[:, None, :])
    return some[:, None], window_every.expand_as(some)[:, None]


def head_tiles(
    q_len: int,
    kv_len: int,
    local: LocalWindow,
    swa_heads: tuple[bool, ...] | None,
    device: torch.device,
    sink_keys: torch.Tensor | None = None,
) -> Tiles:
    """``[B or 1, H or 1, Qb, Kb]`` tiles: per query head windowed (True) or causal (False);
    None: every head windowed. With ``sink_keys [B, K]`` the windowed heads' sinks are each
    row's own (:func:`row_sink_tiles`)."""
    if local.sinks and sink_keys is not None:
        band_some, band_every = row_sink_tiles(q_len, kv_len, local, sink_keys, device)
    else:
        band_some, band_every = (tiles[None, None] for tiles in kind_tiles(q_len, kv_len, local, device))
    if swa_heads is None:
        return band_some, band_every
    causal_some, causal_every = kind_tiles(q_len, kv_len, None, device)
    windowed = torch.tensor(swa_heads, device=device)[:, None, None]
    return torch.where(windowed, band_some, causal_some), torch.where(windowed, band_every, causal_every)


def _ordered(tiles: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Dense ``[..., Kb]`` tiles -> (count per row, column indices listed ones first), the
    layout ``BlockMask.from_kv_blocks`` takes."""
    counts = tiles.sum(dim=-1, dtype=torch.int32)
    indices = torch.argsort(tiles.to(torch.int8), dim=-1, descending=True, stable=True).to(torch.int32)
    return counts, indices


def _mask_mod(
    local: LocalWindow,
    offset: torch.Tensor,
    swa_heads: torch.Tensor | None,
    attention_mask: torch.Tensor | None,
    sink_keys: torch.Tensor | None,
) -> Any:
    band = local.mask_function(sink_keys)

    def mask_mod(b: torch.Tensor, h: torch.Tensor, q: torch.Tensor, kv: torch.Tensor) -> torch.Tensor:
        # A tensor offset, not an int: torch.compile guards on a captured int's value and
        # would compile again for every new number of cached keys.
        position = q + offset
        allowed = band(b, h, position, kv)
        if swa_heads is not None:
            allowed = torch.where(swa_heads[h], allowed, kv <= position)
        if attention_mask is not None:
            allowed = allowed & attention_mask[b, 0, q, kv]
        return allowed

    return mask_mod


def _from_kv_blocks() -> Any:
    from torch.nn.attention.flex_attention import BlockMask

    return BlockMask.from_kv_blocks


# seq_lengths arrived in torch 2.6; before it a BlockMask spans whole tiles.
_TAKES_SEQ_LENGTHS: bool | None = None


def block_mask_for(
    q_len: int,
    kv_len: int,
    local: LocalWindow,
    attention_mask: torch.Tensor | None,
    swa_heads: tuple[bool, ...] | None,
    device: torch.device,
    padding_tiles: Tiles | None = None,
) -> Any:
    """The ``BlockMask`` of one call: heads windowed by ``local`` (or causal where
    ``swa_heads`` says False), intersected with ``attention_mask`` (``[B, 1, T, K]`` bool);
    the windowed heads' sinks are each row's first S real keys, from that mask.

    Args:
        padding_tiles: :func:`mask_tiles` of ``attention_mask``, if already computed.
    """
    global _TAKES_SEQ_LENGTHS
    sink_keys = row_sinks(attention_mask, local)
    some, every = head_tiles(q_len, kv_len, local, swa_heads, device, sink_keys)  # [B or 1, H or 1, Qb, Kb]
    if attention_mask is not None:
        mask_some, mask_every = padding_tiles if padding_tiles is not None else mask_tiles(attention_mask)
        # Both allowed somewhere in a tile does not make their intersection non-empty; a
        # tile so marked is run and masked entry by entry: slower, never wrong.
        some, every = some & mask_some[:, None], every & mask_every[:, None]
    partial_counts, partial_indices = _ordered(some & ~every)
    full_counts, full_indices = _ordered(every)
    heads = torch.tensor(swa_heads, device=device) if swa_heads is not None else None
    offset = torch.tensor(kv_len - q_len, device=device)
    from_kv_blocks = _from_kv_blocks()
    if _TAKES_SEQ_LENGTHS is None:
        _TAKES_SEQ_LENGTHS = "seq_lengths" in inspect.signature(from_kv_blocks).parameters
    extra = {"seq_lengths": (q_len, kv_len)} if _TAKES_SEQ_LENGTHS else {}
    return from_kv_blocks(
        partial_counts, partial_indices, full_counts, full_indices, BLOCK_SIZE=BLOCK,
        mask_mod=_mask_mod(local, offset, heads, attention_mask, sink_keys), **extra,
    )  # fmt: skip


class _MaskEntries:
    """The block masks built on one 4D mask, and that mask's tiles (computed once)."""

    def __init__(self, mask: torch.Tensor) -> None:
        self.mask, self.tiles = mask, mask_tiles(mask)
        self.block_masks: dict[tuple[Any, ...], Any] = {}


class BlockMaskCache:
    """The block masks of one hybrid model, built once and reused.

    Keyed by (query length, key length, window and sinks, per-head pattern, device): every
    layer with the same pattern of SWA groups shares one. Without a 4D mask (no padding)
    they are reused across calls, the ``max_shapes`` most recent kept. With one, they hold
    that mask, which transformers builds once per forward and hands to every layer of a
    kind: they are reused across the layers of that forward, for the ``max_masks`` most
    recent masks (a model with sliding and full layers gets two per forward).

    Attributes:
        built: block masks built so far (tests read it).
    """

    def __init__(self, max_shapes: int = 32, max_masks: int = 2) -> None:
        self.max_shapes, self.max_masks = max_shapes, max_masks
        self.built = 0
        self._shared: OrderedDict[tuple[Any, ...], Any] = OrderedDict()
        # By the mask's id; each entry holds its mask, so an id is not reused while kept.
        self._by_mask: OrderedDict[int, _MaskEntries] = OrderedDict()

    def get(
        self,
        q_len: int,
        kv_len: int,
        local: LocalWindow,
        attention_mask: torch.Tensor | None,
        swa_heads: tuple[bool, ...] | None,
        device: torch.device,
    ) -> Any:
        key = (q_len, kv_len, local, swa_heads, str(device))
        if attention_mask is None:
            block_mask = self._shared.get(key)
            if block_mask is None:
                self.built += 1
                block_mask = self._shared[key] = block_mask_for(q_len, kv_len, local, None, swa_heads, device)
                while len(self._shared) > self.max_shapes:
                    self._shared.popitem(last=False)
            self._shared.move_to_end(key)
            return block_mask
        entries = self._by_mask.get(id(attention_mask))
        if entries is None:
            entries = self._by_mask[id(attention_mask)] = _MaskEntries(attention_mask)
            while len(self._by_mask) > self.max_masks:
                self._by_mask.popitem(last=False)
        self._by_mask.move_to_end(id(attention_mask))
        block_mask = entries.block_masks.get(key)
        if block_mask is None:
            self.built += 1
            block_mask = entries.block_masks[key] = block_mask_for(
                q_len, kv_len, local, attention_mask, swa_heads, device, padding_tiles=entries.tiles
            )
        return block_mask
