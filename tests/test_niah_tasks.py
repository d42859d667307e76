"""The NIAH tasks: the calibration set ``bosch_niah_calib`` and the RULER-like ``bosch_niah`` suite.

Texts are generated for a small byte-level BPE tokenizer built here (nothing is
downloaded). The lm-eval checks load the YAML through ``TaskManager``; the ones marked
slow run ``simple_evaluate`` and the stock CLI on tiny random checkpoints.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from statistics import mean

import lm_eval
import pytest
from lm_eval.tasks import TaskManager

from bosch_eval.models.random_model import save_random_checkpoint, train_tokenizer
from bosch_eval.runtime.errors import ModelError, TemplateTooLong
from bosch_eval.tasks import TASKS_DIR
from bosch_eval.tasks.niah import calibration, eval_suite, words
from bosch_eval.tasks.niah.haystack import count_tokens

EVAL_TASKS = tuple(eval_suite.NIAH_FORMATS)
GROUPS = ("bosch_niah", "bosch_niah_single", "bosch_niah_multikey")
# Words the calibration and eval texts may share: nothing but these.
FUNCTION_WORDS = {"a", "and", "at", "for", "in", "is", "it", "of", "the", "to"}
UUID_RE = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}", re.IGNORECASE)
NEEDLE_RE = re.compile(r"One of the special magic \w+ for (\S+) is: (\S+)\.")


@pytest.fixture(scope="module")
def tokenizer():
    return train_tokenizer()


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory, tokenizer) -> Path:
    path = tmp_path_factory.mktemp("bpe-tokenizer")
    tokenizer.save_pretrained(path)
    return path


def calibration_docs(
    tokenizer, seq_len: int = 1024, num_examples: int = 8, seed: int = 0, values: str = "digits"
) -> tuple[dict, ...]:
    """Fresh examples: bypasses the process-wide cache so that determinism is really tested."""
    return calibration.examples.__wrapped__(tokenizer, seq_len, num_examples, seed, values=values)


def words_of(text: str) -> set[str]:
    return set(re.findall(r"[a-z]+", text.lower()))


def names_of(text: str) -> set[str]:
    """Keys, values and words as whole tokens (``adj-noun`` keys and UUIDs stay whole)."""
    return set(re.findall(r"[\w-]+", text))


class TestCalibrationSet:
    def test_same_seed_same_examples_other_seed_other_examples(self, tokenizer):
        first, again, other = (calibration_docs(tokenizer, seed=seed) for seed in (0, 0, 1))
        assert first == again
        assert all(a["input"] != b["input"] for a, b in zip(first, other, strict=True))

    @pytest.mark.parametrize("seq_len", [1024, 2048])
    def test_prompt_and_answer_within_one_percent_of_seq_len(self, tokenizer, seq_len):
        for doc in calibration_docs(tokenizer, seq_len):
            tokens = count_tokens(tokenizer, doc["input"] + " " + doc["target"])
            assert tokens == doc["length"]
            assert 0.99 * seq_len <= tokens <= seq_len

    def test_question_closes_the_prompt_and_only_the_needle_holds_the_value(self, tokenizer):
        for doc in calibration_docs(tokenizer):
            key, value, query = doc["key"], doc["target"], calibration.QUERY.format(key=doc["key"])
            assert doc["input"].endswith("\n" + query)
            assert re.fullmatch(r"\d{6}", value) and value not in query
            assert doc["input"].count(calibration.NEEDLE.format(key=key, value=value)) == 1
            assert re.findall(r"\d+", doc["input"]) == [value]

    def test_needles_spread_over_the_whole_haystack(self, tokenizer):
        where = []
        for doc in calibration_docs(tokenizer, num_examples=16):
            start, end = len(calibration.INSTRUCTION) + 1, doc["input"].rindex("\nQuery:")
            haystack = doc["input"][start:end]
            where.append(haystack.index(calibration.NEEDLE.format(key=doc["key"], value=doc["target"])) / len(haystack))
        assert min(where) < 0.1 and max(where) > 0.85
        assert len({round(w, 1) for w in where}) >= 8

    def test_seq_len_too_small_for_the_template_raises(self, tokenizer):
        with pytest.raises(TemplateTooLong, match=r"bosch_niah_calib at seq_len=64: .* more than the budget of 64"):
            calibration_docs(tokenizer, seq_len=64, num_examples=1)

    def test_settings_come_from_metadata(self, tokenizer_dir):
        split = calibration.dataset(tokenizer=str(tokenizer_dir), seq_len="1024", num_examples=3, calib_seed=2)["test"]
        assert split.num_rows == 3 and set(split["seq_len"]) == {1024}
        with pytest.raises(ValueError, match="'seq_len' must be an integer"):
            calibration.dataset(tokenizer=str(tokenizer_dir), seq_len="long")
        with pytest.raises(ValueError, match="no tokenizer"):
            calibration.dataset(seq_len=1024)


@pytest.mark.parametrize("task", EVAL_TASKS)
class TestEvalSuite:
    def test_same_seed_same_example_other_seed_other_example(self, tokenizer, task):
        first = eval_suite.example(task, tokenizer, 1024, 0, seed=0)
        assert first == eval_suite.example(task, tokenizer, 1024, 0, seed=0)
        assert first["input"] != eval_suite.example(task, tokenizer, 1024, 0, seed=1)["input"]

    @pytest.mark.parametrize("max_length", [1024, 2048])
    def test_prompt_and_generation_budget_fill_max_length(self, tokenizer, task, max_length):
        """Line haystacks (noise, distractor needles) are sized by whole lines, as RULER's are."""
        for index in range(3):
            doc = eval_suite.example(task, tokenizer, max_length, index, seed=0)
            tokens = count_tokens(tokenizer, doc["input"] + " " + doc["gen_prefix"]) + eval_suite.GEN_TOKENS
            assert tokens == doc["length"]
            assert 0.9 * max_length <= tokens <= max_length

    def test_question_closes_the_prompt_and_the_answer_is_only_in_its_needle(self, tokenizer, task):
        for index in range(3):
            doc = eval_suite.example(task, tokenizer, 1024, index, seed=0)
            (answer,) = doc["outputs"]
            question = f"What is the special magic {eval_suite.NIAH_FORMATS[task].value_kind[:-1]} for {doc['query']}"
            assert doc["input"].endswith(question + " mentioned in the provided text?")
            assert answer not in question and answer not in doc["gen_prefix"]
            needles = NEEDLE_RE.findall(doc["input"])
            assert [value for key, value in needles if key == doc["query"]] == [answer]

    def test_needles_and_haystack_follow_the_ruler_variant(self, tokenizer, task):
        variant = eval_suite.NIAH_FORMATS[task]
        doc = eval_suite.example(task, tokenizer, 2048, 0, seed=0)
        needles = NEEDLE_RE.findall(doc["input"])
        keys = [key for key, _ in needles]
        if variant.haystack == "needle":
            assert len(needles) > 5 and keys.count(doc["query"]) == 1
        else:
            assert len(set(keys)) == len(needles) == variant.num_keys
        assert (eval_suite.NOISE in doc["input"]) == (variant.haystack == "repeat")
        key_pattern = r"[0-9a-f]{8}-[0-9a-f]{4}-4" if variant.key_kind == "uuids" else r"[a-z]+-[a-z]+"
        assert all(re.fullmatch(key_pattern + ".*", key) for key in keys)


