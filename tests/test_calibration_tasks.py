"""Issue 29's tasks: ``bosch_retrieval_calib``, the dev split ``bosch_niah_dev`` and the
diagnosis variants of ``bosch_niah_calib``. Texts are generated for a small BPE tokenizer
built here (nothing is downloaded)."""

from __future__ import annotations

import math

import re

import pytest
import yaml
from lm_eval.tasks import TaskManager

from bosch_eval.models.random_model import train_tokenizer
from bosch_eval.runtime.errors import LmEvalError
from bosch_eval.search.objective.calibration import CalibrationObjective
from bosch_eval.tasks import TASKS_DIR
from bosch_eval.tasks.niah import calibration, dev_split, eval_suite, retrieval_calib, tiebreak, words
from bosch_eval.tasks.niah.haystack import count_tokens
from tests.helpers import TaskYaml

FUNCTION_WORDS = {
    "a",
    "and",
    "at",
    "for",
    "in",
    "is",
    "it",
    "of",
    "the",
    "to",
    "was",
    "with",
    "from",
    "by",
    "what",
    "are",
}


@pytest.fixture(scope="module")
def tokenizer():
    return train_tokenizer()


@pytest.fixture(scope="module")
def docs(tokenizer):
    return retrieval_calib.examples.__wrapped__(tokenizer, 1024, 12, 0)


def words_of(text: str) -> set[str]:
    return set(re.findall(r"[a-z]+", text.lower()))


def needles_of(doc: dict) -> list[tuple[str, str]]:
    """(key, value) of every needle in the prompt, in order of appearance."""
    names = "|".join(words.RETRIEVAL_GIVEN_NAMES)
    found = []
    for template in retrieval_calib.NEEDLES:
        pattern = (
            re.escape(template)
            .replace(r"\{key\}", rf"(?P<key>(?:{names}) \w+)")
            .replace(r"\{value\}", r"(?P<value>\d{5})")
        )
        found += [(match.start(), match["key"], match["value"]) for match in re.finditer(pattern, doc["input"])]
    return [(key, value) for _, key, value in sorted(found)]


class TestRetrievalCalibration:
    def test_default_mix_is_two_singles_to_one_with_another_key(self, docs):
        assert [doc["kind"] for doc in docs[:6]] == ["single", "single", "multikey"] * 2
        for doc in docs:
            assert len({key for key, _ in needles_of(doc)}) == {"single": 1, "multikey": 2}[doc["kind"]]

    @pytest.mark.parametrize("distractor_keys", [1, 3])
    def test_each_kind_asks_for_its_keys_values_in_order_of_appearance(self, tokenizer, distractor_keys):
        docs = retrieval_calib.examples.__wrapped__(tokenizer, 1024, 6, 0, retrieval_calib.KINDS, distractor_keys)
        assert [doc["kind"] for doc in docs[:3]] == list(retrieval_calib.KINDS)
        for doc in docs:
            needles = needles_of(doc)
            keys = {key for key, _ in needles}
            asked = [value for key, value in needles if key == doc["key"]]
            assert len(keys) == {"single": 1, "multikey": 1 + distractor_keys, "multivalue": 2}[doc["kind"]]
            assert doc["target"] == " and ".join(asked)
            assert len(asked) == (2 if doc["kind"] == "multivalue" else 1)

    def test_the_prompt_ends_with_the_start_of_the_answer(self, tokenizer):
        for doc in retrieval_calib.examples.__wrapped__(tokenizer, 1024, 3, 0, retrieval_calib.KINDS, 1):
            lead = "are" if doc["kind"] == "multivalue" else "is"
            assert doc["input"].endswith(
                f"\nAnswer: The {'two permit numbers' if lead == 'are' else 'permit number'} of {doc['key']} {lead}"
            )

    def test_kinds_from_metadata(self):
        assert retrieval_calib.kinds_setting({}) == retrieval_calib.DEFAULT_KINDS
        assert retrieval_calib.kinds_setting({"kinds": "single, multivalue"}) == ("single", "multivalue")
        assert retrieval_calib.kinds_setting({"kinds": ["multikey"]}) == ("multikey",)
        for bad in ("", "single,triple", []):
            with pytest.raises(ValueError, match=r"bosch_retrieval_calib: metadata 'kinds' must list some of"):
                retrieval_calib.kinds_setting({"kinds": bad})

    def test_the_query_does_not_repeat_a_needle(self, docs):
        for doc in docs:
            query = doc["input"].rsplit("\n", 2)[-2:]
            for template in retrieval_calib.NEEDLES:
                fixed_words = [part.strip() for part in re.split(r"\{\w+\}", template) if part.strip(" .")]
                assert not any(part in "\n".join(query) for part in fixed_words), (template, query)

    def test_the_haystack_holds_distractor_values_of_the_same_shape(self, docs):
        for doc in docs:
            numbers = set(re.findall(r"\b\d{5}\b", doc["input"]))
            assert len(numbers - {value for _, value in needles_of(doc)}) >= 5

    def test_prompts_fill_the_budget_and_depths_are_stratified(self, tokenizer, docs):
        for doc in docs:
            assert 1024 - 20 <= count_tokens(tokenizer, doc["input"] + " " + doc["target"]) <= 1024
        assert [int(doc["depth"] * len(docs)) for doc in docs] == list(range(len(docs)))

    def test_vocabulary_is_disjoint_from_the_eval_suite_and_the_old_calibration(self):
        def vocabulary(prefixes: tuple[str, ...]) -> set[str]:
            lists = [getattr(words, name) for name in dir(words) if name.startswith(prefixes)]
            return {word for items in lists for item in items for word in words_of(item)}

        ours = vocabulary(("RETRIEVAL_",))
        assert ours & vocabulary(("EVAL_", "ESSAY_")) <= FUNCTION_WORDS
        assert ours & vocabulary(("CALIB_",)) <= FUNCTION_WORDS

    def test_same_seed_same_examples_other_seed_other_examples(self, tokenizer, docs):
        again = retrieval_calib.examples.__wrapped__(tokenizer, 1024, 12, 0)
        other = retrieval_calib.examples.__wrapped__(tokenizer, 1024, 12, 1)
        assert again == docs
        assert [doc["input"] for doc in other] != [doc["input"] for doc in docs]


