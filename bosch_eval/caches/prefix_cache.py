"""Prefix-activation caching: while a search varies layers ℓ0 … L−1 only, compute the hidden
states entering layer ℓ0 once per input and run only the layers from ℓ0 on for each mask.

BOSCH's sub-problems fix every layer outside their variables; Stage 1 goes top layer
first, so for most of its sub-problems the layers below the varied one are all full
attention and identical for every candidate. The search tells the adapter the lowest varied
layer (:meth:`PrefixActivations.vary_from`); the cache keys the stored hidden states by
the layer they enter, what the hybrid spec runs in the layers below it (their mask rows, the
window and sinks, the backend) and the input token ids, so an entry is used only where it is exactly what the layers below would compute.

Skipping is done on the model as it is: the decoder layers below ℓ0 are given a
pass-through ``forward`` for the call (the model's loop still indexes them, so per-layer
config lookups keep their indices), and a pre-hook on layer ℓ0 hands it the stored states.
Layers ℓ0 … L−1 then compute exactly what they compute in a full forward, on the same input
tensor, so scores are bit-identical (tested on the bundled model and on GPT-2).

Layouts. The layer list is the decoder's ``layers`` (Llama, Qwen, Mistral, ...) or ``h``
(GPT-2 and its kin). Skipping needs layers that take the hidden states first (or as
``hidden_states=``) and return a tensor of the same shape, as transformers' decoder layers do
since 5.0: the first forward checks it. A layout that fails either check is *declined*:
the cache logs why once and every forward runs every layer, so a search is slower, never
wrong and never stopped (:attr:`PrefixActivations.declined`).
"""

from __future__ import annotations

import contextlib
import logging
from collections import OrderedDict
from collections.abc import Callable, Iterator
from typing import Any

import torch

from bosch_eval.attention.hybrid_spec import HybridSpec

log = logging.getLogger("bosch_eval.caches.prefix_cache")

Forward = Callable[[torch.Tensor], torch.Tensor]  # input ids [B, T] -> what the caller wants


# Where decoders keep their layer list: ``layers`` in most HF causal LMs, ``h`` in GPT-2,
# GPT-J, Bloom, Falcon and CodeGen.
LAYER_LIST_NAMES = ("layers", "h")


def decoder_layers(model: torch.nn.Module) -> torch.nn.ModuleList:
    """The decoder's layer list (``get_decoder().layers``, or ``.h`` for GPT-2-style models).

    Raises:
        TypeError: the model's decoder has none of those lists.
    """
    decoder = model.get_decoder() if hasattr(model, "get_decoder") else None
    for name in LAYER_LIST_NAMES:
        layers = getattr(decoder, name, None)
        if isinstance(layers, torch.nn.ModuleList) and len(layers):
            return layers
    names = " or ".join(f"get_decoder().{name}" for name in LAYER_LIST_NAMES)
    raise TypeError(f"{type(model).__name__}: no decoder layer list found (expected {names}, a torch ModuleList)")


