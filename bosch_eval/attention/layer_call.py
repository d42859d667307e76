"""One layer's attention call, split over its groups: the queries, transformers' kwargs, and
the output every part of the layer writes its heads into.

A layer's full and SWA groups may run in separate kernel calls; each writes its query heads
into one ``out [B, T, H, Dv]`` in the original head order (the paper's W_o permutation,
without touching a weight).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any

import torch

from bosch_eval.attention.hybrid_spec import GroupRun

# attend(module, query [B, h, T, D], key [B, g, K, D], value, mask, **kwargs) -> [B, T, h, Dv]
Attend = Any


@dataclass(frozen=True)
class LayerCall:
    """The attention call of one layer: its module, ``query [B, H, T, D]``, transformers'
    ``kwargs``, the values' head size and the ``out [B, T, H, Dv]`` its parts write."""

    module: torch.nn.Module
    query: torch.Tensor
    kwargs: dict[str, Any]
    value_dim: int

    @classmethod
    def start(cls, module: torch.nn.Module, query: torch.Tensor, value_dim: int, kwargs: dict[str, Any]) -> LayerCall:
        return cls(module, query, kwargs, value_dim)

    @property
    def out(self) -> torch.Tensor:
        """Allocated on first use: a call whose parts return the whole output needs none.
        (Not ``functools.cached_property``: on Python 3.11 it takes a lock, which dynamo cannot
        trace, so a compiled decode step would break its graph there.)"""
        out = getattr(self, "_out", None)
        if out is None:
            query = self.query
            out = query.new_empty(query.shape[0], query.shape[2], query.shape[1], self.value_dim)
            object.__setattr__(self, "_out", out)  # a frozen value's one lazy field
        return out

    def attend_runs(
        self,
        attend: Attend,
        runs: tuple[GroupRun, ...],
        group_size: int,
        key: torch.Tensor,
        value: torch.Tensor,
        mask: Any,
        kind_only: bool,
    ) -> None:
        """``attend`` on the query heads of each run, one call per run on views.

        ``kind_only``: ``key``/``value`` hold only this kind's groups (a cache layer), so a
        run's groups sit at its ``offset``; otherwise at its own group indices.
        """
        for run in runs:
            heads = slice(run.start * group_size, run.stop * group_size)
            first = run.offset if kind_only else run.start
            groups = slice(first, first + run.stop - run.start)
            self.out[:, :, heads] = attend(
                self.module, self.query[:, heads], key[:, groups], value[:, groups], mask, **self.kwargs
            )

    def attend_kind(
        self,
        attend: Attend,
        runs: tuple[GroupRun, ...],
        group_size: int,
        keys: torch.Tensor,
        values: torch.Tensor,
        mask: Any,
    ) -> None:
        """``attend`` on the query heads of one kind's groups, whose keys a cache holds side by side."""
        if len(runs) == 1:
            self.attend_runs(attend, runs, group_size, keys, values, mask, kind_only=True)
        else:
            # One call on the query heads gathered, not one per run (a decode step is launch-bound on a GPU).
            heads = head_index(runs, group_size, self.query.device)
            self.out[:, :, heads] = attend(self.module, self.query[:, heads], keys, values, mask, **self.kwargs)


@functools.lru_cache(maxsize=4096)
def head_index(runs: tuple[GroupRun, ...], group_size: int, device: torch.device) -> torch.Tensor:
    """The query heads of ``runs``, in order, as an index tensor on ``device`` (made once)."""
    heads = [head for run in runs for head in range(run.start * group_size, run.stop * group_size)]
    return torch.tensor(heads, device=device)


@functools.lru_cache(maxsize=4096)
def group_index(runs: tuple[GroupRun, ...], device: torch.device) -> torch.Tensor:
    """The groups of ``runs``, in order, as an index tensor on ``device`` (made once)."""
    return torch.tensor([group for run in runs for group in range(run.start, run.stop)], device=device)