class TestDevSplit:
    def test_documents_are_the_eval_formats_at_another_seed(self, tokenizer, tmp_path):
        tokenizer.save_pretrained(tmp_path)
        split = dev_split.dataset(tokenizer=str(tmp_path), dev_lengths=[1024], dev_samples=2)["test"]
        assert len(split) == 2 * len(dev_split.DEFAULT_FORMATS)
        first = eval_suite.example(dev_split.DEFAULT_FORMATS[0], tokenizer, 1024, 0, dev_split.DEFAULT_SEED)
        assert split[0]["input"] == f"{first['input']} {first['gen_prefix']}"
        assert split[0]["target"] == first["outputs"][0]
        test_doc = eval_suite.example(dev_split.DEFAULT_FORMATS[0], tokenizer, 1024, 0, eval_suite.DEFAULT_SEED)
        assert split[0]["target"] != test_doc["outputs"][0]

    def test_the_test_seed_is_refused(self, tokenizer, tmp_path):
        tokenizer.save_pretrained(tmp_path)
        for test_seed in (0, 5, 6):  # the default test draw and the studies' fresh ones
            with pytest.raises(
                ValueError, match=rf"bosch_niah_dev: metadata 'dev_seed' = {test_seed} draws bosch_niah's test"
            ):
                dev_split.dataset(tokenizer=str(tmp_path), dev_lengths=[512], dev_samples=1, dev_seed=test_seed)

    def test_chosen_variants_are_the_same_documents_in_the_usual_order(self, tokenizer, tmp_path):
        tokenizer.save_pretrained(tmp_path)
        every = dev_split.dataset(tokenizer=str(tmp_path), dev_lengths=[1024], dev_samples=2)["test"]
        some = dev_split.dataset(
            tokenizer=str(tmp_path), dev_lengths=[1024], dev_samples=2, dev_variants="single_2,single_1"
        )["test"]
        assert some["variant"] == ["bosch_niah_single_1", "bosch_niah_single_2"] * 2
        assert some["input"] == [doc["input"] for doc in every if doc["variant"] in set(some["variant"])]

    def test_the_uuid_formats_are_drawn_when_named(self, tokenizer, tmp_path):
        tokenizer.save_pretrained(tmp_path)
        split = dev_split.dataset(
            tokenizer=str(tmp_path), dev_lengths=[1024], dev_samples=2, dev_variants=["multikey_3", "single_3"]
        )["test"]
        assert split["variant"] == ["bosch_niah_single_3", "bosch_niah_multikey_3"] * 2
        assert all(re.fullmatch(r"[0-9a-f]{8}(-[0-9a-f]{4}){3}-[0-9a-f]{12}", target) for target in split["target"])
        test_doc = eval_suite.example("bosch_niah_single_3", tokenizer, 1024, 0, eval_suite.DEFAULT_SEED)
        assert split[0]["target"] != test_doc["outputs"][0]

    def test_the_generation_split_holds_the_same_documents_as_the_eval_tasks_do(self, tokenizer, tmp_path):
        tokenizer.save_pretrained(tmp_path)
        metadata = {
            "tokenizer": str(tmp_path),
            "dev_lengths": [512, 1024],
            "dev_samples": 2,
            "dev_variants": ["single_3", "single_1"],
        }
        prefill = dev_split.dataset(**metadata)["test"]
        generated = dev_split.generation_dataset(**metadata)["test"]
        assert generated["variant"] == prefill["variant"] and generated["max_length"] == prefill["max_length"]
        assert [f"{doc['input']} {doc['gen_prefix']}" for doc in generated] == prefill["input"]
        assert [doc["outputs"][0] for doc in generated] == prefill["target"]
        # Scored like the test tasks: a value after a colon counts, which the prefill score cannot see.
        doc = generated[1]  # single_3: a UUID
        assert eval_suite.process_results(doc, [f": {doc['outputs'][0]}."])["score"] == (doc["max_length"], 1.0)
        assert eval_suite.process_results(doc, ["I do not know."])["score"] == (doc["max_length"], 0.0)
        with pytest.raises(
            ValueError, match=r"^bosch_niah_dev_gen: metadata 'dev_seed' = 0 draws bosch_niah's test documents"
        ):
            dev_split.generation_dataset(**metadata, dev_seed=0)

    @pytest.mark.parametrize("value", [[], ["single_4"], "uuid", [1]])
    def test_an_unknown_variant_is_refused_naming_the_choices(self, tokenizer, tmp_path, value):
        tokenizer.save_pretrained(tmp_path)
        choices = r"\['multikey_1', 'multikey_2', 'multikey_3', 'single_1', 'single_2', 'single_3'\]"
        with pytest.raises(ValueError, match=rf"bosch_niah_dev: metadata 'dev_variants' must list some of {choices}"):
            dev_split.dataset(tokenizer=str(tmp_path), dev_lengths=[512], dev_samples=1, dev_variants=value)