class TestEvalDataset:
    def test_lengths_interleave_so_that_limit_samples_each(self, tokenizer_dir):
        split = eval_suite.dataset(
            "bosch_niah_single_2", {"tokenizer": str(tokenizer_dir), "max_seq_lengths": [1024, 2048], "num_samples": 2}
        )["test"]
        assert split["max_length"] == [1024, 2048, 1024, 2048]

    def test_too_short_length_names_the_generation_budget(self, tokenizer):
        with pytest.raises(TemplateTooLong, match=r"at 256 tokens less 128 to generate: .* budget of 128"):
            eval_suite.example("bosch_niah_multikey_1", tokenizer, 256, 0, seed=0)


class TestNoOverlap:
    """Calibration and evaluation share no keys, values or haystack words (paper B.4)."""

    @staticmethod
    def vocabulary(prefixes: tuple[str, ...]) -> set[str]:
        lists = [getattr(words, name) for name in dir(words) if name.startswith(prefixes)]
        return {word for items in lists for item in items for word in words_of(item)}

    def test_word_lists_share_only_function_words(self):
        assert self.vocabulary(("CALIB_",)) & self.vocabulary(("EVAL_", "ESSAY_")) <= FUNCTION_WORDS

    @pytest.mark.parametrize("length", [1024, 2048])
    @pytest.mark.parametrize("values", ["digits", "mixed"])  # mixed: word values and the noise haystack too
    def test_texts_share_no_key_value_or_content_word(self, tokenizer, length, values):
        calib = calibration_docs(tokenizer, length, num_examples=12 if values == "mixed" else 8, values=values)
        evals = [eval_suite.example(task, tokenizer, length, i, seed=0) for task in EVAL_TASKS for i in range(4)]
        calib_text = "\n".join(doc["input"] + " " + doc["target"] for doc in calib)
        eval_text = "\n".join(doc["input"] + " " + doc["gen_prefix"] for doc in evals)
        calib_items = {part for doc in calib for part in (*doc["key"].split(), doc["target"])}
        eval_items = {item for key_value in NEEDLE_RE.findall(eval_text) for item in key_value}
        assert calib_items & names_of(eval_text) == set()
        assert eval_items & names_of(calib_text) == set()
        # UUIDs are compared whole above; their hex letters are no words
        assert words_of(UUID_RE.sub("", calib_text)) & words_of(UUID_RE.sub("", eval_text)) <= FUNCTION_WORDS

    def test_calibration_keys_are_not_from_rulers_key_vocabulary(self):
        pytest.importorskip("wonderwords")
        from bosch_eval.toy.corpus import word_lists  # RULER's wonderwords lists

        ruler_words = {word.lower() for wordlist in word_lists() for word in wordlist}
        names = {name.lower() for name in words.CALIB_GIVEN_NAMES + words.CALIB_FAMILY_NAMES}
        assert names & ruler_words == set()


