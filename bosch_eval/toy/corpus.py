"""Training text for the toy model: local structure plus needle retrieval.

Every document is a list of ``(text, is_answer)`` pieces; answer pieces are the tokens
the model is trained hardest on (values recalled from far back in the context). Three
kinds of documents:

* ``short_recall`` / ``recall``: dense multi-query associative recall (every key queried;
  one-noun keys and 3-digit values first, then RULER-like keys and values) — the
  cheapest way to grow induction/retrieval heads;
* ``ruler``: RULER's NIAH formats (``niah_single_*``, ``niah_multikey_*``: repeated
  noise or generated-essay haystacks, word/number/UUID keys and values) ending in the
  question and ``gen_prefix`` exactly as lm-eval's ``ruler`` tasks render them;
  ``niah_single_1`` is that one variant alone (the one the model card is scored on);
* ``calib``: documents in the format of ``bosch_niah_calib`` (ship's-ledger haystack,
  one "vault code" needle, the task's query), so the search has a calibration set the
  model can solve with full attention;
* ``prose``: generated sentences, for spelling and short-range structure.

Keys and values are drawn from ``random.Random(seed)``; the trainer uses seeds from
``TRAIN_SEED_BASE`` upwards. The calibration task seeds its examples with the string
``"bosch_niah_calib/<calib_seed>/<seq_len>/<index>"`` and RULER/the eval suite with
their own integer seeds, so no training document comes from an evaluation stream.
"""

from __future__ import annotations

import random
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from bosch_eval.tasks.niah import calibration, words

TRAIN_SEED_BASE = 10_000_000

# RULER's pieces (lm_eval/tasks/ruler/prepare_niah.py, niah_utils.py), rendered the same way.
RULER_NOISE = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."
RULER_NEEDLE = "One of the special magic {kind} for {key} is: {value}."
RULER_TEMPLATE = (
    "Some special magic {kinds} are hidden within the following text. Make sure to memorize it. "
    "I will quiz you about the {kinds} afterwards.\n{context}\nWhat are all the special magic {kinds} for {query} "
    "mentioned in the provided text?"
)
RULER_PREFIX = "The special magic {kinds} for {query} mentioned in the provided text are"

Piece = tuple[str, bool]


@cache
def word_lists() -> tuple[list[str], list[str], list[str]]:
    """Adjectives, nouns and verbs of ``wonderwords`` (the lists RULER draws keys from)."""
    import wonderwords

    assets = Path(wonderwords.__file__).parent / "assets"
    read = lambda name: sorted({w.strip() for w in (assets / name).read_text().split("\n") if w.strip().isalpha()})  # noqa: E731
    return read("adjectivelist.txt"), read("nounlist.txt"), read("verblist.txt")