class PrefixActivations:
    """Hidden states entering decoder layers, per input and per mask rows below the layer.

    An entry for layer ``b`` holds the states entering ``b`` for one input under one set of
    mask rows (and window, sinks and backend) for layers ``0 … b−1``: it stays right for
    every later spec with those, in this sub-problem or a later one. A forward told that layers below ℓ0 are
    fixed starts from the highest stored boundary ``b <= ℓ0`` and stores the boundaries
    ``b+1 … ℓ0`` it passes (Stage 1's next, lower layer then starts from one of them).

    Args:
        model: the hybridized causal LM.
        budget_bytes: the most bytes of stored states. States entering ℓ0 itself evict the
            oldest entries to fit; states of lower boundaries are kept only where they fit
            without evicting. An input whose states cannot fit runs every layer (logged once
            per sub-problem).

    Attributes:
        layers_run: decoder layer computations done (per batch row).
        layers_skipped: layer computations answered from the cache (per batch row).
        declined: why this model's layout cannot be cached (every forward then runs every
            layer), or None.
    """

    def __init__(self, model: torch.nn.Module, budget_bytes: int) -> None:
        if budget_bytes <= 0:
            raise ValueError(f"prefix cache budget: expected a positive number of bytes, got {budget_bytes}")
        self.budget_bytes = budget_bytes
        self.first_layer: int | None = None
        self.layers_run = 0
        self.layers_skipped = 0
        self.declined: str | None = None
        self._layout_checked = False  # set by the first forward that watches the layers
        self._store: OrderedDict[tuple[Any, ...], torch.Tensor] = OrderedDict()
        self._bytes = 0
        self._warned = False
        try:
            self.layers = decoder_layers(model)
        except TypeError as err:
            self.layers = torch.nn.ModuleList()
            self._decline(str(err))

    def vary_from(self, layer: int | None) -> None:
        """Run the forwards that follow from ``layer`` (None or 0: every layer). The states
        entering it are stored per input and per mask rows below it, so only masks that share
        those rows reuse them: a sub-problem's candidates all do, the tied masks of a
        tie-break in runs (:func:`bosch_eval.search.objective.tie_break.shared_rows_layer`)."""
        if self.declined is not None:
            return  # nothing is reused, so no promise matters
        if layer is not None and not 0 <= layer < len(self.layers):
            raise ValueError(f"vary_from: layer {layer} is not one of the model's {len(self.layers)} layers")
        if layer != self.first_layer:
            self._warned = False
        self.first_layer = layer

    def run(self, forward: Forward, input_ids: torch.Tensor, spec: HybridSpec) -> torch.Tensor:
        """``forward(input_ids)`` under ``spec`` (the model's current one), starting at the
        highest stored boundary at or below ℓ0."""
        total, rows, top = len(self.layers), input_ids.shape[0], self.first_layer
        if self.declined is not None:
            return forward(input_ids)
        if not top:
            self.layers_run += total * rows
            return forward(input_ids)
        item = (tuple(input_ids.shape), input_ids.detach().cpu().numpy().tobytes())

        # The whole local window (W and sinks) is in the key: both change what SWA layers
        # compute; so is the backend, whose kernels round differently.
        bits, local, backend = spec.mask.bits, spec.local, spec.backend

        def key(boundary: int) -> tuple[Any, ...]:
            return (boundary, bits[:boundary], local, backend, item)

        start = next((b for b in range(top, 0, -1) if key(b) in self._store), 0)
        wanted = [b for b in range(start + 1, top + 1) if key(b) not in self._store]
        with contextlib.ExitStack() as stack:
            captured = stack.enter_context(self._capture(wanted))
            problems = stack.enter_context(self._watch_layout()) if not self._layout_checked else []
            if start:
                stack.enter_context(self._skip_below(start, self._store[key(start)]))
            out = forward(input_ids)
        self._layout_checked = True
        if problems or any(hidden is None for hidden in captured.values()):
            # This forward ran every layer as the model does (nothing was skipped yet), so its output stands.
            self._decline(problems[0] if problems else "a decoder layer was called without its hidden states first")
            return out
        for boundary in wanted:
            self._keep(key(boundary), captured[boundary], evict=boundary == top)
        self.layers_run += (total - start) * rows
        self.layers_skipped += start * rows
        return out

    def _decline(self, reason: str) -> None:
        """Stop caching for good: every later forward runs every layer (logged once)."""
        self.declined = reason
        self.first_layer = None
        self._store.clear()
        self._bytes = 0
        log.warning("prefix cache off: %s; every forward runs every layer (slower, the same scores)", reason)

    def _keep(self, key: tuple[Any, ...], hidden: torch.Tensor, evict: bool) -> None:
        size = hidden.numel() * hidden.element_size()
        while evict and self._store and self._bytes + size > self.budget_bytes:
            _, old = self._store.popitem(last=False)
            self._bytes -= old.numel() * old.element_size()
        if self._bytes + size > self.budget_bytes:
            if evict and not self._warned:
                log.warning(
                    "prefix cache: one input's states (%.1f MB) do not fit the budget of %d MB; "
                    "inputs run every layer in this sub-problem",
                    size / 2**20, self.budget_bytes >> 20,
                )  # fmt: skip
                self._warned = True
            return
        self._store[key] = hidden
        self._bytes += size

    @contextlib.contextmanager
    def _capture(self, boundaries: list[int]) -> Iterator[dict[int, torch.Tensor | None]]:
        """The hidden states entering each boundary layer (None where a layer got none first)."""
        captured: dict[int, torch.Tensor | None] = {}
        handles = []
        for boundary in boundaries:

            def record(
                _module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], boundary: int = boundary
            ) -> None:
                hidden = _hidden_states(args, kwargs)
                captured[boundary] = None if hidden is None else hidden.detach().clone()

            handles.append(self.layers[boundary].register_forward_pre_hook(record, with_kwargs=True))
        try:
            yield captured
        finally:
            for handle in handles:
                handle.remove()

    @contextlib.contextmanager
    def _watch_layout(self) -> Iterator[list[str]]:
        """What keeps the layers from being skipped, seen in one forward: a pass-through
        hands the next layer what the skipped layer got, so a layer must take the hidden
        states first and return one tensor of their shape (a tuple, as in transformers 4's
        layers, would be indexed by the model's loop)."""
        problems: list[str] = []

        def check(module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], output: Any) -> None:
            hidden = _hidden_states(args, kwargs)
            name = type(module).__name__
            if hidden is None:
                problems.append(f"{name} is called without its hidden states first (or as hidden_states=)")
            elif not isinstance(output, torch.Tensor) or output.shape != hidden.shape:
                got = (
                    type(output).__name__
                    if not isinstance(output, torch.Tensor)
                    else f"a tensor of shape {tuple(output.shape)}"
                )
                problems.append(
                    f"{name} returns {got}, expected a tensor of the hidden states' shape {tuple(hidden.shape)}"
                )

        handles = [layer.register_forward_hook(check, with_kwargs=True) for layer in self.layers]
        try:
            yield problems
        finally:
            for handle in handles:
                handle.remove()

    @contextlib.contextmanager
    def _skip_below(self, layer: int, hidden: torch.Tensor) -> Iterator[None]:
        def inject(
            _module: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]
        ) -> tuple[tuple[Any, ...], dict[str, Any]]:
            if args:
                return (hidden, *args[1:]), kwargs
            return args, {**kwargs, "hidden_states": hidden}

        skipped = list(self.layers[:layer])
        for module in skipped:
            module.forward = _pass_through  # an instance attribute shadows the class's forward
        handle = self.layers[layer].register_forward_pre_hook(inject, with_kwargs=True)
        try:
            yield
        finally:
            handle.remove()
            for module in skipped:
                del module.forward


def _pass_through(hidden_states: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
    return hidden_states


def _hidden_states(args: tuple[Any, ...], kwargs: dict[str, Any]) -> torch.Tensor | None:
    """The hidden states a decoder layer was called with: its first argument or ``hidden_states=``."""
    hidden = args[0] if args else kwargs.get("hidden_states")
    return hidden if isinstance(hidden, torch.Tensor) else None
