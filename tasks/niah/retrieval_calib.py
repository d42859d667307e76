"""``bosch_retrieval_calib``: a calibration set that measures key-conditioned retrieval.

Why a second calibration set (issue 29): ``bosch_niah_calib`` holds one number in a
haystack with no other digits, and its query repeats the needle's wording, so a model can
answer it by copying "the only number" after "The vault code of <key> is" without matching
the key (three distractor needles in that format take full attention to chance on toy-l:
``results/calibration/README.md``). A search on such a set keeps the heads of that shortcut and loses held-out retrieval.

Here every example needs the key to find its value:

* the question never repeats a needle's wording ("Question: what is the permit number of
  <key>?"); the needles say "<key> was issued permit <value>." and others;
* the prompt ends with the start of the answer ("Answer: The permit number of <key> is"),
  so the next tokens are the value: ending at "Answer:" lets an instruction-tuned model
  answer in a sentence, and a greedy-prefix metric then scores the answer style, not retrieval
  (version 1 did; ``results/smollm2/calibration_probe.md``). RULER's prompts end with such a
  ``gen_prefix`` for the same reason;
* the haystack is full of distractor values (numbers of the same shape in routine
  entries), so the only-number shortcut fails;
* a mix of kinds, by example index (``kinds``, default ``single, single, multikey``):
  ``single`` (one needle among distractor values), ``multikey`` (``distractor_keys`` more
  needles with other keys, default 1) and ``multivalue`` (the key holds two permits, both
  asked for in the order they appear, plus one needle with another key). A kind may repeat
  to weigh it. The default is the mix with the most other-key examples whose full-attention
  score on a development draw stays at least 0.85 (the check's 0.8 plus a standard error at
  64 examples) on a real 135M model (``results/smollm2/calibration_probe.md``);
* the asked needle's depth is stratified over the examples, the others uniform;
* a third vocabulary (a botanic garden's registry, ``words.RETRIEVAL_*``), 5-digit values
  (the eval suite uses 7, ``bosch_niah_calib`` 6) and string seeds of its own: nothing is
  shared with the eval suite, and no bundled model's training mix uses this format.

Scored like ``bosch_niah_calib``: prefill only, an example counts when every answer token
is the greedy prediction (lm-eval's loglikelihood ``acc``). Metadata: ``seq_len`` (default:
the model's ``bosch_defaults.json`` ``calib_len``, else 32768), ``num_examples`` (64),
``calib_seed`` (0); see ``calibration.py``; ``kinds`` (a list or comma-separated string of
:data:`KINDS`) and ``distractor_keys`` (other keys' needles in a ``multikey`` example).
"""

from __future__ import annotations

import random
from functools import cache
from typing import Any

import datasets
from transformers import PreTrainedTokenizerBase

from bosch_eval.tasks.niah import words
from bosch_eval.tasks.niah.haystack import Haystack, fit
from bosch_eval.tasks.niah.metadata import calibration_settings, int_setting

TASK = "bosch_retrieval_calib"
KINDS = ("single", "multikey", "multivalue")
DEFAULT_KINDS = ("single", "single", "multikey")  # example i is kinds[i % len(kinds)]
DEFAULT_DISTRACTOR_KEYS = 1

INSTRUCTION = "Below is a page from a botanic garden's registry. Some lines record permits issued to people."
NEEDLES = (
    "{key} was issued permit {value}.",
    "Permit {value} went to {key}.",
    "The registry lists {key} with permit {value}.",
)
QUERY = {
    "single": "Question: what is the permit number of {key}?\nAnswer: The permit number of {key} is",
    "multikey": "Question: what is the permit number of {key}?\nAnswer: The permit number of {key} is",
    "multivalue": "Question: what are the two permit numbers of {key}, in the order they appear?\n"
    "Answer: The two permit numbers of {key} are",
}
_ENTRIES = (
    "The {staff} {task} tray {number} of {plant} in the {house}.",
    "Tray {number} of {plant} moved from the {house} to the {house2}.",
    "The {staff} {task} the {plant} beds by the {house}.",
    "Seed packet {number} of {plant} was filed in the {house}.",
    "Mist settled over the {plant} in the {house}.",
    "The {staff} counted the {plant} cuttings in the {house}.",
)


def dataset(**metadata: Any) -> dict[str, datasets.Dataset]:
    """lm-eval ``custom_dataset``: the calibration examples as the ``test`` split."""
    return {"test": datasets.Dataset.from_list(list(calibration_examples(metadata)))}


