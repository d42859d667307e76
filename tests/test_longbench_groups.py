"""``bosch_longbench``: the paper's LongBench score (§3.5, B.6) as lm-eval groups.

Offline: ``datasets.load_dataset`` is replaced by the two-document JSONL files in
tests/fixtures/longbench, and a scripted LM answers each document right or wrong,
so every task score is known in advance. The category and total scores are
recomputed here from the per-task results, independently of lm-eval's group code.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import datasets
import lm_eval
import pytest
from lm_eval.api.group import Group
from lm_eval.api.instance import Instance
from lm_eval.api.model import LM
from lm_eval.api.task import Task
from lm_eval.config.group import AggMetricConfig
from lm_eval.tasks import TaskManager

from bosch_eval.tasks import TASKS_DIR

FIXTURES = Path(__file__).parent / "fixtures" / "longbench"
LONGBENCH_HUB_PATH = "Xnhyacinth/LongBench"  # lm-eval's LongBench tasks' dataset_path
GSM8K_HUB_PATH = "openai/gsm8k"

# Paper B.6, written out literally: category group -> lm-eval tasks.
PAPER_CATEGORIES = {
    "bosch_longbench_single": [
        "longbench_multifieldqa_en",
        "longbench_multifieldqa_zh",
        "longbench_narrativeqa",
        "longbench_qasper",
    ],
    "bosch_longbench_multi": ["longbench_2wikimqa", "longbench_hotpotqa", "longbench_musique", "longbench_dureader"],
    "bosch_longbench_summarization": [
        "longbench_gov_report",
        "longbench_multi_news",
        "longbench_qmsum",
        "longbench_vcsum",
        "longbench_samsum",
    ],
    "bosch_longbench_fewshot": ["longbench_trec", "longbench_triviaqa", "longbench_lsht"],
    "bosch_longbench_synthetic": [
        "longbench_passage_retrieval_en",
        "longbench_passage_retrieval_zh",
        "longbench_passage_count",
    ],
    "bosch_longbench_code": ["longbench_lcc", "longbench_repobench-p"],
    "bosch_longbench_math": ["gsm8k"],
}
ALL_TASKS = [task for tasks in PAPER_CATEGORIES.values() for task in tasks]

# Whether the scripted LM answers document 0 and document 1 of each task correctly.
# Categories of different sizes get different means, so the mean of the 7 category
# means (0.5988) differs from the mean of the 22 task scores (13/22 = 0.5909).
OUTCOMES = {
    "longbench_multifieldqa_en": (True, True),
    "longbench_multifieldqa_zh": (True, False),
    "longbench_narrativeqa": (False, False),
    "longbench_qasper": (True, False),
    "longbench_2wikimqa": (True, True),
    "longbench_hotpotqa": (True, True),
    "longbench_musique": (True, False),
    "longbench_dureader": (True, True),
    "longbench_gov_report": (True, False),
    "longbench_multi_news": (False, False),
    "longbench_qmsum": (True, False),
    "longbench_vcsum": (True, True),
    "longbench_samsum": (False, False),
    "longbench_trec": (True, True),
    "longbench_triviaqa": (True, False),
    "longbench_lsht": (False, False),
    "longbench_passage_retrieval_en": (True, True),
    "longbench_passage_retrieval_zh": (True, True),
    "longbench_passage_count": (False, False),
    "longbench_lcc": (True, True),
    "longbench_repobench-p": (True, False),
    "gsm8k": (True, False),
}
# Shares no character with any fixture answer: every scorer gives it exactly 0.
WRONG_ANSWER = "zzz"


def correct_answer(doc: dict[str, Any]) -> str:
    """The reference answer as a model would write it (GSM8K: the number after ``####``)."""
    if "answers" in doc:
        return doc["answers"][0]
    return doc["answer"].split("####")[-1].strip()


def read_jsonl(path: Path) -> datasets.Dataset:
    return datasets.Dataset.from_list([json.loads(line) for line in path.read_text(encoding="utf-8").splitlines()])


def fixture_dataset(path: str, name: str | None = None, **_: Any) -> datasets.DatasetDict:
    """Stands in for ``datasets.load_dataset``: the local JSONL of a LongBench config or GSM8K."""
    if path == LONGBENCH_HUB_PATH:
        return datasets.DatasetDict({"test": read_jsonl(FIXTURES / f"{name}.jsonl")})
    if path == GSM8K_HUB_PATH:
        docs = read_jsonl(FIXTURES / "gsm8k.jsonl")
        return datasets.DatasetDict({"train": docs, "test": docs})
    raise AssertionError(f"unexpected download of {path!r} (name {name!r}): fixtures cover only LongBench and GSM8K")


class ScriptedLM(LM):
    """Answers each document right or wrong as :data:`OUTCOMES` says; records the prompts."""

    def __init__(self) -> None:
        super().__init__()
        self.prompts: dict[str, list[str]] = {}

    def generate_until(self, requests: list[Instance]) -> list[str]:
        outputs = []
        for request in requests:
            self.prompts.setdefault(request.task_name, []).append(request.args[0])
            right = OUTCOMES[request.task_name][request.doc_id]
            outputs.append(correct_answer(request.doc) if right else WRONG_ANSWER)
        return outputs

    def loglikelihood(self, requests: list[Instance]) -> list[tuple[float, bool]]:
        raise NotImplementedError("bosch_longbench only generates")

    def loglikelihood_rolling(self, requests: list[Instance]) -> list[float]:
        raise NotImplementedError("bosch_longbench only generates")


@pytest.fixture(scope="module")
def offline() -> Iterator[None]:
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(datasets, "load_dataset", fixture_dataset)
        yield


@pytest.fixture(scope="module")
def task_manager() -> TaskManager:
    return TaskManager(include_path=str(TASKS_DIR))


@pytest.fixture(scope="module")
def loaded(task_manager: TaskManager, offline: None) -> dict[str, Any]:
    """``TaskManager.load`` of ``bosch_longbench``: flat ``tasks`` and ``groups`` dicts."""
    return task_manager.load(["bosch_longbench"])


@pytest.fixture(scope="module")
def evaluation(task_manager: TaskManager, offline: None) -> tuple[dict[str, Any], ScriptedLM]:
    lm = ScriptedLM()
    out = lm_eval.simple_evaluate(model=lm, tasks=["bosch_longbench"], task_manager=task_manager, bootstrap_iters=1000)
    return out, lm


def category_weight(task: str) -> float:
    """22 / (7 * tasks in the task's category): ``weighted_score`` over ``score``."""
    (size,) = [len(tasks) for tasks in PAPER_CATEGORIES.values() if task in tasks]
    return len(ALL_TASKS) / (len(PAPER_CATEGORIES) * size)


class TestGroupStructure:
    def test_groups_are_listed(self, task_manager: TaskManager):
        assert {"bosch_longbench", *PAPER_CATEGORIES} <= set(task_manager.all_groups)

    def test_categories_and_tasks_follow_the_paper(self, loaded: dict[str, Any]):
        total = loaded["groups"]["bosch_longbench"]
        assert total.child_names == list(PAPER_CATEGORIES)
        for category, tasks in PAPER_CATEGORIES.items():
            assert [task.task_name for task in total.get(category).get_all_tasks()] == tasks
        assert sorted(loaded["tasks"]) == sorted(ALL_TASKS)

    def test_aggregation_configs(self, loaded: dict[str, Any]):
        groups = loaded["groups"]
        unweighted = {"filter_list": ["none"], "aggregation": "mean", "weight_by_size": False}
        assert groups["bosch_longbench"].aggregate_metric_list == [AggMetricConfig("weighted_score", **unweighted)]
        for category in PAPER_CATEGORIES:
            assert groups[category].aggregate_metric_list == [AggMetricConfig("score", **unweighted)]
        assert all(group.version == "1.0" for group in groups.values())
        assert all(task.VERSION is not None for task in loaded["tasks"].values())

    def test_gsm8k_is_zero_shot_with_one_flexible_filter(self, loaded: dict[str, Any]):
        config = loaded["tasks"]["gsm8k"].config
        assert config.num_fewshot == 0
        assert [pipeline["name"] for pipeline in config.filter_list] == ["none"]
        assert config.filter_list[0]["filter"][0]["group_select"] == -1  # lm-eval's flexible-extract


class TestPerDocumentScores:
    def test_score_is_lm_evals_own_and_weighted_score_is_scaled(
        self, task_manager: TaskManager, loaded: dict[str, Any], offline: None
    ):
        """Every wrapper reports exactly what lm-eval's own task reports as ``score``, and that times its weight."""
        upstream = task_manager.load(ALL_TASKS[:-1])["tasks"]  # lm-eval's own LongBench tasks, unmodified
        checked = 0
        for name, theirs in upstream.items():
            ours: Task = loaded["tasks"][name]
            for doc in ours.test_docs():
                for output in (correct_answer(doc), WRONG_ANSWER, correct_answer(doc)[:3] + " and more words"):
                    expected = theirs.process_results(doc, [output])["score"]
                    got = ours.process_results(doc, [output])
                    assert set(got) == {"score", "weighted_score"}
                    assert got["score"] == expected, (name, output)
                    assert got["weighted_score"] == pytest.approx(category_weight(name) * expected, rel=1e-12)
                    checked += 1
        assert checked == 21 * 2 * 3


class TestAggregation:
    def test_task_scores_are_the_scripted_outcomes(self, evaluation):
        results = evaluation[0]["results"]
        for task, outcome in OUTCOMES.items():
            expected = sum(outcome) / len(outcome)
            assert results[task]["score,none"] == pytest.approx(expected, abs=1e-6), task
            assert results[task]["weighted_score,none"] == pytest.approx(category_weight(task) * expected, abs=1e-6)

    def test_category_is_the_unweighted_mean_of_its_tasks(self, evaluation):
        results = evaluation[0]["results"]
        for category, tasks in PAPER_CATEGORIES.items():
            expected = sum(results[task]["score,none"] for task in tasks) / len(tasks)
            assert results[category]["score,none"] == pytest.approx(expected, rel=1e-12), category

    def test_total_is_the_unweighted_mean_of_the_seven_categories(self, evaluation):
        results = evaluation[0]["results"]
        category_means = [
            sum(results[task]["score,none"] for task in tasks) / len(tasks) for tasks in PAPER_CATEGORIES.values()
        ]
        expected = sum(category_means) / len(category_means)
        assert results["bosch_longbench"]["weighted_score,none"] == pytest.approx(expected, rel=1e-12)
        assert expected == pytest.approx((0.5 + 0.875 + 0.4 + 0.5 + 2 / 3 + 0.75 + 0.5) / 7, abs=1e-6)
        flat = sum(results[task]["score,none"] for task in ALL_TASKS) / len(ALL_TASKS)
        assert abs(expected - flat) > 5e-3  # the fixture tells the two apart

    def test_total_stderr_is_that_of_the_category_mean(self, evaluation):
        """Tasks are independent: Var(total) = sum over categories of Var(category mean) / 7^2."""
        results = evaluation[0]["results"]
        variance = 0.0
        for tasks in PAPER_CATEGORIES.values():
            stderrs = [results[task]["score_stderr,none"] for task in tasks]
            variance += sum(se**2 for se in stderrs) / len(tasks) ** 2 / len(PAPER_CATEGORIES) ** 2
        assert results["bosch_longbench"]["weighted_score_stderr,none"] == pytest.approx(math.sqrt(variance), rel=1e-9)

    def test_prompts_are_lm_evals_and_gsm8k_is_zero_shot(self, evaluation):
        _, lm = evaluation
        assert sorted(lm.prompts) == sorted(ALL_TASKS)
        for prompt in lm.prompts["gsm8k"]:
            assert prompt.startswith("Question: ") and prompt.count("Question:") == 1 and prompt.endswith("\nAnswer:")
        assert lm.prompts["longbench_hotpotqa"][0].startswith("Answer the question based on the given passages.")

    def test_results_record_the_scorer_of_each_task(self, evaluation):
        out = evaluation[0]
        json.dumps({key: out[key] for key in ("results", "configs", "versions", "n-shot")})
        recorded = out["configs"]["longbench_hotpotqa"]["process_results"]
        assert recorded == "WeightedScore('longbench_hotpotqa', lm_eval.tasks.longbench.metrics.get_qa_f1_with_score)"


class TestFabricatedMetrics:
    """lm-eval's own ``Group.aggregate`` on the real groups, fed made-up per-task results."""

    @staticmethod
    def task_metrics() -> dict[str, dict[str, Any]]:
        metrics = {}
        for i, task in enumerate(ALL_TASKS):
            score = (7 * i % 22) / 21  # distinct values in [0, 1]
            metrics[task] = {
                "score,none": score,
                "weighted_score,none": category_weight(task) * score,
                "sample_len": 10 + 40 * i,  # unequal sizes: unweighted means must ignore them
            }
        return metrics

    def test_categories_and_total(self, loaded: dict[str, Any]):
        groups, metrics = loaded["groups"], self.task_metrics()
        category_means = {}
        for category, tasks in PAPER_CATEGORIES.items():
            category_means[category] = sum(metrics[task]["score,none"] for task in tasks) / len(tasks)
            metrics[category] = groups[category].aggregate(metrics)
            assert metrics[category]["score,none"] == pytest.approx(category_means[category], rel=1e-12)
        total = groups["bosch_longbench"].aggregate(metrics)
        assert total["weighted_score,none"] == pytest.approx(sum(category_means.values()) / 7, rel=1e-12)

    def test_lm_eval_averages_groups_over_leaf_tasks(self, loaded: dict[str, Any]):
        """Why ``weighted_score`` exists. If this fails, lm-eval reads subgroup results: revisit tasks/longbench."""
        groups, metrics = loaded["groups"], self.task_metrics()
        naive = Group(
            "naive", aggregate_metric_list=[AggMetricConfig("score", filter_list=["none"], weight_by_size=False)]
        )
        for category in PAPER_CATEGORIES:
            naive.add(groups[category])
            metrics[category] = groups[category].aggregate(metrics)
        flat = sum(metrics[task]["score,none"] for task in ALL_TASKS) / len(ALL_TASKS)
        assert naive.aggregate(metrics)["score,none"] == pytest.approx(flat, rel=1e-12)
