"""The SWA window W and the attention sinks S: one home for their rules.

* :func:`check_window` / :func:`check_sinks`: W a positive integer, S an integer ≥ 0, as a
  mask or ranking file and every setting give them;
* :func:`resolve_window`: the one place W is chosen (the user's, the mask's, the model's
  ``bosch_defaults.json``, or none needed for an all-full mask);
* :class:`LocalWindow`: the local-attention value of an SWA KV group, and its one band predicate.

``LocalWindow(window=W, sinks=S)``: query ``t`` sees key ``j`` iff

    j ≤ t  and  (j < S  or  t − W < j)

i.e. the ``W`` most recent keys (itself included) plus the first ``S`` positions (attention
sinks, StreamingLLM). ``S = 0`` is exactly transformers' ``sliding_attention``
(``masking_utils.sliding_window_causal_mask_function``). Every kernel, the hybrid cache's
retention rule, the KV-bytes formulas and the prefix cache's key derive from this value.

The predicates are written like transformers' mask functions, ``(batch, head, q, kv) ->
bool``, and combined with its ``and_masks``/``or_masks``; on index tensors they broadcast,
so :meth:`LocalWindow.dense` is the predicate evaluated on a grid, and FlexAttention takes
the same function as its ``mask_mod``. Where a row's sinks are when it is padded, and the
index convention the kernels see, are :mod:`bosch_eval.attention.local_window`'s.

This module imports no torch at load: the KV-bytes formula is pure arithmetic.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from bosch_eval.runtime.checks import check_int, is_int
from bosch_eval.runtime.errors import LocalWindowError, MaskError, WindowError

# How a serving engine counts a window of W (bosch_eval.models.export): "inclusive", W keys
# including the query (this value's own count: transformers, vLLM, SGLang), or
# "exclusive", W − 1 keys before it.
WINDOW_CONVENTIONS = ("inclusive", "exclusive")

# The file a model directory recommends its window in (read by bosch_eval.models.model_defaults);
# named here because the window's messages tell the user about it.
DEFAULTS_FILE = "bosch_defaults.json"
# The W an all-full mask gets when nothing names one: no group is SWA, so W is never read.
UNREAD_WINDOW = 1

# (batch, head, q_idx, kv_idx) -> bool, or a bool tensor when the indices are tensors.
MaskFunction = Callable[[Any, Any, Any, Any], Any]

log = logging.getLogger("bosch_eval")


def check_window(window: Any, source: str = "window") -> int:
    """Validate a sliding-window size: a positive integer number of keys."""
    return check_int(
        window, source, minimum=1, expected="a positive integer window (keys seen per query)", error=MaskError
    )


def check_sinks(sinks: Any, source: str = "sink") -> int:
    """Validate an attention-sink count: an integer >= 0 (0 = no sinks)."""
    return check_int(
        sinks, source, minimum=0, expected="an integer >= 0 (attention-sink positions, 0 = none)", error=MaskError
    )


def resolve_window(
    given: Any = None,
    *,
    carried: int | None = None,
    default: int | None = None,
    all_full: bool = False,
    source: str = "window",
    flag: str = "window=W",
) -> int:
    """The SWA window W, from the first of these that names one:

    1. ``given``: the user's ``window=`` / ``--window`` (checked: a positive integer);
    2. ``carried``: the window a mask or ranking file carries;
    3. ``default``: the model's ``bosch_defaults.json`` (``model_defaults(path).window``;
       logged, since the user did not choose it);
    4. for an ``all_full`` mask only, :data:`UNREAD_WINDOW` (no group is SWA: W is never read).

    Args:
        source: what the window is for, in messages (a mask file, ``layers=intr``, a model).
        flag: how the user passes a window where this is called (``window=W``, ``--window W``),
            for the messages.

    Raises:
        WindowError: ``given`` is not a positive integer, or nothing names a window.
    """
    try:
        if given is not None:
            return check_window(given, re.split("[= ]", flag)[0])
        if carried is not None:
            return check_window(carried, f"{source}: field 'window'")
    except MaskError as err:
        raise WindowError(str(err)) from None
    if default is not None:
        log.info("%s: window=%d from the model's %s (pass %s to choose)", source, default, DEFAULTS_FILE, flag)
        return default
    if all_full:
        return UNREAD_WINDOW
    raise WindowError(
        f"{source}: field 'window' is missing and the model ships no {DEFAULTS_FILE} with one; pass {flag} (keys seen per SWA query)"
    )


def causal(batch: Any, head: Any, q: Any, kv: Any) -> Any:
    """Keys at or before the query."""
    return kv <= q


def recent(window: int) -> MaskFunction:
    """The ``window`` keys ending at the query (with :func:`causal`): ``q − W < kv``."""

    def inner(batch: Any, head: Any, q: Any, kv: Any) -> Any:
        return kv > q - window

    return inner


def sink(sinks: int) -> MaskFunction:
    """The first ``sinks`` key indices (a batch without padding)."""

    def inner(batch: Any, head: Any, q: Any, kv: Any) -> Any:
        return kv < sinks

    return inner


def row_sink(sink_keys: Any) -> MaskFunction:
    """Each row's sink keys, ``sink_keys [B, K]`` (:func:`~bosch_eval.attention.local_window.sink_keys`)."""

    def inner(batch: Any, head: Any, q: Any, kv: Any) -> Any:
        return sink_keys[batch, kv]

    return inner


