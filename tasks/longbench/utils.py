"""Per-document scores for the ``bosch_longbench`` groups (BOSCH paper §3.5, B.6).

Why this module exists: lm-eval 0.4.13 scores a group from its *leaf* tasks
(``Group.aggregate`` walks ``get_all_tasks()``; a subgroup's own result is never
read), so ``bosch_longbench`` averaging ``score`` over its seven category groups
would weight each of the 22 tasks by 1/22 instead of each category by 1/7.
Every task in these groups therefore reports two values per document:

* ``score``: lm-eval's own LongBench ``score`` (the task's native metric: QA F1,
  Rouge-L, code similarity, ...) or GSM8K exact match. The category groups
  average it with equal task weights.
* ``weighted_score``: ``score * N_TASKS / (N_CATEGORIES * tasks in its category)``.
  Its plain mean over the 22 tasks equals the mean of the 7 category means; the
  ``bosch_longbench`` group averages this one. Its stderr, lm-eval's
  ``sqrt(sum se_i^2) / 22`` over scaled per-task stderrs, is that of the
  category mean as well.

The prompts, generation settings and scorers stay lm-eval's; only
``process_results`` (LongBench) or the metric (GSM8K) is wrapped here.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from lm_eval.api.metrics import exact_match_fn
from lm_eval.tasks.longbench import metrics  # lm-eval's LongBench scorers (needs lm_eval[longbench])

ProcessResults = Callable[[dict[str, Any], list[str]], dict[str, float]]

# The paper's seven categories (B.6) as group name -> lm-eval task names. The YAML
# files list the same tasks; tests/test_longbench_groups.py checks both against B.6.
CATEGORIES: dict[str, tuple[str, ...]] = {
    "bosch_longbench_single": (
        "longbench_multifieldqa_en",
        "longbench_multifieldqa_zh",
        "longbench_narrativeqa",
        "longbench_qasper",
    ),
    "bosch_longbench_multi": (
        "longbench_2wikimqa",
        "longbench_hotpotqa",
        "longbench_musique",
        "longbench_dureader",
    ),
    "bosch_longbench_summarization": (
        "longbench_gov_report",
        "longbench_multi_news",
        "longbench_qmsum",
        "longbench_vcsum",
        "longbench_samsum",
    ),
    "bosch_longbench_fewshot": ("longbench_trec", "longbench_triviaqa", "longbench_lsht"),
    "bosch_longbench_synthetic": (
        "longbench_passage_retrieval_en",
        "longbench_passage_retrieval_zh",
        "longbench_passage_count",
    ),
    "bosch_longbench_code": ("longbench_lcc", "longbench_repobench-p"),
    "bosch_longbench_math": ("gsm8k",),
}
N_CATEGORIES = len(CATEGORIES)
N_TASKS = sum(len(tasks) for tasks in CATEGORIES.values())


def task_weight(task: str) -> float:
    """Factor from ``score`` to ``weighted_score`` for one task: ``N_TASKS / (N_CATEGORIES * n_category)``."""
    for tasks in CATEGORIES.values():
        if task in tasks:
            return N_TASKS / (N_CATEGORIES * len(tasks))
    raise KeyError(f"task {task!r} is in none of the bosch_longbench categories {sorted(CATEGORIES)}")


class WeightedScore:
    """``process_results`` of one task: its lm-eval scorer's ``score`` and that times the task's weight.

    A callable object rather than a closure so that lm-eval's record of the task
    config (``str()`` of a callable it cannot ``getsource``) names the task and the
    scorer. Not a dataclass: lm-eval executes this file before registering it in
    ``sys.modules``, where ``dataclasses`` looks up string annotations.
    """

    __slots__ = ("task", "scorer", "weight")

    def __init__(self, task: str, scorer: ProcessResults) -> None:
        self.task = task
        self.scorer = scorer
        self.weight = task_weight(task)

    def __call__(self, doc: dict[str, Any], results: list[str]) -> dict[str, float]:
        score = self.scorer(doc, results)["score"]
        return {"score": score, "weighted_score": self.weight * score}

    def __str__(self) -> str:
        return f"{type(self).__name__}({self.task!r}, {self.scorer.__module__}.{self.scorer.__name__})"


# One wrapper per LongBench task, around the scorer that lm-eval's own YAML names
# (lm_eval/tasks/longbench/<task>.yaml, `process_results: !function metrics.<scorer>`).
multifieldqa_en = WeightedScore("longbench_multifieldqa_en", metrics.get_qa_f1_with_score)
multifieldqa_zh = WeightedScore("longbench_multifieldqa_zh", metrics.get_qa_f1_zh_with_score)
narrativeqa = WeightedScore("longbench_narrativeqa", metrics.get_qa_f1_with_score)
qasper = WeightedScore("longbench_qasper", metrics.get_qa_f1_with_score)
twowikimqa = WeightedScore("longbench_2wikimqa", metrics.get_qa_f1_with_score)
hotpotqa = WeightedScore("longbench_hotpotqa", metrics.get_qa_f1_with_score)
musique = WeightedScore("longbench_musique", metrics.get_qa_f1_with_score)
dureader = WeightedScore("longbench_dureader", metrics.get_rouge_zh_with_score)
gov_report = WeightedScore("longbench_gov_report", metrics.get_rouge_with_score)
multi_news = WeightedScore("longbench_multi_news", metrics.get_rouge_with_score)
qmsum = WeightedScore("longbench_qmsum", metrics.get_rouge_with_score)
vcsum = WeightedScore("longbench_vcsum", metrics.get_rouge_zh_with_score)
samsum = WeightedScore("longbench_samsum", metrics.get_rouge_with_score)
trec = WeightedScore("longbench_trec", metrics.get_classification_with_score)
triviaqa = WeightedScore("longbench_triviaqa", metrics.get_qa_f1_with_score)
lsht = WeightedScore("longbench_lsht", metrics.get_classification_with_score)
passage_retrieval_en = WeightedScore("longbench_passage_retrieval_en", metrics.get_retrieval_with_score)
passage_retrieval_zh = WeightedScore("longbench_passage_retrieval_zh", metrics.get_retrieval_zh_with_score)
passage_count = WeightedScore("longbench_passage_count", metrics.get_count_with_score)
lcc = WeightedScore("longbench_lcc", metrics.get_code_sim_with_score)
repobench_p = WeightedScore("longbench_repobench-p", metrics.get_code_sim_with_score)


def gsm8k_score(references: list[str], predictions: list[str], **kwargs: Any) -> dict[str, float]:
    """lm-eval's ``exact_match`` (GSM8K's options come from the YAML) as ``score`` and ``weighted_score``.

    A metric returning a dict reports each key as its own metric, with this
    function's aggregation (``mean``); that is how GSM8K gets the common names.
    """
    score = float(exact_match_fn(references=references, predictions=predictions, **kwargs)["exact_match"])
    return {"score": score, "weighted_score": task_weight("gsm8k") * score}