class TestCalibrationDiagnosisVariants:
    def test_defaults_are_the_calibration_set_as_it_was(self, tokenizer):
        plain = calibration.examples.__wrapped__(tokenizer, 1024, 4, 0)
        explicit = calibration.examples.__wrapped__(tokenizer, 1024, 4, 0, "repeat", 0)
        assert plain == explicit
        assert all(doc["input"].endswith(calibration.QUERY.format(key=doc["key"])) for doc in plain)

    def test_distractors_and_plain_query(self, tokenizer):
        for doc in calibration.examples.__wrapped__(tokenizer, 1024, 4, 0, "plain", 3):
            needles = re.findall(r"The vault code of (\w+ \w+) is (\d{6})\.", doc["input"])
            assert len({key for key, _ in needles}) == 4 and (doc["key"], doc["target"]) in needles
            assert doc["input"].endswith(calibration.PLAIN_QUERY.format(key=doc["key"]))

    def test_uuid_values_replace_the_digits_and_nothing_else_changes_by_default(self, tokenizer):
        digits = calibration.examples.__wrapped__(tokenizer, 1024, 4, 0)
        assert digits == calibration.examples.__wrapped__(tokenizer, 1024, 4, 0, "repeat", 0, "digits")
        uuids = calibration.examples.__wrapped__(tokenizer, 1024, 4, 0, "repeat", 2, "uuid")
        hexes = r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}"
        for doc in uuids:
            needles = re.findall(rf"The vault code of (\w+ \w+) is ({hexes})\.", doc["input"])
            assert len(needles) == 3 and (doc["key"], doc["target"]) in needles
            assert re.fullmatch(hexes, doc["target"]) and doc["length"] <= 1024
            assert doc["input"].endswith(calibration.QUERY.format(key=doc["key"]))
        assert len({doc["target"] for doc in uuids}) == 4
        assert not {doc["target"] for doc in uuids} & {doc["target"] for doc in digits}

    def test_mixed_values_draw_every_format_in_turn_in_both_haystacks(self, tokenizer):
        docs = calibration.examples.__wrapped__(tokenizer, 1024, 12, 0, "repeat", 1, "mixed")
        values = {
            "digits": r"[0-9]{6}",
            "words": r"[a-z]+-[a-z]+",
            "uuid": r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}",
        }
        for index, doc in enumerate(docs):
            haystack, kind = calibration.MIXED_FORMATS[index % 6]
            assert doc["format"] == f"{kind} in {haystack}" and doc["length"] <= 1024
            assert re.fullmatch(values[kind], doc["target"])
            needles = re.findall(rf"The vault code of (\w+ \w+) is ({values[kind]})\.", doc["input"])
            assert len(needles) == 2 and (doc["key"], doc["target"]) in needles  # the distractor has the same kind
            assert doc["input"].startswith(calibration.INSTRUCTIONS[haystack])
            assert (words.CALIB_NOISE[0] in doc["input"]) == (haystack == "noise")
        assert {doc["format"] for doc in docs} == {
            f"{kind} in {haystack}" for haystack, kind in calibration.MIXED_FORMATS
        }
        assert len({doc["depth"] // (1 / 12) for doc in docs}) == 12  # still stratified over the depths

    def test_unknown_values_are_refused(self, tokenizer, tmp_path):
        tokenizer.save_pretrained(tmp_path)
        allowed = r"\['digits', 'words', 'uuid', 'mixed'\]"
        with pytest.raises(ValueError, match=rf"bosch_niah_calib: metadata 'calib_values' must be one of {allowed}"):
            calibration.dataset(tokenizer=str(tmp_path), seq_len=1024, num_examples=1, calib_values="hex")

    def test_an_unknown_query_style_is_refused(self, tokenizer, tmp_path):
        tokenizer.save_pretrained(tmp_path)
        with pytest.raises(
            ValueError, match=r"bosch_niah_calib: metadata 'calib_query' must be one of \['plain', 'repeat'\]"
        ):
            calibration.dataset(tokenizer=str(tmp_path), seq_len=1024, num_examples=1, calib_query="echo")


@pytest.mark.slow  # indexes every lm-eval task (~7 s CPU)
def test_lm_eval_finds_the_new_tasks():
    manager = TaskManager(include_path=str(TASKS_DIR))
    assert {"bosch_retrieval_calib", "bosch_niah_calib_uuid", "bosch_niah_dev", "bosch_niah_dev_gen"} <= set(
        manager.all_subtasks
    )


class TestTiebreak:
    @pytest.mark.parametrize("n", [1, 4, 64, 1000])
    def test_one_more_correct_example_outweighs_any_probabilities(self, n):
        doc = {"num_examples": n}
        value = lambda ll, greedy: tiebreak.process_results(doc, [(ll, greedy)])["acc_tiebreak"]  # noqa: E731
        k = n - 1  # k correct examples, all others wrong
        better = (k + 1) * value(-50.0, True) + (n - k - 1) * value(-50.0, False)  # sure of nothing
        worse = k * value(0.0, True) + (n - k) * value(-1e-9, False)  # sure of every answer
        assert better > worse

    def test_equal_accuracy_is_ordered_by_the_answers_probability(self):
        doc = {"num_examples": 64}
        low, high = (tiebreak.process_results(doc, [(ll, False)]) for ll in (-3.0, -0.5))
        assert low["acc"] == high["acc"] == 0.0 and 0.0 <= low["acc_tiebreak"] < high["acc_tiebreak"] <= 1.0
        assert tiebreak.process_results(doc, [(0.0, True)]) == {"acc": 1.0, "acc_tiebreak": 1.0, "prob": 1.0}

    def test_prob_is_the_answers_probability_whatever_the_accuracy(self):
        doc = {"num_examples": 64}
        for loglikelihood, greedy in [(-0.5, True), (-0.5, False), (-40.0, False)]:
            assert tiebreak.process_results(doc, [(loglikelihood, greedy)])["prob"] == pytest.approx(
                math.exp(loglikelihood)
            )

    @pytest.mark.slow
    def test_the_search_objective_races_on_it_and_keeps_acc(self):
        from bosch_eval.masks.head_mask import HeadMask
        from bosch_eval.search.objective.loading import CalibrationSettings, build_objective

        plain = build_objective("toy", CalibrationSettings(length=256, examples=4, metric="acc"))  # the paper's
        tie = CalibrationObjective(plain.lm, ["bosch_niah_calib"], metadata=plain.metadata, metric="acc_tiebreak")
        assert tie.racing_problem() is None
        full = HeadMask.uniform(plain.shape, full=True, window=32)
        acc, score = plain(full), tie(full)
        weight = tiebreak.tiebreak_weight(4)
        assert (1 - weight) * acc <= score <= (1 - weight) * acc + weight
        calls = plain.calls
        scores = plain.scores(full, ["acc", "acc_tiebreak", "prob"])
        assert scores["acc"] == acc and scores["acc_tiebreak"] == pytest.approx(score)
        assert scores["prob"] == pytest.approx((score - (1 - weight) * acc) / weight)
        assert plain.calls == calls + 1  # the three metrics of one evaluation
        with pytest.raises(LmEvalError, match="nope"):
            plain.scores(full, ["acc", "nope"])


def test_the_calibration_sets_are_read_from_the_task_yamls(tmp_path):
    from bosch_eval.tasks.niah.calibration_sets import calibration_examples, calibration_sets

    sets = calibration_sets()
    assert sorted(sets) == [
        "bosch_niah_calib",
        "bosch_niah_calib_formats",
        "bosch_niah_calib_uuid",
        "bosch_retrieval_calib",
    ]
    for name, found in sets.items():
        config = yaml.load(found.path.read_text(), Loader=TaskYaml)
        assert config["task"] == name and found.path.parent == TASKS_DIR / "niah"
    assert sets["bosch_niah_calib_uuid"].metadata["calib_values"] == "uuid"  # the YAML's, through its include
    assert sets["bosch_niah_calib"].generator is calibration.calibration_examples
    assert sets["bosch_retrieval_calib"].generator is retrieval_calib.calibration_examples
    names = r"\['bosch_niah_calib', 'bosch_niah_calib_formats', 'bosch_niah_calib_uuid', 'bosch_retrieval_calib'\]"
    with pytest.raises(ValueError, match=rf"calibration task 'bosch_niah': expected one of {names}"):
        calibration_examples("bosch_niah", None, 1024, 1, 0)  # a group of test tasks, not a calibration set
    with pytest.raises(ValueError, match="calibration task 'bosch_niah_dev'"):
        calibration_examples("bosch_niah_dev", None, 1024, 1, 0)  # its generator has no calibration_examples
    # A YAML in a folder of one's own, over a bundled generator: a calibration set with that folder only.
    (tmp_path / "mine.yaml").write_text(
        "include: "
        + str(TASKS_DIR / "niah" / "bosch_niah_calib.yaml")
        + "\ntask: mine\nmetadata: {calib_values: words}\n"
    )
    assert "mine" not in calibration_sets() and calibration_sets([tmp_path])["mine"].metadata == {
        "calib_values": "words"
    }


def test_the_uuid_calibration_task_is_the_uuid_values_of_the_calibration_set(tokenizer, tmp_path):
    from bosch_eval.tasks.niah.calibration_sets import calibration_examples

    tokenizer.save_pretrained(tmp_path)
    docs = calibration_examples("bosch_niah_calib_uuid", tokenizer, 1024, 3, 0)
    assert docs == calibration.examples.__wrapped__(tokenizer, 1024, 3, 0, values="uuid")
    built = calibration.dataset(tokenizer=str(tmp_path), seq_len=1024, num_examples=3, calib_values="uuid")["test"]
    assert [doc["target"] for doc in built] == [doc["target"] for doc in docs]