@dataclass(frozen=True)
class LocalWindow:
    """W keys seen per SWA query (itself included) plus S attention-sink positions.

    Raises:
        LocalWindowError: W not a positive integer, or S not an integer ≥ 0.
    """

    window: int
    sinks: int = 0

    def __post_init__(self) -> None:
        if not is_int(self.window) or self.window < 1:
            raise LocalWindowError(
                f"window: expected a positive integer (keys seen per SWA query), got {self.window!r}"
            )
        if not is_int(self.sinks) or self.sinks < 0:
            raise LocalWindowError(f"sink: expected an integer >= 0 (attention-sink positions), got {self.sinks!r}")

    def mask_function(self, sink_keys: Any = None) -> MaskFunction:
        """The band predicate: ``causal ∧ (recent ∨ sink)``; with ``S = 0``, ``causal ∧ recent``.

        Args:
            sink_keys: ``[B, K]`` each row's sink keys (:func:`~bosch_eval.attention.local_window.sink_keys`); None: the first
                ``S`` key indices (no padding).
        """
        from transformers.masking_utils import and_masks, or_masks

        if not self.sinks:
            return and_masks(causal, recent(self.window))
        sinks = sink(self.sinks) if sink_keys is None else row_sink(sink_keys)
        return and_masks(causal, or_masks(recent(self.window), sinks))

    def grid(self, q_positions: Any, kv_positions: Any, sink_keys: Any = None) -> Any:
        """The predicate on index tensors, broadcast: ``q_positions [..., Q, 1]`` against
        ``kv_positions [..., 1, K]`` gives a boolean ``[..., Q, K]``; with ``sink_keys
        [B, K]`` (indexed by ``kv_positions``, which must then lie in ``0 … K − 1``), a
        boolean ``[B, ..., Q, K]``."""
        zero = q_positions.new_zeros(())
        if self.sinks and sink_keys is not None:
            import torch

            rows = torch.arange(sink_keys.shape[0], device=sink_keys.device).view(-1, *([1] * kv_positions.dim()))
            return self.mask_function(sink_keys)(rows, zero, q_positions, kv_positions)
        return self.mask_function()(zero, zero, q_positions, kv_positions)

    def dense(self, q_len: int, kv_len: int, device: Any = None, sink_keys: Any = None) -> Any:
        """Boolean ``[q_len, kv_len]`` tensor of the predicate, query ``i`` at key index
        ``kv_len − q_len + i``; ``[B, q_len, kv_len]`` with ``sink_keys [B, kv_len]``."""
        import torch

        q_positions = torch.arange(kv_len - q_len, kv_len, device=device)[:, None]
        return self.grid(q_positions, torch.arange(kv_len, device=device)[None, :], sink_keys)

    def narrowed(self, model_window: int | None) -> LocalWindow:
        """This window within a layer the model itself already runs with ``model_window``."""
        return self if not model_window or model_window >= self.window else LocalWindow(model_window, self.sinks)

    def retained(self, seen: int) -> tuple[int, int]:
        """What a cache must keep after ``seen`` positions so that every later query (at
        ``t ≥ seen``) sees all its keys: ``(sink_count, recent_start)``, i.e. positions
        ``0 … sink_count − 1`` and ``recent_start … seen − 1``.

        These are the positions the predicate allows for the next query ``t = seen``; the
        two spans never overlap (``recent_start ≥ sink_count``).
        """
        sink_count = min(self.sinks, seen)
        return sink_count, max(sink_count, seen - (self.window - 1))

    def retained_count(self, seen: int) -> int:
        """How many positions :meth:`retained` keeps: ``min(T, S) + min(max(T − S, 0), W − 1)``."""
        sink_count, recent_start = self.retained(seen)
        return sink_count + seen - recent_start