def calibration_examples(
    metadata: dict[str, Any], tokenizer: PreTrainedTokenizerBase | None = None
) -> tuple[dict[str, Any], ...]:
    """The examples the task's ``metadata`` asks for, in ``tokenizer``'s tokens (default: the
    one ``metadata`` names), as ``calibration_sets.py`` reads a calibration set's generator."""
    kinds = kinds_setting(metadata)
    distractor_keys = int_setting(metadata, "distractor_keys", DEFAULT_DISTRACTOR_KEYS, TASK)
    return examples(**calibration_settings(metadata, TASK, tokenizer), kinds=kinds, distractor_keys=distractor_keys)


def kinds_setting(metadata: dict[str, Any]) -> tuple[str, ...]:
    """``metadata['kinds']`` as a tuple of :data:`KINDS` (a list or a comma-separated string)."""
    value = metadata.get("kinds", DEFAULT_KINDS)
    kinds = tuple(item.strip() for item in value.split(",")) if isinstance(value, str) else tuple(value)
    if not kinds or any(kind not in KINDS for kind in kinds):
        raise ValueError(f"{TASK}: metadata 'kinds' must list some of {list(KINDS)}, got {value!r}")
    return kinds


@cache
def examples(
    tokenizer: PreTrainedTokenizerBase,
    seq_len: int,
    num_examples: int,
    seed: int,
    kinds: tuple[str, ...] = DEFAULT_KINDS,
    distractor_keys: int = DEFAULT_DISTRACTOR_KEYS,
) -> tuple[dict[str, Any], ...]:
    """All examples, cached: the search rebuilds the task for each of its S(z) calls."""
    return tuple(
        _example(tokenizer, seq_len, index, num_examples, seed, kinds[index % len(kinds)], distractor_keys)
        for index in range(num_examples)
    )


def _example(
    tokenizer: PreTrainedTokenizerBase,
    seq_len: int,
    index: int,
    num_examples: int,
    seed: int,
    kind: str,
    distractor_keys: int,
) -> dict[str, Any]:
    rng = random.Random(f"{TASK}/{seed}/{seq_len}/{index}")
    keys = _distinct_keys(rng, 1 + distractor_keys if kind == "multikey" else 2 if kind == "multivalue" else 1)
    asked = keys[0]
    # (key, value) of every needle; the asked key's needles come first, two for multivalue
    pairs = [(asked, _value(rng))] + ([(asked, _value(rng))] if kind == "multivalue" else [])
    pairs += [(key, _value(rng)) for key in keys[1:]]
    values = {value for _, value in pairs}
    needles = [rng.choice(NEEDLES).format(key=key, value=value) for key, value in pairs]
    depth = (index + rng.random()) / num_examples  # stratified: every depth band gets its examples
    depths = [depth] + [rng.random() for _ in pairs[1:]]
    asked_values = [
        value for (key, value), _ in sorted(zip(pairs, depths, strict=True), key=lambda p: p[1]) if key == asked
    ]
    target = " and ".join(asked_values)
    haystack = Haystack.grow(lambda: registry_entry(rng, values), tokenizer, seq_len, split_words=True)

    def prompt(n: int) -> str:
        return f"{INSTRUCTION}\n{haystack.text(n, needles, depths)}\n{QUERY[kind].format(key=asked)}"

    what = f"{TASK} at seq_len={seq_len}"
    n, length = fit(lambda n: f"{prompt(n)} {target}", tokenizer, haystack.costs, seq_len, what)
    return {
        "input": prompt(n),
        "target": target,
        "key": asked,
        "kind": kind,
        "depth": depth,
        "length": length,
        "seq_len": seq_len,
        "num_examples": num_examples,
    }


def _distinct_keys(rng: random.Random, count: int) -> list[str]:
    keys: list[str] = []
    while len(keys) < count:
        key = f"{rng.choice(words.RETRIEVAL_GIVEN_NAMES)} {rng.choice(words.RETRIEVAL_FAMILY_NAMES)}"
        if key not in keys:
            keys.append(key)
    return keys


def _value(rng: random.Random) -> str:
    return str(rng.randint(10_000, 99_999))


def registry_entry(rng: random.Random, needle_values: set[str]) -> str:
    """One routine registry line; its numbers have the values' shape but are never one of them."""
    pick = rng.choice
    number = _value(rng)
    while number in needle_values:
        number = _value(rng)
    return pick(_ENTRIES).format(
        staff=pick(words.RETRIEVAL_STAFF),
        task=pick(words.RETRIEVAL_TASKS),
        number=number,
        plant=pick(words.RETRIEVAL_PLANTS),
        house=pick(words.RETRIEVAL_HOUSES),
        house2=pick(words.RETRIEVAL_HOUSES),
    )
