"""Each layer's KV groups permuted in the weights so that the groups of a kind are contiguous.

A hybrid layer whose full and SWA groups alternate (``[1, 0, 1, 0]``) splits its queries,
keys and values into one slice per run of groups, and its output back from them: gathers and
scatters on every decode step. Permuting the layer's heads in its projection weights (the
rows of ``q_proj``, ``k_proj`` and ``v_proj``, with their biases, and the columns of
``o_proj``) gives the same function with every full group first and every SWA group after
them: each kind is one slice, a view, and the cache writes and reads views only
(``bosch_eval.caches.hybrid_cache``). The model's output is unchanged up to the order in which
``o_proj`` sums its heads (fp32: within 1e-5).

Why the weights and not an index map at the attention function: an index map gathers the
queries and the new keys and values and scatters the output on every step of every layer,
which is what a decode step cannot afford (it is launch-bound); the weights are permuted
once per mask. It is opt-in (``hybridize(..., by_kind=True)``, bench and generation): code
that reads a head's weights by its index (rankers, head replacement, training's
per-parameter gradients, the dense reference in the tests) sees the model's order without it.
While the weights are permuted, ``state_dict`` gives them in the model's order and
``load_state_dict`` takes them in it (module hooks), so ``save_pretrained``, checkpoints and
export write what the plain model holds. Swapping the mask re-permutes; restoring the model
puts the weights back in place, bit for bit (a permutation moves values, it does not round them).

Layers already one run per kind (all full, all SWA, ``[1, 1, 0, 0]``) are left as they are,
so an all-full mask touches no weight. Families whose attention has no separate
``q_proj``/``k_proj``/``v_proj``/``o_proj`` linear layers (GPT-2's fused ``c_attn``) are
refused with the reason.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable
from typing import Any

import torch

from bosch_eval.runtime.errors import SettingsError

# Per layer: the model's group at each position of the weights (identity: untouched).
Order = tuple[int, ...]
PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj")


def by_kind(bits: tuple[int, ...]) -> Order:
    """The order that makes each kind one run: the layer's own when it already is, else its
    full groups, then its SWA groups, each in the model's order."""
    changes = sum(1 for a, b in itertools.pairwise(bits) if a != b)
    if changes <= 1:
        return tuple(range(len(bits)))
    return tuple(g for g, bit in enumerate(bits) if bit) + tuple(g for g, bit in enumerate(bits) if not bit)


class HeadOrder:
    """The group order each attention module's weights are in, and the permutation to another.

    Args:
        modules: the model's attention modules by layer index.
    """

    def __init__(self, modules: dict[int, torch.nn.Module]) -> None:
        self.modules = modules
        self.orders: dict[int, Order] = {}  # layers not in their model order
        self._hooks: list[Any] = []

    def arrange(self, orders: tuple[Order, ...] | None) -> None:
        """Put every layer's weights in ``orders`` (None: the model's own order).

        Raises:
            SettingsError: a layer to permute has no separate q/k/v/o projections.
        """
        for layer, module in self.modules.items():
            target = orders[layer] if orders is not None else _identity(module)
            current = self.orders.get(layer, _identity(module))
            if target == current:
                continue
            _permute(module, [current.index(group) for group in target])
            if target == _identity(module):
                self.orders.pop(layer, None)
            else:
                self.orders[layer] = target
        self._hook(bool(self.orders))

    def _hook(self, wanted: bool) -> None:
        """``state_dict`` in the model's order and ``load_state_dict`` from it, while any
        layer is permuted."""
        if wanted and not self._hooks:
            for layer, module in self.modules.items():
                self._hooks.append(module.register_state_dict_post_hook(self._saved_hook(layer)))
                self._hooks.append(module.register_load_state_dict_pre_hook(self._loaded_hook(layer)))
        elif not wanted:
            for hook in self._hooks:
                hook.remove()
            self._hooks = []

    def _saved_hook(self, layer: int) -> Any:
        def hook(module: torch.nn.Module, state_dict: dict[str, Any], prefix: str, local_metadata: Any) -> None:
            order = self.orders.get(layer)
            if order is not None:
                back = [order.index(group) for group in _identity(module)]
                _permute_tensors(module, state_dict, prefix, back)

        return hook

    def _loaded_hook(self, layer: int) -> Any:
        def hook(module: torch.nn.Module, state_dict: dict[str, Any], prefix: str, *args: Any) -> None:
            order = self.orders.get(layer)
            if order is not None:
                _permute_tensors(module, state_dict, prefix, list(order))

        return hook


def can_permute(modules: Iterable[torch.nn.Module]) -> bool:
    """Whether every one of these attention modules has separate q/k/v/o linear projections."""
    return all(isinstance(getattr(module, name, None), torch.nn.Linear) for module in modules for name in PROJECTIONS)


def _identity(module: torch.nn.Module) -> Order:
    groups = getattr(module.config, "num_key_value_heads", None) or module.config.num_attention_heads
    return tuple(range(groups))


def _check(module: torch.nn.Module) -> None:
    if not can_permute([module]):
        missing = [name for name in PROJECTIONS if not isinstance(getattr(module, name, None), torch.nn.Linear)]
        raise SettingsError(
            f"by_kind: {type(module).__name__} has no {', '.join(missing)} linear layer(s), so its heads cannot be "
            "permuted by kind in the weights; hybridize without by_kind (the cache then reads each run of groups apart)"
        )


def _rows(module: torch.nn.Module, name: str, index: list[int]) -> torch.Tensor:
    """The output rows (q/k/v) or input columns (o) of ``name`` that put its heads in
    ``index`` order (``index[p]``: the group now at position p goes there)."""
    head_dim = module.head_dim
    per_group = 1 if name in ("k_proj", "v_proj") else getattr(module, "num_key_value_groups", 1)
    heads = [group * per_group + r for group in index for r in range(per_group)]
    return torch.tensor([head * head_dim + d for head in heads for d in range(head_dim)])


def _permute(module: torch.nn.Module, index: list[int]) -> None:
    """Move the groups of ``module``'s weights: position p gets the group at ``index[p]``."""
    _check(module)
    with torch.no_grad():
        for name in PROJECTIONS:
            linear = getattr(module, name)
            rows = _rows(module, name, index).to(linear.weight.device)
            dim = 1 if name == "o_proj" else 0
            linear.weight.copy_(linear.weight.index_select(dim, rows))
            if linear.bias is not None and dim == 0:
                linear.bias.copy_(linear.bias.index_select(0, rows))


def _permute_tensors(module: torch.nn.Module, state_dict: dict[str, Any], prefix: str, index: list[int]) -> None:
    """The same permutation on a state dict's tensors of ``module`` (copies: the dict's own)."""
    for name in PROJECTIONS:
        rows = _rows(module, name, index)
        for part in ("weight", "bias"):
            key = f"{prefix}{name}.{part}"
            if key in state_dict and state_dict[key] is not None:
                dim = 1 if name == "o_proj" and part == "weight" else 0
                if name == "o_proj" and part == "bias":
                    continue  # o_proj's bias is per output feature, not per head
                state_dict[key] = state_dict[key].index_select(dim, rows.to(state_dict[key].device))
