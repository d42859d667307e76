"""``bosch_niah_dev``: a development split of the RULER-like eval suite, scored prefill-only.

Choices about the search (calibration format, metric, example count, seed, which run to
report) need a held-out skill to be judged on without looking at the test set, which is
upstream ``niah_single_1`` and ``bosch_niah`` at its default ``eval_seed`` 0. This task
draws the same formats as ``bosch_niah`` (``eval_suite.example``: RULER's template, needle
and ``gen_prefix``, the eval vocabulary) from other seeds, and refuses seed 0.

By default the variants with numeric values (``single_1``, ``single_2``, ``multikey_1``,
``multikey_2``) are drawn, interleaved by index: the bundled toy models cannot copy UUIDs.
The UUID formats (``single_3``, ``multikey_3``) are drawn when ``dev_variants`` names them,
for a model that answers with the value itself: a model that puts anything before the value
scores 0 there under the prefill score below, even with every head full
(results/smollm2/uuid_answers.md shows one; ``calib-check`` then says "dev cannot judge"). Scored like the calibration sets, as one
forward pass per example: ``acc`` is 1 when the value's tokens are the greedy continuation
of the prompt and ``gen_prefix``, which is what greedy generation must produce first for
RULER's ``string_match_all`` to count it (generation with 128 new tokens costs ~100 times
more on a CPU). ``bosch_niah_dev_gen`` holds the same documents and scores them as the test
tasks do, by greedy generation and RULER's string match: for a model whose answers the
prefill score misses.

Metadata: ``dev_lengths`` (default: the model's ``calib_len``, else 4096), ``dev_samples``
(documents per variant and length, default 16), ``dev_seed`` (default 1; the test draws' seeds
:data:`TEST_SEEDS` are refused),
``dev_variants`` (some of ``single_1``, ``single_2``, ``single_3``, ``multikey_1``,
``multikey_2``, ``multikey_3``; default the four numeric ones): a model that fails a
variant with every head full adds only noise there, so a check can leave it out and spend
the documents on the others.
"""

from __future__ import annotations

from typing import Any

import datasets

from bosch_eval.tasks.niah import eval_suite
from bosch_eval.tasks.niah.metadata import (
    check_lengths,
    default_lengths,
    int_list_setting,
    int_setting,
    model_tokenizer,
)

TASK = "bosch_niah_dev"
GENERATION_TASK = "bosch_niah_dev_gen"
DEFAULT_FORMATS = (
    "bosch_niah_single_1",
    "bosch_niah_single_2",
    "bosch_niah_multikey_1",
    "bosch_niah_multikey_2",
)  # the default
CHOOSABLE = tuple(eval_suite.NIAH_FORMATS)  # every bosch_niah format, the UUID ones (single_3, multikey_3) included
# The eval suite's seeds that test draws used: its default, and the studies' fresh draws (a
# study's ``doc_seed``: 5 for issue 53, 6 for issue 67). A dev split drawn with one would be
# the test documents themselves.
TEST_SEEDS = (eval_suite.DEFAULT_SEED, 5, 6)
DEFAULT_SEED = 1
DEFAULT_SAMPLES = 16


def dataset(**metadata: Any) -> dict[str, datasets.Dataset]:
    """lm-eval ``custom_dataset``: the development documents as the ``test`` split."""
    docs = [
        {
            "input": f"{doc['input']} {doc['gen_prefix']}",
            "target": doc["outputs"][0],
            "variant": variant,
            "max_length": length,
        }
        for variant, length, doc in documents(metadata, TASK)
    ]
    return {"test": datasets.Dataset.from_list(docs)}


def generation_dataset(**metadata: Any) -> dict[str, datasets.Dataset]:
    """lm-eval ``custom_dataset`` of ``bosch_niah_dev_gen``: the same documents as the eval
    suite's tasks hold them, for greedy generation scored by RULER's string match (the value
    anywhere in the answer), like the test tasks: a model that answers ": <uuid>" counts."""
    docs = [dict(doc, variant=variant) for variant, _, doc in documents(metadata, GENERATION_TASK)]
    return {"test": datasets.Dataset.from_list(docs)}


def documents(metadata: dict[str, Any], task: str) -> list[tuple[str, int, dict[str, Any]]]:
    """``(variant, length, eval-suite document)`` of the development split, interleaved by index."""
    tokenizer = model_tokenizer(metadata, task)
    lengths = int_list_setting(metadata, "dev_lengths", default_lengths(metadata, "dev_lengths", (4096,), task), task)
    check_lengths(metadata, lengths, task, "dev_lengths")
    samples = int_setting(metadata, "dev_samples", DEFAULT_SAMPLES, task)
    seed = int_setting(metadata, "dev_seed", DEFAULT_SEED, task, minimum=0)
    if seed in TEST_SEEDS:
        raise ValueError(
            f"{task}: metadata 'dev_seed' = {seed} draws bosch_niah's test documents (the eval seeds of test draws: "
            f"{', '.join(map(str, TEST_SEEDS))}); a development split needs another seed"
        )
    variants = chosen_variants(metadata.get("dev_variants"), task)
    return [
        (variant, length, eval_suite.example(variant, tokenizer, length, index, seed))
        for index in range(samples)
        for length in lengths
        for variant in variants
    ]


def chosen_variants(value: Any, task: str = TASK) -> tuple[str, ...]:
    """``dev_variants`` (a list, or a comma-separated string, of short names) as full variant
    names in the order of :data:`CHOOSABLE`; None: :data:`DEFAULT_FORMATS`."""
    if value is None:
        return DEFAULT_FORMATS
    short = {variant.removeprefix("bosch_niah_"): variant for variant in CHOOSABLE}
    names = value.split(",") if isinstance(value, str) else value
    if (
        not isinstance(names, (list, tuple))
        or not names
        or not all(isinstance(name, str) and name.strip() in short for name in names)
    ):
        raise ValueError(f"{task}: metadata 'dev_variants' must list some of {sorted(short)}, got {value!r}")
    wanted = {short[name.strip()] for name in names}
    return tuple(variant for variant in CHOOSABLE if variant in wanted)
