"""What the ``bosch`` adapter does with an input longer than the model takes.

lm-eval's HFLM cuts such inputs from the left and scores what is left, saying nothing that
reaches the results. A score of a truncated input is not the task's score, so by default
the adapter refuses the request, naming the task, the length and the limit; with
``allow_truncation=True`` it lets HFLM truncate and records, per task, how many documents
were cut and the longest input, for the results' ``config`` (``bosch_truncated``).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from lm_eval.api.instance import Instance
from lm_eval.models.utils import normalize_gen_kwargs

from bosch_eval.runtime.errors import ModelError

log = logging.getLogger("bosch_eval")

# (request, input tokens, tokens the model can take)
TooLong = tuple[Instance, int, int]


@dataclass
class TruncationPolicy:
    """Refuse over-long requests, or (``allow``) record them per task.

    Args:
        allow: ``allow_truncation``: score over-long inputs after lm-eval's left truncation.
        model_name: the model, for messages.
        max_length_given: whether ``max_length=`` was passed (else the limit is the config's).
    """

    allow: bool
    model_name: str
    max_length_given: bool
    # task -> (doc ids scored after left truncation, longest input in tokens)
    truncated: dict[str, tuple[set[int], int]] = field(default_factory=dict)

    def check(self, too_long: Iterable[TooLong], what: str, max_length: int) -> None:
        """Refuse the requests in ``too_long``, or record them (``allow``).

        Args:
            too_long: each request that lm-eval would left-truncate.
            what: what was measured (``context``, ``context + continuation``), for the message.
            max_length: the model's limit (HFLM's ``max_length``).

        Raises:
            ModelError: naming the task, the longest input and the limit, unless ``allow``.
        """
        by_task: dict[str, list[tuple[int, int, int]]] = {}
        for request, length, room in too_long:
            by_task.setdefault(str(request.task_name), []).append((request.doc_id, length, room))
        if not by_task:
            return
        if not self.allow:
            task, rows = sorted(by_task.items())[0]
            _, length, room = max(rows, key=lambda row: row[1])
            others = f"; {len(by_task) - 1} more task(s) too" if len(by_task) > 1 else ""
            source = "max_length= given" if self.max_length_given else "the model's max_position_embeddings"
            raise ModelError(
                f"task {task!r}: {len(rows)} request(s) longer than model {self.model_name!r} can take, the longest "
                f"{what} {length} tokens > {room} (max_length {max_length}, from {source}"
                f"{'; less the tokens to generate' if room < max_length else ''}){others}. lm-eval would cut "
                "them from the left and score what is left. Use shorter inputs (e.g. smaller max_seq_lengths), "
                "pass max_length=N if the model holds more than its config says (rope scaling), or "
                "allow_truncation=true to score them anyway (the results then carry bosch_truncated)"
            )
        for task, rows in by_task.items():
            docs, longest = self.truncated.get(task, (set(), 0))
            if task not in self.truncated:
                log.warning(
                    "bosch: task %r: inputs longer than max_length %d are scored after left truncation "
                    "(allow_truncation=true); its results carry bosch_truncated",
                    task,
                    max_length,
                )
            docs.update(doc for doc, _, _ in rows)
            self.truncated[task] = (docs, max(longest, *(length for _, length, _ in rows)))

    def report(self, max_length: int) -> dict[str, dict[str, Any]]:
        """``bosch_truncated`` of the results' ``config``: per task, the documents cut and the
        longest input (keyed by leaf task; an adapter reused across evaluations reports
        earlier tasks too)."""
        return {
            task: {"documents": len(docs), "longest_input_tokens": longest, "max_length": max_length}
            for task, (docs, longest) in sorted(self.truncated.items())
        }


def over_long_requests(lm: Any, requests: Iterable[Instance]) -> list[TooLong]:
    """The loglikelihood requests HFLM would cut: the model sees (context + continuation)[:-1],
    tokenized as lm-eval's ``loglikelihood`` does (an empty context is the prefix token,
    unless the continuation starts with it)."""
    too_long = []
    for request in requests:
        context, continuation = request.args
        if context:
            context_ids, continuation_ids = lm._encode_pair(context, continuation)
            tokens = len(context_ids) + len(continuation_ids)
        else:
            continuation_ids = lm.tok_encode(continuation, add_special_tokens=False)
            tokens = len(continuation_ids) + (not continuation_ids or continuation_ids[0] != lm.prefix_token_id)
        if tokens - 1 > lm.max_length:
            too_long.append((request, tokens - 1, lm.max_length))
    return too_long


def over_long_contexts(lm: Any, requests: Iterable[Instance]) -> list[TooLong]:
    """The generation requests HFLM would cut: it left-truncates each context to
    ``max_length - max_gen_toks`` (one log line per batch)."""
    too_long = []
    for request in requests:
        context, gen_kwargs = request.args
        room = lm.max_length - normalize_gen_kwargs(dict(gen_kwargs), lm.max_gen_toks)["max_gen_toks"]
        length = len(lm.tok_encode(context))
        if length > room:
            too_long.append((request, length, room))
    return too_long
