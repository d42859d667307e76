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
* ``keyed``: key-conditioned retrieval in many formats (issue 29): records that tie a
  made-up name to a number, key first or value first, among records of other names and
  filler full of numbers of the same shape; one, several or two values asked for. It
  teaches matching the key instead of copying the only number, without using any
  calibration set's format: no "Question:"/"Answer:", record and question templates of
  their own, and names (syllables) and record nouns that are in no word list of
  ``tasks/niah/words.py`` (the filler is ``prose``'s generated sentences with numbers);
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
DOCUMENT_KINDS = (
    "prose",
    "recall",
    "short_recall",
    "niah_single_1",
    "ruler",
    "calib",
    "keyed",
)  # DocumentMaker.document's

# RULER's pieces (lm_eval/tasks/ruler/prepare_niah.py, niah_utils.py), rendered the same way.
RULER_NOISE = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."
RULER_NEEDLE = "One of the special magic {kind} for {key} is: {value}."
RULER_TEMPLATE = (
    "Some special magic {kinds} are hidden within the following text. Make sure to memorize it. "
    "I will quiz you about the {kinds} afterwards.\n{context}\nWhat are all the special magic {kinds} for {query} "
    "mentioned in the provided text?"
)
RULER_PREFIX = "The special magic {kinds} for {query} mentioned in the provided text are"

# keyed documents' formats: {key}, {value}, {thing} (a noun) and {Thing} (capitalized)
KEYED_RECORDS = (
    "{key} was given {thing} {value}.",
    "{key} holds {thing} {value}.",
    "{key} received {thing} {value}.",
    "The {thing} of {key} is {value}.",
    "{key} - {thing} {value}.",
    "{Thing} {value} belongs to {key}.",
    "{Thing} {value} was assigned to {key}.",
    "{Thing} {value} is held by {key}.",
    "{value} is the {thing} of {key}.",
)
KEYED_QUESTIONS = ("What {thing} does {key} have?", "Which {thing} belongs to {key}?", "Look up the {thing} of {key}.",
                   "Tell me the {thing} of {key}.", "{key}'s {thing}?")  # fmt: skip
KEYED_QUESTIONS_PLURAL = ("Which {thing}s does {key} have, in order?", "List the {thing}s of {key} in the order given.")
KEYED_MARKERS = (("Q: ", "\nA:"), ("Query: ", "\nReply:"), ("", "\n->"), ("Request: ", "\nResult:"))
KEYED_SYLLABLES = ("ba", "ke", "lo", "mi", "ru", "sa", "ve", "to", "di", "na", "po", "zu", "fe", "gri", "sto", "ral",
                   "den", "mor", "tis", "van", "bel", "cor", "lin", "dus")  # fmt: skip

Piece = tuple[str, bool]
# Every word of the calibration sets' and eval suite's vocabularies: keyed documents use none.
_KEYED_EXCLUDED = frozenset(
    word.lower() for name in dir(words) if name.isupper() for entry in getattr(words, name) for word in entry.split()
) | {"permit", "permits", "code", "codes"}


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
        variant = variant or self.rng.choice(
            ["single_1", "single_2", "single_3", "multikey_1", "multikey_2", "multikey_3"]
        )
        haystack = (
            "noise" if variant in ("single_1", "multikey_1") else "needles" if variant == "multikey_2" else "essay"
        )
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
            lines = [
                RULER_NEEDLE.format(kind=value_kind, key=self.word_key(), value=self.value(value_kind))
                for _ in range(filler)
            ]
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
        sentences = [
            calibration.ledger_sentence(self.rng)
            for _ in range(max(1, (int(length * self.chars_per_token) - 300) // 60))
        ]
        sentences.insert(self.rng.randint(0, len(sentences)), calibration.NEEDLE.format(key=key, value=value))
        prompt = f"{calibration.INSTRUCTION}\n{' '.join(sentences)}\n{calibration.QUERY.format(key=key)}"
        return [(prompt, False), (f" {value}", True), (".", False)]

    def keyed(self, length: int) -> list[Piece]:
        """Key-conditioned retrieval: records of names and numbers among number-filled filler,
        then a question about one name (``KEYED_*`` formats; the module docstring says why)."""
        kind = self.rng.choice(["single", "multikey", "multivalue"])
        digits = self.rng.randint(3, 7)
        value = lambda: str(self.rng.randint(10 ** (digits - 1), 10**digits - 1))  # noqa: E731
        thing = self.rng.choice([noun for noun in word_lists()[1] if noun not in _KEYED_EXCLUDED])
        n_keys = {"single": 1, "multikey": self.rng.randint(2, 6), "multivalue": self.rng.randint(1, 3)}[kind]
        keys = list(dict.fromkeys(self.made_up_name() for _ in range(n_keys)))
        asked = keys[0]
        records = (
            [(asked, value())] + ([(asked, value())] if kind == "multivalue" else []) + [(k, value()) for k in keys[1:]]
        )
        filler = [
            self.numbered_sentence(value) for _ in range(max(1, (int(length * self.chars_per_token) - 200) // 45))
        ]
        lines: list[tuple[str, int | None]] = [(sentence, None) for sentence in filler]  # (text, record index)
        for index, (key, number) in enumerate(records):
            record = self.rng.choice(KEYED_RECORDS).format(key=key, value=number, thing=thing, Thing=thing.capitalize())
            lines.insert(self.rng.randint(0, len(lines)), (record, index))
        text = " ".join(line for line, _ in lines)
        asked_values = [records[index][1] for _, index in lines if index is not None and records[index][0] == asked]
        before, after = self.rng.choice(KEYED_MARKERS)
        questions = KEYED_QUESTIONS_PLURAL if kind == "multivalue" else KEYED_QUESTIONS
        question = self.rng.choice(questions).format(thing=thing, key=asked)
        answer = self.rng.choice([" and ", ", "]).join(asked_values)
        return [(f"{text}\n{before}{question}{after}", False), (f" {answer}", True), ("\n", False)]

    def made_up_name(self) -> str:
        """Two capitalized words of 2-3 syllables, none of them a word of the task vocabularies."""
        while True:
            parts = [
                "".join(self.rng.choices(KEYED_SYLLABLES, k=self.rng.randint(2, 3))).capitalize() for _ in range(2)
            ]
            if not _KEYED_EXCLUDED.intersection(part.lower() for part in parts):
                return " ".join(parts)

    def numbered_sentence(self, value: Callable[[], str]) -> str:
        """Filler with a number of the values' shape in most sentences (the only-number shortcut fails)."""
        adjectives, nouns, verbs = word_lists()
        pick = self.rng.choice
        if self.rng.random() < 0.3:
            return self.sentence()
        return f"The {pick(adjectives)} {pick(nouns)} {pick(verbs)}s {value()} {pick(nouns)}s."

    def document(self, length: int, mix: dict[str, float]) -> list[Piece]:
        kind = self.rng.choices(list(mix), weights=list(mix.values()))[0]
        return getattr(self, kind)(length)