@dataclass
class DocumentMaker:
    """Draws documents of roughly ``length`` tokens (``tokens_per_char`` estimates)."""

    rng: random.Random
    chars_per_token: float = 3.0

    # -- atoms -------------------------------------------------------------------------
    def word_key(self) -> str:
        adjectives, nouns, _ = word_lists()
        return f"{self.rng.choice(adjectives)}-{self.rng.choice(nouns)}"

    def number(self) -> str:
        return str(self.rng.randint(1_000_000, 9_999_999))

    def uuid(self) -> str:
        return str(uuid.UUID(int=self.rng.getrandbits(128), version=4))

    def value(self, kind: str) -> str:
        return {"numbers": self.number, "words": lambda: self.rng.choice(word_lists()[1]), "uuids": self.uuid}[kind]()

    def sentence(self) -> str:
        adjectives, nouns, verbs = word_lists()
        pick = self.rng.choice
        return f"The {pick(adjectives)} {pick(nouns)} {pick(verbs)}s the {pick(nouns)}."

    # -- documents -----------------------------------------------------------------------
    def prose(self, length: int) -> list[Piece]:
        sentences = [self.sentence() for _ in range(max(1, int(length * self.chars_per_token / 40)))]
        return [(" ".join(sentences), False)]

    def recall(self, length: int) -> list[Piece]:
        """Long-form associative recall: ``adj-noun: 7 digits`` pairs, then queries."""
        return self._recall(length, self.word_key, self.number)

    def short_recall(self, length: int) -> list[Piece]:
        """Short keys (one noun) and values (three digits): the first retrieval skill to learn."""
        nouns = word_lists()[1]
        return self._recall(length, lambda: self.rng.choice(nouns), lambda: str(self.rng.randint(100, 999)))

    def _recall(self, length: int, key: Callable[[], str], value: Callable[[], str]) -> list[Piece]:
        """``key: value`` lines, then every key queried once in random order (dense supervision)."""
        n_pairs = max(2, int(length * self.chars_per_token / 40))
        pairs = list({key(): value() for _ in range(n_pairs)}.items())
        pieces: list[Piece] = [("\n".join(f"{k}: {v}" for k, v in pairs) + "\n", False)]
        for k, v in self.rng.sample(pairs, k=len(pairs)):
            pieces += [(f"{k}?", False), (f" {v}", True), ("\n", False)]
        return pieces

    def niah_single_1(self, length: int) -> list[Piece]:
        """RULER's ``niah_single_1`` (noise haystack, word key, 7-digit value) alone."""
        return self.ruler(length, variant="single_1")

    def ruler(self, length: int, variant: str | None = None) -> list[Piece]:
        """One of RULER's NIAH variants (random unless named) with its question and ``gen_prefix``."""
        variant = variant or self.rng.choice(["single_1", "single_2", "single_3", "multikey_1", "multikey_2", "multikey_3"])
        haystack = "noise" if variant in ("single_1", "multikey_1") else "needles" if variant == "multikey_2" else "essay"
        key_kind = "uuids" if variant == "multikey_3" else "words"
        value_kind = "uuids" if variant in ("single_3", "multikey_3") else "numbers"
        n_keys = 1 if variant.startswith("single") else self.rng.randint(2, 4)
        keys = [self.uuid() if key_kind == "uuids" else self.word_key() for _ in range(n_keys)]
        values = [self.value(value_kind) for _ in keys]
        needles = [RULER_NEEDLE.format(kind=value_kind, key=k, value=v) for k, v in zip(keys, values, strict=True)]

        budget_chars = int(length * self.chars_per_token) - 400
        if haystack == "noise":
            lines = [RULER_NOISE] * max(1, budget_chars // (len(RULER_NOISE) + 1))
        elif haystack == "needles":
            filler = budget_chars // 60
            lines = [RULER_NEEDLE.format(kind=value_kind, key=self.word_key(), value=self.value(value_kind)) for _ in range(filler)]
        else:
            lines = [self.sentence() for _ in range(max(1, budget_chars // 40))]
        for needle in needles:
            lines.insert(self.rng.randint(0, len(lines)), needle)

        query_index = self.rng.randrange(n_keys)
        singular = value_kind[:-1]
        # lm-eval's prepare_niah turns the template (not the needles) singular when one value is asked for.
        template = RULER_TEMPLATE.replace("Some", "A").replace("are all", "is").replace("are", "is")
        question = template.format(kinds=singular, context="\n".join(lines), query=keys[query_index])
        prefix = RULER_PREFIX.format(kinds=singular, query=keys[query_index]).replace(" are", " is")
        return [(f"{question} {prefix}", False), (f" {values[query_index]}", True), (".", False)]

    def calib(self, length: int) -> list[Piece]:
        """A ``bosch_niah_calib``-format example: ledger haystack, one needle at a random depth."""
        key = f"{self.rng.choice(words.CALIB_GIVEN_NAMES)} {self.rng.choice(words.CALIB_FAMILY_NAMES)}"
        value = str(self.rng.randint(100_000, 999_999))
        sentences = [calibration.ledger_sentence(self.rng) for _ in range(max(1, (int(length * self.chars_per_token) - 300) // 60))]
        sentences.insert(self.rng.randint(0, len(sentences)), calibration.NEEDLE.format(key=key, value=value))
        prompt = f"{calibration.INSTRUCTION}\n{' '.join(sentences)}\n{calibration.QUERY.format(key=key)}"
        return [(prompt, False), (f" {value}", True), (".", False)]

    def document(self, length: int, mix: dict[str, float]) -> list[Piece]:
        kind = self.rng.choices(list(mix), weights=list(mix.values()))[0]
        return getattr(self, kind)(length)
