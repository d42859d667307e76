"""``bosch_niah_calib``: the calibration set of the BOSCH search (paper §3.3, B.4).

Synthetic needle-in-a-haystack, scored prefill-only: an example counts when every
answer token is the greedy prediction (lm-eval's loglikelihood ``acc``), and the
score S(M, z, D) is the mean over examples. Each example is a ship's ledger (generated
here, nothing is downloaded) holding one needle, "The vault code of <name> is
<6 digits>.", at a depth stratified over the examples, then the query; the target is
the value, with the space a model writes before it.

Metadata (``--metadata`` JSON, or ``TaskManager(metadata=...)``):

* ``seq_len`` (default: the model's ``bosch_defaults.json`` ``calib_len``, else 32768):
  prompt + answer tokens in the model's tokenizer; each example lands within one haystack
  word below it, never above. A length past the model's ``max_position_embeddings`` is an
  error unless ``ignore_max_positions`` is true;
* ``num_examples`` (default 64, as in the paper);
* ``calib_seed`` (default 0): the examples are a function of it, the length and the
  tokenizer;
* ``calib_query`` (default ``repeat``) and ``calib_distractors`` (default 0): diagnosis
  variants (issue 29, ``results/calibration``). ``plain`` ends the query with "Reply: The
  code is" instead of repeating the needle's wording; ``calib_distractors`` adds that many
  needles with other keys and values. The defaults are the calibration set as it was;
* ``calib_values`` (default ``digits``): ``uuid`` makes every value a random 128-bit code
  written as a UUID (8-4-4-4-12 hex digits) instead of 6 digits. The answer is then several
  times as many tokens to copy, a skill the digits barely ask for, so masks the digits tie
  can differ on it (results/smollm2/README.md). ``words`` makes it two code words joined by
  a hyphen ("capstan-fathom"). ``mixed`` draws every value format a NIAH test uses, in both
  of its haystack kinds: example ``i`` takes format ``MIXED_FORMATS[i % 6]``, digits, words
  or a UUID, in the ledger's prose or in a repeated noise line (issue 67: a format the
  calibration never asks for is a skill the search is free to throw away).

Nothing is shared with the eval suite (``eval_suite.py``, RULER's format): other keys
(made-up names, not adjective-noun pairs), other values (6 digits, not 7), other
phrasing and another haystack vocabulary (``words.py``).
"""

from __future__ import annotations

import random
import uuid
from functools import cache
from typing import Any

import datasets
from transformers import PreTrainedTokenizerBase

from bosch_eval.tasks.niah import words
from bosch_eval.tasks.niah.haystack import Haystack, fit
from bosch_eval.tasks.niah.metadata import calibration_settings, int_setting

TASK = "bosch_niah_calib"

INSTRUCTION = (
    "Below is a page from a ship's ledger. A single line in it gives the vault code of a passenger; "
    "keep it in mind for the closing query."
)
NOISE_INSTRUCTION = (
    "Below is a page of the night watch's log. A single line in it gives the vault code of a passenger; "
    "keep it in mind for the closing query."
)
INSTRUCTIONS = {"ledger": INSTRUCTION, "noise": NOISE_INSTRUCTION}
NEEDLE = "The vault code of {key} is {value}."
QUERY = "Query: which vault code belongs to {key}?\nReply: The vault code of {key} is"
PLAIN_QUERY = "Query: which vault code belongs to {key}?\nReply: The code is"
QUERIES = {"repeat": QUERY, "plain": PLAIN_QUERY}
VALUES = ("digits", "words", "uuid", "mixed")
# ``mixed``'s cycle: (haystack, value kind), prose and noise as the test formats have them.
MIXED_FORMATS = tuple((haystack, kind) for haystack in ("ledger", "noise") for kind in ("digits", "words", "uuid"))

_LEDGER = (
    "At {time} the {vessel} weighed anchor at {port} laden with {cargo}.",
    "The {crew} counted {count} barrels of {cargo} in the hold of the {vessel}.",
    "A {weather} kept the {vessel} off {port} for {count} days.",
    "The {crew} of the {vessel} bartered {cargo} for {cargo2} at {port}.",
    "Harbour dues at {port} were settled in {cargo}.",
    "By {time} the {vessel} had rounded the headland beyond {port}.",
    "The {crew} reported {weather} and a falling glass near {port}.",
    "Rations of {cargo} were issued to the crew of the {vessel} at {time}.",
)


def dataset(**metadata: Any) -> dict[str, datasets.Dataset]:
    """lm-eval ``custom_dataset``: the calibration examples as the ``test`` split."""
    return {"test": datasets.Dataset.from_list(list(calibration_examples(metadata)))}


