"""``bosch_niah``: RULER's six NIAH tasks of the paper (§3.5, B.6), generated offline.

Each task mirrors lm-eval's ``ruler/niah_utils.py`` + ``prepare_niah.py`` (see
:data:`NIAH_FORMATS`): the same prompt template, needle sentence, ``gen_prefix``, 128-token
generation budget and scoring (an answer counts when it appears in the output, RULER's
``string_match_all``, imported from lm-eval). What differs, and why:

* haystack ``essay``: RULER downloads Paul Graham's essays; we generate essay-like
  sentences from word lists (``words.py``), so nothing is downloaded;
* keys: RULER draws ``adjective-noun`` keys from ``wonderwords``; we draw them from our
  own lists, disjoint from the calibration set's vocabulary;
* needle depths are drawn from RULER's 40 essay depths for every haystack type, and a
  prompt is sized in tokens to within one haystack unit of its budget (``haystack.py``);
* documents interleave the lengths (index-major), so ``--limit`` samples all of them.

Scores: per length (metric ``"<length>"``) and ``score``, the mean over lengths of the
per-length means (the paper's per-task number); the groups ``bosch_niah_single`` /
``bosch_niah_multikey`` / ``bosch_niah`` average tasks with equal weights.

Metadata: ``max_seq_lengths`` (default: the model's ``bosch_defaults.json`` ``calib_len``,
else 4096...32768; prompt + 128 generated tokens; none past the model's maximum),
``num_samples`` (default 500 per length, RULER's), ``eval_seed`` (default 0).
"""

from __future__ import annotations

import random
import uuid
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from statistics import mean
from typing import Any

import datasets
from lm_eval.tasks.ruler.common_utils import postprocess_pred, string_match_all
from transformers import PreTrainedTokenizerBase

from bosch_eval.tasks.niah import words
from bosch_eval.tasks.niah.haystack import Haystack, fit
from bosch_eval.tasks.niah.metadata import (
    check_lengths,
    default_lengths,
    int_list_setting,
    int_setting,
    model_tokenizer,
)

DEFAULT_LENGTHS = (4096, 8192, 16384, 32768)
DEFAULT_NUM_SAMPLES = 500
DEFAULT_SEED = 0
GEN_TOKENS = 128  # generation_kwargs.max_gen_toks in _bosch_niah_eval.yaml; reserved in every length

# RULER's template after its own rewrite for a single queried value (prepare_niah.py).
TEMPLATE = (
    "A special magic {kind} is hidden within the following text. Make sure to memorize it. "
    "I will quiz you about the {kind} afterwards.\n{context}\n"
    "What is the special magic {kind} for {query} mentioned in the provided text?"
)
NEEDLE = "One of the special magic {kinds} for {key} is: {value}."
GEN_PREFIX = "The special magic {kind} for {query} mentioned in the provided text is"
NOISE = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."
DEPTHS = tuple(round(100 * i / 39) / 100 for i in range(40))  # RULER: np.linspace(0, 100, 40), rounded

_ESSAY = (
    "{opener} {people} {adverb} {verb} {things}.",
    "{People} {verb} {things} {link} {people2} {verb2} {things2}.",
    "The {quality} thing about {things} is that {people} {adverb} {verb} them.",
    "It is easy to {verb} {things}, but {people} {adverb} {verb2} {things2}.",
    "Most {people} never {verb} {things}.",
    "If you {verb} {things}, you will {verb2} {things2}.",
)


@dataclass(frozen=True)
class NiahFormat:
    """One RULER NIAH task: haystack type, key and value types, needles in the text."""

    haystack: str  # "repeat" (RULER's noise lines), "essay" (prose words), "needle" (distractor needles)
    key_kind: str  # "words" or "uuids"
    value_kind: str  # "numbers" or "uuids"
    num_keys: int = 1  # needles with distinct keys; one of them is asked for


NIAH_FORMATS: dict[str, NiahFormat] = {
    "bosch_niah_single_1": NiahFormat("repeat", "words", "numbers"),
    "bosch_niah_single_2": NiahFormat("essay", "words", "numbers"),
    "bosch_niah_single_3": NiahFormat("essay", "words", "uuids"),
    "bosch_niah_multikey_1": NiahFormat("essay", "words", "numbers", num_keys=4),
    "bosch_niah_multikey_2": NiahFormat("needle", "words", "numbers"),
    "bosch_niah_multikey_3": NiahFormat("needle", "uuids", "uuids"),
}


_HAYSTACK_WORDS = {"repeat": "in noise", "essay": "in prose", "needle": "among needles"}
_VALUE_WORDS = {"numbers": "numbers", "uuids": "UUIDs"}


def value_format(task: str) -> str | None:
    """What a NIAH task asks, in words ("UUIDs in prose"), for ``bosch_niah_*`` and RULER's
    ``niah_*`` of the same name (ours mirror them); None for any other task."""
    variant = NIAH_FORMATS.get(task) or NIAH_FORMATS.get(f"bosch_{task}")
    if variant is None:
        return None
    text = f"{_VALUE_WORDS[variant.value_kind]} {_HAYSTACK_WORDS[variant.haystack]}"
    if variant.num_keys > 1:
        text += f", {variant.num_keys} keys"
    return text + (", UUID keys" if variant.key_kind == "uuids" else "")


# lm-eval ``custom_dataset`` entry points, one per task YAML.
def single_1(**metadata: Any) -> dict[str, datasets.Dataset]:
    return dataset("bosch_niah_single_1", metadata)


def single_2(**metadata: Any) -> dict[str, datasets.Dataset]:
    return dataset("bosch_niah_single_2", metadata)


def single_3(**metadata: Any) -> dict[str, datasets.Dataset]:
    return dataset("bosch_niah_single_3", metadata)


