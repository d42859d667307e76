"""Haystacks with needles at chosen depths, sized to a token budget without cutting the question.

Why not truncate: an example built long and then cut to length loses its instruction or
its question, and its "accuracy" then measures copying filler. Here the fixed parts
(instruction, needles, question, answer or generation budget) are counted first, and
only the haystack is sized to the remaining tokens, one unit (a word, or a line) at a
time. When the fixed parts alone exceed the budget, :func:`fit` raises.

Sizing is exact in the tokenizer that will read the text: unit costs (tokens of each
distinct unit with its joiner in front) give a first guess, and full-text counts then
correct it, so a prompt lands at most one unit under its budget.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from itertools import accumulate

from transformers import PreTrainedTokenizerBase

from bosch_eval.runtime.errors import TemplateTooLong

_CHUNK = 256  # sentences drawn between two cost measurements


def count_tokens(tokenizer: PreTrainedTokenizerBase, text: str) -> int:
    """Tokens of ``text`` as lm-eval's HF models encode a prompt (no special tokens)."""
    return len(tokenizer(text, add_special_tokens=False)["input_ids"])


def unit_costs(tokenizer: PreTrainedTokenizerBase, units: Sequence[str], joiner: str) -> list[int]:
    """Tokens of ``joiner + unit`` for each unit; each distinct unit is encoded once."""
    distinct = list(dict.fromkeys(units))
    encoded = tokenizer([joiner + unit for unit in distinct], add_special_tokens=False)["input_ids"]
    cost = {unit: len(ids) for unit, ids in zip(distinct, encoded, strict=True)}
    return [cost[unit] for unit in units]


@dataclass(frozen=True)
class Haystack:
    """Filler text as units joined by ``joiner``; needles go only at ``boundaries``.

    Word units (``joiner=" "``) end sentences at boundaries, so a cut to ``n`` words
    keeps needles between whole sentences (RULER cuts its essay haystack by words too);
    line units (``joiner="\\n"``) take needles between any two lines.
    """

    joiner: str
    units: list[str]
    costs: list[int]  # tokens of joiner + unit, a first guess of each unit's share of a prompt
    boundaries: list[int]  # unit indices where a sentence starts, ascending, from 0

    @classmethod
    def grow(
        cls,
        next_sentence: Callable[[], str],
        tokenizer: PreTrainedTokenizerBase,
        budget: int,
        split_words: bool,
    ) -> Haystack:
        """Draw sentences until their units cost more than ``budget`` tokens."""
        joiner = " " if split_words else "\n"
        units: list[str] = []
        costs: list[int] = []
        boundaries = [0]
        while sum(costs) <= budget:
            chunk: list[str] = []
            for _ in range(_CHUNK):
                chunk += next_sentence().split(" ") if split_words else [next_sentence()]
                boundaries.append(len(units) + len(chunk))
            units += chunk
            costs += unit_costs(tokenizer, chunk, joiner)
        return cls(joiner, units, costs, boundaries)

    def text(self, n: int, needles: Sequence[str], depths: Sequence[float]) -> str:
        """The first ``n`` units with needle ``i`` at the boundary nearest ``depths[i] * n``."""
        usable = self.boundaries[: bisect_right(self.boundaries, n)]
        pieces: list[list[str]] = [[] for _ in usable]
        for needle, depth in zip(needles, depths, strict=True):
            pieces[_nearest(usable, depth * n)].append(needle)
        out: list[str] = []
        for slot, start in enumerate(usable):
            out += pieces[slot]
            end = usable[slot + 1] if slot + 1 < len(usable) else n
            out += self.units[start:end]
        return self.joiner.join(out)


def _nearest(sorted_values: Sequence[int], target: float) -> int:
    """Index of the value closest to ``target`` (the lower one on ties)."""
    right = bisect_left(sorted_values, target)
    if right == 0:
        return 0
    if right == len(sorted_values):
        return right - 1
    return right if sorted_values[right] - target < target - sorted_values[right - 1] else right - 1


def fit(
    render: Callable[[int], str],
    tokenizer: PreTrainedTokenizerBase,
    costs: Sequence[int],
    budget: int,
    what: str,
) -> tuple[int, int]:
    """The most units ``n`` with ``render(n)`` at most ``budget`` tokens, and that count.

    Raises:
        TemplateTooLong: ``render(0)``, the example without haystack, already exceeds
            ``budget``; the message names ``what`` and both numbers.
    """
    fixed = count_tokens(tokenizer, render(0))
    if fixed > budget:
        raise TemplateTooLong(
            f"{what}: the instruction, needles and question alone take {fixed} tokens, more than the "
            f"budget of {budget}; raise the sequence length (it must leave room for a haystack)."
        )
    cumulative = [0, *accumulate(costs)]
    n = bisect_right(cumulative, budget - fixed) - 1
    total = count_tokens(tokenizer, render(n))
    while total > budget:  # the guess was long: drop the fewest units that cover the excess
        n = max(0, bisect_right(cumulative, cumulative[n] - (total - budget)) - 1)
        total = count_tokens(tokenizer, render(n))
    while n < len(costs) and total + costs[n] <= budget:  # the guess was short: add units one by one
        grown = count_tokens(tokenizer, render(n + 1))
        if grown > budget:
            break
        n, total = n + 1, grown
    return n, total