def calibration_examples(
    metadata: dict[str, Any], tokenizer: PreTrainedTokenizerBase | None = None
) -> tuple[dict[str, Any], ...]:
    """The examples the task's ``metadata`` asks for, in ``tokenizer``'s tokens (default: the
    one ``metadata`` names): what makes this module a calibration set's generator
    (``calibration_sets.py``), so the rankers read the documents S() scores."""
    return examples(
        **calibration_settings(metadata, TASK, tokenizer),
        query=_query_setting(metadata),
        distractors=int_setting(metadata, "calib_distractors", 0, TASK, minimum=0),
        values=_values_setting(metadata),
    )


@cache
def examples(
    tokenizer: PreTrainedTokenizerBase,
    seq_len: int,
    num_examples: int,
    seed: int,
    query: str = "repeat",
    distractors: int = 0,
    values: str = "digits",
) -> tuple[dict[str, Any], ...]:
    """All examples, cached: the search rebuilds the task for each of its thousands of S(z) calls."""
    return tuple(
        _example(tokenizer, seq_len, index, num_examples, seed, query, distractors, values)
        for index in range(num_examples)
    )


def _example(
    tokenizer: PreTrainedTokenizerBase,
    seq_len: int,
    index: int,
    num_examples: int,
    seed: int,
    query: str,
    distractors: int,
    values: str,
) -> dict[str, Any]:
    # The digits keep their seed string, so the default examples are the calibration set as it was.
    rng = random.Random(f"{TASK}/{seed}/{seq_len}/{index}" + ("" if values == "digits" else f"/{values}"))
    haystack_kind, kind = MIXED_FORMATS[index % len(MIXED_FORMATS)] if values == "mixed" else ("ledger", values)
    key = f"{rng.choice(words.CALIB_GIVEN_NAMES)} {rng.choice(words.CALIB_FAMILY_NAMES)}"
    value = _value(rng, kind)
    depth = (index + rng.random()) / num_examples  # stratified: every depth band gets its examples
    needles, depths = [NEEDLE.format(key=key, value=value)], [depth]
    others: set[str] = {key}
    while len(others) <= distractors:  # drawn after the default example's draws, so distractors=0 is unchanged
        other = f"{rng.choice(words.CALIB_GIVEN_NAMES)} {rng.choice(words.CALIB_FAMILY_NAMES)}"
        if other not in others:
            others.add(other)
            needles.append(NEEDLE.format(key=other, value=_value(rng, kind)))
            depths.append(rng.random())
    sentence = (lambda: ledger_sentence(rng)) if haystack_kind == "ledger" else (lambda: words.CALIB_NOISE[0])
    haystack = Haystack.grow(sentence, tokenizer, seq_len, split_words=True)

    def prompt(n: int) -> str:
        return f"{INSTRUCTIONS[haystack_kind]}\n{haystack.text(n, needles, depths)}\n{QUERIES[query].format(key=key)}"

    what = f"{TASK} at seq_len={seq_len}"
    n, length = fit(lambda n: f"{prompt(n)} {value}", tokenizer, haystack.costs, seq_len, what)
    return {
        "input": prompt(n),
        "target": value,
        "key": key,
        "depth": depth,
        "length": length,
        "seq_len": seq_len,
        "num_examples": num_examples,
        "format": f"{kind} in {haystack_kind}",
    }


def _query_setting(metadata: dict[str, Any]) -> str:
    query = metadata.get("calib_query", "repeat")
    if query not in QUERIES:
        raise ValueError(f"{TASK}: metadata 'calib_query' must be one of {sorted(QUERIES)}, got {query!r}")
    return query


def _values_setting(metadata: dict[str, Any]) -> str:
    values = metadata.get("calib_values", "digits")
    if values not in VALUES:
        raise ValueError(f"{TASK}: metadata 'calib_values' must be one of {list(VALUES)}, got {values!r}")
    return values


def _value(rng: random.Random, kind: str) -> str:
    """A needle's value: 6 digits (the eval suite's are 7), two code words, or 128 random bits in UUID layout."""
    if kind == "uuid":
        return str(uuid.UUID(int=rng.getrandbits(128)))
    if kind == "words":
        first, second = rng.sample(words.CALIB_CODE_WORDS, 2)
        return f"{first}-{second}"
    return str(rng.randint(100_000, 999_999))


def ledger_sentence(rng: random.Random) -> str:
    """One routine ledger entry (no digits, so the needle's value is the only number)."""
    pick = rng.choice
    return pick(_LEDGER).format(
        time=pick(words.CALIB_TIMES),
        vessel=pick(words.CALIB_VESSELS),
        port=pick(words.CALIB_PORTS),
        cargo=pick(words.CALIB_CARGO),
        cargo2=pick(words.CALIB_CARGO),
        crew=pick(words.CALIB_CREW),
        count=pick(words.CALIB_COUNTS),
        weather=pick(words.CALIB_WEATHER),
    )