def multikey_1(**metadata: Any) -> dict[str, datasets.Dataset]:
    return dataset("bosch_niah_multikey_1", metadata)


def multikey_2(**metadata: Any) -> dict[str, datasets.Dataset]:
    return dataset("bosch_niah_multikey_2", metadata)


def multikey_3(**metadata: Any) -> dict[str, datasets.Dataset]:
    return dataset("bosch_niah_multikey_3", metadata)


def dataset(task: str, metadata: dict[str, Any]) -> dict[str, datasets.Dataset]:
    """lm-eval ``custom_dataset`` of ``task``: every length's examples as the ``test`` split."""
    tokenizer = model_tokenizer(metadata, task)
    default = default_lengths(metadata, "max_seq_lengths", DEFAULT_LENGTHS, task)
    lengths = int_list_setting(metadata, "max_seq_lengths", default, task)
    check_lengths(metadata, lengths, task, "max_seq_lengths")
    num_samples = int_setting(metadata, "num_samples", DEFAULT_NUM_SAMPLES, task)
    seed = int_setting(metadata, "eval_seed", DEFAULT_SEED, task, minimum=0)
    docs = [example(task, tokenizer, length, index, seed) for index in range(num_samples) for length in lengths]
    return {"test": datasets.Dataset.from_list(docs)}


def example(task: str, tokenizer: PreTrainedTokenizerBase, max_length: int, index: int, seed: int) -> dict[str, Any]:
    """Example ``index`` of ``task`` at ``max_length`` tokens (prompt + ``GEN_TOKENS``)."""
    variant = NIAH_FORMATS[task]
    rng = random.Random(f"{task}/{seed}/{max_length}/{index}")
    keys = _distinct(lambda: _draw(rng, variant.key_kind), variant.num_keys)
    values = [_draw(rng, variant.value_kind) for _ in keys]
    pairs = zip(keys, values, strict=True)
    needles = [NEEDLE.format(kinds=variant.value_kind, key=key, value=value) for key, value in pairs]
    depths = rng.sample(DEPTHS, len(needles))
    asked = rng.randrange(len(keys))
    kind = variant.value_kind[:-1]
    gen_prefix = GEN_PREFIX.format(kind=kind, query=keys[asked])
    budget = max_length - GEN_TOKENS
    haystack = Haystack.grow(_sentences(rng, variant, frozenset(keys)), tokenizer, budget, variant.haystack == "essay")

    def prompt(n: int) -> str:
        return TEMPLATE.format(kind=kind, context=haystack.text(n, needles, depths), query=keys[asked])

    what = f"{task} at {max_length} tokens less {GEN_TOKENS} to generate"
    n, length = fit(lambda n: f"{prompt(n)} {gen_prefix}", tokenizer, haystack.costs, budget, what)
    return {
        "input": prompt(n),
        "outputs": [values[asked]],
        "gen_prefix": gen_prefix,
        "query": keys[asked],
        "max_length": max_length,
        "length": length + GEN_TOKENS,
    }


def _draw(rng: random.Random, kind: str) -> str:
    if kind == "numbers":
        return str(rng.randint(1_000_000, 9_999_999))  # RULER's 7 digits
    if kind == "uuids":
        return str(uuid.UUID(int=rng.getrandbits(128), version=4))
    return f"{rng.choice(words.EVAL_KEY_ADJECTIVES)}-{rng.choice(words.EVAL_KEY_NOUNS)}"


def _distinct(draw: Callable[[], str], count: int, exclude: frozenset[str] = frozenset()) -> list[str]:
    out: list[str] = []
    while len(out) < count:
        if (item := draw()) not in exclude and item not in out:
            out.append(item)
    return out


def _sentences(rng: random.Random, variant: NiahFormat, keys: frozenset[str]) -> Callable[[], str]:
    """The haystack's sentence source: noise lines, essay sentences, or distractor needles."""
    if variant.haystack == "repeat":
        return lambda: NOISE
    if variant.haystack == "essay":
        return lambda: essay_sentence(rng)

    def distractor() -> str:  # never with one of the needles' keys
        (key,) = _distinct(lambda: _draw(rng, variant.key_kind), 1, keys)
        return NEEDLE.format(kinds=variant.value_kind, key=key, value=_draw(rng, variant.value_kind))

    return distractor


def essay_sentence(rng: random.Random) -> str:
    """One essay-like sentence (RULER's essays are downloaded; these are generated)."""
    pick = rng.choice
    people = pick(words.ESSAY_PEOPLE)
    return pick(_ESSAY).format(
        opener=pick(words.ESSAY_OPENERS),
        people=people,
        People=people.capitalize(),
        people2=pick(words.ESSAY_PEOPLE),
        adverb=pick(words.ESSAY_ADVERBS),
        verb=pick(words.ESSAY_VERBS),
        verb2=pick(words.ESSAY_VERBS),
        things=pick(words.ESSAY_THINGS),
        things2=pick(words.ESSAY_THINGS),
        link=pick(words.ESSAY_LINKS),
        quality=pick(words.ESSAY_QUALITIES),
    )


def process_results(doc: dict[str, Any], results: list[str]) -> dict[str, Any]:
    """RULER's score of one output, under the doc's length and, with its length, under ``score``."""
    score = string_match_all(postprocess_pred(results), [doc["outputs"]])
    return {str(doc["max_length"]): score, "score": (doc["max_length"], score)}


def mean_over_lengths(items: list[tuple[int, float]]) -> float:
    """Mean of the per-length means: each length weighs the same, however many docs it has."""
    by_length: dict[int, list[float]] = defaultdict(list)
    for length, score in items:
        by_length[length].append(score)
    return mean(mean(scores) for scores in by_length.values())
