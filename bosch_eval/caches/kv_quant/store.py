"""Keys and values of some KV groups of one layer: full precision where the selector says,
packed low-bit everywhere else.

Append-only: a token is quantized once, on the event that releases it from the
full-precision set, and never touched again (the reference implementation re-quantizes
the whole older span each time the window rolls). Each event releases ``W`` tokens; their
keys get one scale per channel over those ``W`` tokens, their values one scale per token
and ``group_size`` channels (:mod:`bosch_eval.caches.kv_quant.packing`).

What a step attends to: every earlier position, dequantized where it is stored quantized,
in position order (keys keep the RoPE they were cached with; padding masks line up),
followed by the step's own new states at full precision. The store is compressed only
after the step, so a prefill attends at full precision and a one-token decode step sees
the compressed past plus itself (transformers' ``QuantizedLayer`` does the same).
"""

from __future__ import annotations

import torch

from bosch_eval.caches.kv_quant.config import KVQuantConfig
from bosch_eval.caches.kv_quant.fused import Packing, Positions, StoredSide, compiled_rebuild
from bosch_eval.caches.kv_quant.packing import (
    Quantized,
    dequantize_keys,
    dequantize_values,
    quantize_keys,
    quantize_values,
)
from bosch_eval.caches.kv_quant.selection import Selector


