"""lm-eval warnings that say nothing about a run of ours, filtered out.

Upstream RULER tasks (``niah_single_1``, ...) and ours score each document under a metric
named by its length (``"512"``, ``"1024"``) and list only some lengths in ``metric_list``.
Run at other lengths (``max_seq_lengths``), lm-eval warns for every task and evaluation:

* "No aggregation function defined for metric 512. Using mean.": the mean over the
  documents of that length, which is the right number (a document reports only its own
  length, or -1 for listed lengths, which RULER's own aggregation drops);
* "Metrics were not scored on the same number of documents (512,none=32, 1024,none=32,
  4096,none=64)": each length has its own documents, by design (our ``bosch_niah`` tasks add
  ``score``, every document's, beside the per-length metrics).

A comparison repeats both for every entry and task (28 times in the quickstart). Only these
two messages are dropped, and only when every metric they name is a length (or ``score``); the same
warnings about any other metric still show.

Also dropped: "<task>: Custom kwargs can be passed to `--metadata` ... For details see task
Readme.", a two-line hint lm-eval prints at every build of a task with a generated dataset,
whether or not ``--metadata`` was given; dropped only for RULER's tasks (``niah_*``,
``ruler_*``) and ours (``bosch_*``, whose settings docs/tasks.md documents). Other tasks with
a generated dataset (babilong, graphwalks, a user's own) keep it.

The filters are installed process-wide (logger filters, by the adapter and by ``bosch-eval``'s
main) and stay for the rest of the process, so each drops only the messages named here:
an lm-eval run in the same process with another model or task still sees every other warning.
"""

from __future__ import annotations

import functools
import logging
import re

# lm-eval 0.4.13's wording (lm_eval/evaluator_utils.py).
_NO_AGGREGATION = re.compile(r"No aggregation function defined for metric (\S+)\. Using mean\.")
# The hint starts with the task's name: RULER's tasks and ours only.
_METADATA_HINT = re.compile(r"^(?:niah|ruler|bosch)_\S*: Custom kwargs can be passed to `--metadata`")
_UNEQUAL_COUNTS = re.compile(r"Metrics were not scored on the same number of documents \(([^)]*)\)")


def _is_length_noise(message: str) -> bool:
    if match := _NO_AGGREGATION.search(message):
        return match.group(1).isdigit()
    if match := _UNEQUAL_COUNTS.search(message):
        names = [item.split(",")[0].strip() for item in match.group(1).split(", ")]
        return any(name.isdigit() for name in names) and all(name.isdigit() or name == "score" for name in names)
    return False


class _PerLengthNoise(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not _is_length_noise(record.getMessage())


class _MetadataHint(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return not _METADATA_HINT.match(record.getMessage())


@functools.cache
def quiet_per_length_warnings() -> None:
    """Drop the warnings above (once per process; idempotent)."""
    # A logger's filters see only records logged to that logger: these are where they start.
    logging.getLogger("lm_eval.evaluator_utils").addFilter(_PerLengthNoise())
    logging.getLogger("lm_eval.api.task").addFilter(_MetadataHint())
