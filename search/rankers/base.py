"""What every ranker implements, and the calibration sequences most of them read.

A ranker sees the model one layer and one block of query rows at a time
(:class:`~bosch_eval.search.rankers.blocks.AttentionBlock`), accumulates per-head
statistics, and at the end turns them into one score per query head. The driver
(:mod:`bosch_eval.search.rankers.driver`) pools heads into KV groups.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import Any, ClassVar

import torch
from transformers import PreTrainedTokenizerBase

from bosch_eval.masks.head_mask import CALIBRATION_INPUTS
from bosch_eval.runtime.registry import Flag
from bosch_eval.search.rankers.blocks import AttentionBlock
from bosch_eval.tasks.niah.calibration_sets import calibration_examples


def calibration_ids(
    tokenizer: PreTrainedTokenizerBase,
    length: int,
    num_examples: int,
    seed: int,
    task: str,
    include_paths: Sequence[str] = (),
) -> list[torch.Tensor]:
    """Token ids of the examples of calibration set ``task`` (paper B.4; its YAML under ``tasks/``
    or ``include_paths``), one ``[T]`` tensor each.

    Each text is ``input + " " + target`` encoded as lm-eval encodes a prompt (no special
    tokens), so the answer tokens are the last ones and ``T ≤ length``.
    """
    docs = calibration_examples(task, tokenizer, length, num_examples, seed, include_paths)
    return [
        torch.tensor(tokenizer(f"{doc['input']} {doc['target']}", add_special_tokens=False)["input_ids"])
        for doc in docs
    ]


class Ranker(ABC):
    """Streaming per-head locality statistics of one method (paper B.3).

    A subclass registers itself under its command-line name with
    ``@RANKERS.register("name")`` (:data:`bosch_eval.search.rankers.RANKERS`); its options
    are keyword arguments of ``__init__``, and ``flags`` gives some of them to ``bosch-eval rank``.

    Attributes:
        more_local: ``"higher"`` or ``"lower"``: which end of the score marks a head
            that tolerates SWA best (``HeadRanking.more_local``).
        needs_grad: the method reads ``dL/dP`` (blocks carry ``dprobs``).
        inputs: what :meth:`sequences` returns, for the provenance.
        flags: ``bosch-eval rank``'s flags for the method's options, each named after the
            method (``--proxy-block``); parsed once ``--method`` has named the ranker.
    """

    more_local: ClassVar[str]
    needs_grad: ClassVar[bool] = False
    inputs: ClassVar[str] = CALIBRATION_INPUTS
    flags: ClassVar[tuple[Flag, ...]] = ()

    def __init__(self, num_layers: int, num_heads: int, window: int) -> None:
        self.num_layers = num_layers
        self.num_heads = num_heads
        self.window = window

    def sequences(
        self,
        tokenizer: PreTrainedTokenizerBase,
        vocab_size: int,
        num: int,
        length: int,
        seed: int,
        task: str,
        include_paths: Sequence[str] = (),
    ) -> list[torch.Tensor]:
        """The inputs the method reads: by default the examples of calibration set ``task``."""
        return calibration_ids(tokenizer, length, num, seed, task, include_paths)

    def first_row(self, length: int) -> int:
        """The first query row the method reads in a sequence of ``length`` tokens."""
        return 0

    @abstractmethod
    def update(self, layer: int, block: AttentionBlock) -> None:
        """Accumulate one block of one layer of the current sequence."""

    @abstractmethod
    def head_scores(self) -> torch.Tensor:
        """Per-query-head scores, ``[L, H]`` float64."""

    def settings(self) -> dict[str, Any]:
        """Method-specific settings, recorded in the ranking's provenance."""
        return {}