class TestScoring:
    def test_an_answer_counts_when_it_appears_in_the_output(self):
        doc = {"outputs": ["1234567"], "max_length": 1024}
        assert eval_suite.process_results(doc, [" 1234567.\nDone"]) == {"1024": 1.0, "score": (1024, 1.0)}
        assert eval_suite.process_results(doc, ["1234568"]) == {"1024": 0.0, "score": (1024, 0.0)}
        uuid_doc = {"outputs": ["3f2A-11c0"], "max_length": 512}
        assert eval_suite.process_results(uuid_doc, ["it is 3F2a-11C0"])["512"] == 1.0
        two = {"outputs": ["12", "34"], "max_length": 512}
        assert eval_suite.process_results(two, ["12 and 43"])["512"] == 0.5  # RULER's string_match_all

    def test_score_weighs_each_length_equally(self):
        assert eval_suite.mean_over_lengths([(512, 1.0), (512, 0.0), (1024, 1.0)]) == 0.75


@pytest.fixture(scope="module")
def task_manager(tokenizer_dir) -> TaskManager:
    """Our tasks only (no lm-eval defaults), sized for the test tokenizer."""
    metadata = {"tokenizer": str(tokenizer_dir), "seq_len": 1024, "num_examples": 2, "max_seq_lengths": [1024]}
    return TaskManager(include_path=str(TASKS_DIR), include_defaults=False, metadata=metadata | {"num_samples": 2})


class TestLmEval:
    def test_index_lists_every_task_and_group(self, task_manager):
        assert {"bosch_niah_calib", *EVAL_TASKS} <= set(task_manager.all_subtasks)
        assert set(GROUPS) <= set(task_manager.all_groups)

    def test_tasks_load_and_build_instances(self, task_manager):
        tasks = task_manager.load(["bosch_niah_calib", "bosch_niah"])["tasks"]
        assert set(tasks) == {"bosch_niah_calib", *EVAL_TASKS}
        for name, task in tasks.items():
            assert task.config.metadata["version"] == 1.0, name
            task.build_all_requests(limit=2)
            docs = list(task.test_docs())
            assert len(task.instances) == 2
            for instance, doc in zip(task.instances, docs, strict=True):
                if name == "bosch_niah_calib":
                    assert instance.request_type == "loglikelihood"
                    assert instance.args == (doc["input"], " " + doc["target"])
                else:
                    context, generation = instance.args
                    assert context == doc["input"] + " " + doc["gen_prefix"]
                    assert generation["max_gen_toks"] == eval_suite.GEN_TOKENS

    @pytest.mark.slow
    def test_simple_evaluate_calibration_sizes_by_the_models_tokenizer(self, tiny_model_dir):
        """No task_manager: simple_evaluate merges model_args into metadata, so ``pretrained`` names the tokenizer."""
        out = lm_eval.simple_evaluate(
            model="bosch",
            model_args=f"pretrained={tiny_model_dir},layers=intr,ratio=0,window=8",
            tasks=[str(TASKS_DIR / "niah" / "bosch_niah_calib.yaml")],
            metadata={"seq_len": 256, "num_examples": 4},
            device="cpu",
            batch_size=4,
            bootstrap_iters=0,
            log_samples=True,
        )
        assert 0.0 <= out["results"]["bosch_niah_calib"]["acc,none"] <= 1.0
        samples = out["samples"]["bosch_niah_calib"]
        assert len(samples) == 4
        tokenizer = train_tokenizer()  # the checkpoint's tokenizer
        for sample in samples:
            context, continuation = sample["arguments"][0]
            assert context.endswith(" is") and re.fullmatch(r" \d{6}", continuation)
            assert count_tokens(tokenizer, context + continuation) <= 256

    @pytest.mark.slow
    def test_simple_evaluate_eval_groups_average_tasks(self, tmp_path):
        model_dir = save_random_checkpoint(tmp_path / "model", max_position_embeddings=1024)
        metadata = {"pretrained": str(model_dir), "max_seq_lengths": [1024], "num_samples": 1}
        manager = TaskManager(include_path=str(TASKS_DIR), include_defaults=False, metadata=metadata)
        out = lm_eval.simple_evaluate(
            model="bosch",
            model_args=f"pretrained={model_dir},layers=bme,ratio=0.5,window=8",
            tasks=["bosch_niah"],
            task_manager=manager,
            gen_kwargs="max_gen_toks=4",
            device="cpu",
            batch_size=6,
            bootstrap_iters=0,
        )
        results = out["results"]
        for name in (*EVAL_TASKS, *GROUPS):
            assert 0.0 <= results[name]["score,none"] <= 1.0 and "1024,none" in results[name], name
        assert results["bosch_niah"]["score,none"] == pytest.approx(mean(results[t]["score,none"] for t in EVAL_TASKS))

    @pytest.mark.slow
    def test_stock_cli_validates_the_tasks(self):
        lm_eval_cli = Path(sys.executable).parent / "lm-eval"
        names = ",".join(("bosch_niah_calib", *GROUPS, *EVAL_TASKS))
        result = subprocess.run(
            [str(lm_eval_cli), "validate", "--tasks", names, "--include_path", str(TASKS_DIR)],
            capture_output=True, text=True, timeout=300, check=False,
        )  # fmt: skip
        assert result.returncode == 0 and "All tasks found and valid" in result.stdout, result.stdout + result.stderr