class QuantizedKVStore:
    """``[B, G, ·, D]`` keys and values of one layer's groups of one kind.

    Args:
        config: the quantization settings.
        selector: the cache's shared selector (positions are the same for every layer).
    """

    def __init__(self, config: KVQuantConfig, selector: Selector) -> None:
        self.config, self.selector = config, selector
        self.reset()

    def reset(self) -> None:
        """Drop every stored state; the shared selector starts over too (a cache resets all
        its layers together)."""
        self.selector.reset()
        self.seen = 0
        self.applied_events = 0
        self.fp_keys: torch.Tensor | None = None  # [B, G, n_fp, D], ascending positions
        self.fp_values: torch.Tensor | None = None
        self.fp_positions = torch.zeros(0, dtype=torch.long)
        self.key_codes: torch.Tensor | None = None  # [B, G, n_q, D·bits/8] uint8
        self.key_scale: torch.Tensor | None = None  # [B, G, E, 1, D]: per event and channel
        self.key_zero: torch.Tensor | None = None
        self.value_codes: torch.Tensor | None = None  # [B, G, n_q, D·bits/8] uint8
        self.value_scale: torch.Tensor | None = None  # [B, G, n_q, D / group_size]
        self.value_zero: torch.Tensor | None = None
        self.quantized_positions = torch.zeros(0, dtype=torch.long)  # [n_q], in event order

    def update(self, keys: torch.Tensor, values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Append ``[B, G, q, D]`` new states; return what this step attends to, then compress."""
        if self.fp_keys is None:
            seen_keys, seen_values = keys, values
        elif self.key_codes is None:  # nothing quantized yet: exactly the unquantized cache's tensors
            seen_keys, seen_values = (
                torch.cat([self.fp_keys, keys], dim=-2),
                torch.cat([self.fp_values, values], dim=-2),
            )
        else:
            seen_keys, seen_values = self._rebuild(keys, values)
        self._append(keys, values)
        return seen_keys, seen_values

    def past(self) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """Every stored position in order, quantized ones dequantized (``None`` when empty)."""
        if self.fp_keys is None or self.key_codes is None:
            return self.fp_keys, self.fp_values
        return self._rebuild(self.fp_keys[:, :, :0], self.fp_values[:, :, :0])

    def _rebuild(self, keys: torch.Tensor, values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Every stored position in order (dequantized where quantized), then the ``[B, G, q, D]``
        new ``keys``/``values``: one compiled pass (:mod:`bosch_eval.caches.kv_quant.fused`) where
        torch.compile works, else the eager rebuild."""
        device = self.fp_keys.device
        fp_index, q_index = self.fp_positions.to(device), self.quantized_positions.to(device)
        row = torch.empty(self.seen, dtype=torch.long, device=device)
        row[fp_index] = torch.arange(fp_index.shape[0], device=device)
        row[q_index] = torch.arange(q_index.shape[0], device=device)
        quantized = torch.zeros(self.seen, dtype=torch.bool, device=device)
        quantized[q_index] = True
        fused = compiled_rebuild(
            StoredSide(self.fp_keys, Quantized(self.key_codes, self.key_scale, self.key_zero)),
            StoredSide(self.fp_values, Quantized(self.value_codes, self.value_scale, self.value_zero)),
            Positions(row, quantized),
            keys,
            values,
            Packing(self.config.bits, self.config.group_size, self.fp_keys.shape[-1]),
        )
        if fused is not None:
            return fused
        seen_keys, seen_values = self._expand(extra=keys.shape[-2])
        seen_keys[:, :, self.seen :], seen_values[:, :, self.seen :] = keys, values
        return seen_keys, seen_values

    def _expand(self, extra: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The eager rebuild: ``[B, G, seen + extra, D]`` keys and values, positions ``< seen``
        filled (dequantized where quantized), the last ``extra`` left for the caller."""
        b, g, _, d = self.fp_keys.shape
        dtype, bits = self.fp_keys.dtype, self.config.bits
        events = self.key_scale.shape[2]
        key_codes = self.key_codes.unflatten(2, (events, -1))  # [B, G, E, W, D·bits/8]
        keys_q = Quantized(key_codes, self.key_scale, self.key_zero)
        values_q = Quantized(self.value_codes, self.value_scale, self.value_zero)
        out_keys = self.fp_keys.new_empty(b, g, self.seen + extra, d)
        out_values = self.fp_values.new_empty(b, g, self.seen + extra, d)
        device = out_keys.device
        fp_index, q_index = self.fp_positions.to(device), self.quantized_positions.to(device)
        out_keys.index_copy_(2, fp_index, self.fp_keys)
        out_values.index_copy_(2, fp_index, self.fp_values)
        n_q = q_index.shape[0]
        if self.selector.rule.oldest_first:  # the oldest positions, in order (KiVi): straight into place
            dequantize_keys(keys_q, bits, dtype, out=out_keys[:, :, :n_q].unflatten(2, (events, -1)))
            dequantize_values(values_q, bits, dtype, out=out_values[:, :, :n_q])
        else:
            out_keys.index_copy_(2, q_index, dequantize_keys(keys_q, bits, dtype).flatten(2, 3))
            out_values.index_copy_(2, q_index, dequantize_values(values_q, bits, dtype))
        return out_keys, out_values

    def _append(self, keys: torch.Tensor, values: torch.Tensor) -> None:
        new_positions = torch.arange(self.seen, self.seen + keys.shape[-2])
        # A copy of its own: the new states may be a view of the model's (e.g. the SWA groups' too).
        fp_keys = keys.clone() if self.fp_keys is None else torch.cat([self.fp_keys, keys], dim=-2)
        fp_values = values.clone() if self.fp_values is None else torch.cat([self.fp_values, values], dim=-2)
        fp_positions = torch.cat([self.fp_positions, new_positions])
        self.seen += keys.shape[-2]
        self.selector.advance_to(self.seen)
        new_events = self.selector.events[self.applied_events :]
        if new_events:
            device = fp_keys.device
            released = torch.stack(new_events)  # [E_new, W]
            rows = torch.searchsorted(fp_positions, released).to(device)
            self._quantize(fp_keys[:, :, rows], fp_values[:, :, rows.flatten()])
            self.quantized_positions = torch.cat([self.quantized_positions, released.flatten()])
            self.applied_events = len(self.selector.events)
            keep = self.selector.full_precision_positions()
            rows = torch.searchsorted(fp_positions, keep).to(device)
            fp_keys, fp_values, fp_positions = fp_keys[:, :, rows], fp_values[:, :, rows], keep
        self.fp_keys, self.fp_values, self.fp_positions = fp_keys, fp_values, fp_positions

    def _quantize(self, keys: torch.Tensor, values: torch.Tensor) -> None:
        """Quantize released ``keys [B, G, E, W, D]`` (per event and channel) and ``values
        [B, G, E·W, D]`` (per token and channel group), appending to the packed store."""
        bits = self.config.bits
        k = quantize_keys(keys, bits)
        v = quantize_values(values, bits, self.config.group_size)
        k_codes = k.codes.flatten(2, 3)

        def cat(old: torch.Tensor | None, new: torch.Tensor) -> torch.Tensor:
            return new if old is None else torch.cat([old, new], dim=2)

        self.key_codes, self.key_scale, self.key_zero = (
            cat(self.key_codes, k_codes),
            cat(self.key_scale, k.scale),
            cat(self.key_zero, k.zero),
        )
        self.value_codes = cat(self.value_codes, v.codes)
        self.value_scale, self.value_zero = cat(self.value_scale, v.scale), cat(self.value_zero, v.zero)

    def tensors(self) -> list[torch.Tensor]:
        """Every tensor holding keys or values (full-precision, codes, scales, zero points)."""
        fields = (self.fp_keys, self.fp_values, self.key_codes, self.key_scale, self.key_zero,
                  self.value_codes, self.value_scale, self.value_zero)  # fmt: skip
        return [t for t in fields if t is not None]

    def stored_bytes(self) -> int:
        """Bytes of keys and values held (position indices excluded: they follow from the
        token count alone and are shared by every layer)."""
        return sum(t.numel() * t.element_size() for t in self.tensors())

    def map_batch(self, fn: object) -> None:
        """Apply ``fn`` (a batch reindexing) to every stored tensor."""
        for name in (
            "fp_keys",
            "fp_values",
            "key_codes",
            "key_scale",
            "key_zero",
            "value_codes",
            "value_scale",
            "value_zero",
        ):
            tensor = getattr(self, name)
            if tensor is not None:
                setattr(self, name, fn(tensor))  # type: ignore[operator]