class TestLengthsTheModelCanHold:
    """The toy model holds 2048 positions and ships bosch_defaults.json (calib_len 1024)."""

    def test_defaults_come_from_bosch_defaults_json(self):
        assert set(calibration.dataset(pretrained="toy", num_examples=1)["test"]["seq_len"]) == {1024}
        split = eval_suite.dataset("bosch_niah_single_1", {"pretrained": "toy", "num_samples": 1})["test"]
        assert {len(doc["input"]) > 0 for doc in split} == {True} and split.num_rows == 1

    @pytest.mark.parametrize(
        ("build", "message"),
        [
            (lambda: calibration.dataset(pretrained="toy", seq_len=4096, num_examples=1), "'seq_len' = 4096"),
            (
                lambda: eval_suite.dataset(
                    "bosch_niah_single_1", {"pretrained": "toy", "max_seq_lengths": [1024, 32768]}
                ),
                "'max_seq_lengths' = 32768",
            ),
        ],
    )
    def test_a_length_past_the_model_is_an_error(self, build, message):
        with pytest.raises(
            ModelError, match=rf"{message}: longer than model 'toy' can hold \(max_position_embeddings = 2048\)"
        ):
            build()

    def test_the_override_builds_it(self):
        split = calibration.dataset(pretrained="toy", seq_len=2560, num_examples=1, ignore_max_positions="true")["test"]
        assert split["seq_len"] == [2560]

    def test_lm_eval_refuses_before_evaluating(self):
        from lm_eval.tasks import TaskManager

        manager = TaskManager(
            include_path=str(TASKS_DIR), include_defaults=False, metadata={"pretrained": "toy", "seq_len": 4096}
        )
        with pytest.raises(ModelError, match="4096"):
            manager.load(["bosch_niah_calib"])


def test_lm_evals_metadata_hint_is_not_repeated_for_our_tasks(caplog):
    """lm-eval logs it once per custom-dataset task, even with --metadata given; ours drop it."""
    with caplog.at_level("WARNING", logger="lm_eval.api.task"):
        TaskManager(
            include_path=str(TASKS_DIR), include_defaults=False, metadata={"pretrained": "toy", "num_samples": 1}
        ).load(["bosch_niah_single_1", "bosch_niah_calib"])
    assert "Custom kwargs can be passed" not in caplog.text
    import logging

    record = logging.LogRecord(
        "lm_eval.api.task",
        logging.WARNING,
        "",
        0,
        "other_task: Custom kwargs can be passed to `--metadata` ...",
        (),
        None,
    )
    assert all(f.filter(record) for f in logging.getLogger("lm_eval.api.task").filters)  # other tasks keep it
