"""S(z): lm-eval's own evaluation of the ``bosch`` adapter on the calibration task(s).

One call = one mask: :meth:`BoschLM.set_mask` swaps it in place, then
``lm_eval.evaluator.evaluate`` scores the Task objects built once at construction
(:mod:`bosch_eval.search.objective.loading` loads the model and builds this; racing the
same evaluation in chunks of examples is :mod:`bosch_eval.search.objective.racing_evaluation`).

Why ``evaluate`` and not ``simple_evaluate`` (measured on lm-eval 0.4.13,
``benchmarks/objective_overhead.py``): everything ``simple_evaluate`` adds around
``evaluate`` is per-call overhead the search pays thousands of times, or harms it:

* it builds the tasks again from their names on every call (and a default TaskManager
  first indexes all of lm-eval's tasks, ~11 s);
* it collects environment info (``add_env_info``: git, pip, CUDA; ~1 s a call);
* it reseeds the global ``random``/``numpy``/``torch`` generators, which would silently
  make the search's own draws repeat;
* its defaults ``bootstrap_iters=100000`` and ``log_samples=True`` cost time for numbers
  the search never reads.

What it does that matters, this module does once: ``num_fewshot`` defaults to 0 where a
task sets none, and the few-shot sampler is reseeded to ``simple_evaluate``'s default
(1234) before every call, so each call samples the same few-shot examples that a fresh
``simple_evaluate`` would. Also:

* no lm-eval ``use_cache``: it keys on the request text only and would return the
  first mask's scores for every later mask;
* ``bootstrap_iters=0``, ``log_samples=False``;
* the global ``random``, ``numpy`` and ``torch`` (CPU and CUDA) generator states are saved
  and restored around every call (:mod:`bosch_eval.runtime.lm_eval_session` holds these patches).
  ``evaluate`` itself draws from none of them (checked on 0.4.13 with ``bosch_niah_calib``);
  a user's task may, and the search must not notice;
* tokenization is remembered by the adapter (``BoschLM.memoize_tokens``).

Data parallelism: under ``accelerate launch --num_processes N`` every process calls the
objective with the same mask; the adapter gives each process 1/N of the documents,
lm-eval gathers the per-example metrics on process 0, and process 0's score is
broadcast (:func:`bosch_eval.runtime.launch.on_main_then_everywhere`), so every process returns
the same float (and every optimizer takes the same step). For a zero-shot task such as
``bosch_niah_calib`` and a mean metric over 0/1 values (``acc``) the score is exactly the
one-process score. Two lm-eval behaviours keep other calibrations from that exactness:
each process draws few-shot examples from its own sampler over its own shard, and the
mean adds the gathered values in another order.

Score of several tasks or a group: the mean, unweighted, over the names the user gave.
A name's score is lm-eval's own value for it when lm-eval reports the metric (a task, or
a group whose ``aggregate_metric_list`` aggregates it); otherwise, for a group, the
unweighted mean over its children (recursively), and for a tag, over its tasks.
"""

from __future__ import annotations

import importlib.metadata
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bosch_eval.masks.head_mask import HeadMask, ModelShape
from bosch_eval.models.model_identity import portable_name
from bosch_eval.runtime.errors import LmEvalError
from bosch_eval.runtime.launch import on_main_then_everywhere
from bosch_eval.runtime.lm_eval_session import (
    FEWSHOT_SEED,
    global_rng_kept,
    load_task,
    merge_task_dicts,
    metric_direction,
    metric_value,
    no_context_bars,
    quiet,
    task_manager,
    templates_compiled_once,
)
from bosch_eval.search.objective.defaults import DEFAULT_CALIB_METRIC
from bosch_eval.search.objective.racing_evaluation import ObjectiveRacing
from bosch_eval.search.objective.racing import Racing

if TYPE_CHECKING:
    from lm_eval.api.group import Group
    from lm_eval.tasks import TaskDict

    from bosch_eval.model_adapters.bosch import BoschLM

EVALUATE_PATH = "lm_eval.evaluator.evaluate"


# Metrics whose per-example values lie in [0, 1], so that their mean, S, is at most 1: lm-eval's
# 0/1 metrics and the tie-break task's (tasks/niah/tiebreak.py). Checked on every score.
UNIT_INTERVAL_METRICS = frozenset({"acc", "acc_norm", "exact_match", "acc_tiebreak", "prob"})


class CalibrationObjective(ObjectiveRacing):
    """S(z): lm-eval's evaluation of a BoschLM on calibration task(s), mask swapped in place.

    Args:
        lm: the adapter, loaded once; its tokenization is memoized from here on.
        tasks: lm-eval task, group or tag names (or YAML paths), ``bosch_niah_calib`` by default.
        include_path: an extra lm-eval task directory (bosch-eval's own tasks are always in).
        metadata: the TaskManager metadata (``bosch_niah_calib`` reads ``seq_len``,
            ``num_examples``, ``calib_seed`` and ``tokenizer``/``pretrained`` from it).
        metric: the metric name (``acc``), or ``name,filter`` when a task has several filters.
        limit: lm-eval's ``limit`` (first N documents of each task, or a fraction).
        gen_kwargs: generation settings over the tasks' own, as ``lm_eval --gen_kwargs`` sets them
            (a generation-scored dev task of ``calib-check``: ``max_gen_toks``).
        racing: for a racing search (``racing.enabled``), racing applies where it can be
            exact (the ``racing`` attribute is then True; :meth:`racing_problem` says why not
            otherwise); ``racing.chunk`` examples per racing step.

    Attributes:
        calls: evaluations done so far that ran the model: plain calls, and raced masks that
            forwarded an example (one answered wholly from a journal's values is not a call).
        examples_scored: calibration examples forwarded by plain (unraced) calls so far.
        higher_is_better: the metric's direction, from lm-eval's ``higher_is_better`` of
            every calibration task (its ``metric_list`` entry, else lm-eval's metric registry).
    """

    def __init__(
        self,
        lm: BoschLM,
        tasks: Sequence[str],
        *,
        include_path: str | Path | None = None,
        metadata: Mapping[str, Any] | None = None,
        metric: str = DEFAULT_CALIB_METRIC,
        limit: int | float | None = None,
        gen_kwargs: Mapping[str, Any] | None = None,
        racing: Racing = Racing(),
    ) -> None:
        if isinstance(tasks, str):
            tasks = (tasks,)
        if not tasks:
            raise LmEvalError("tasks: expected at least one lm-eval task or group name")
        if not metric:
            raise LmEvalError("metric: expected a metric name such as 'acc'")
        self.lm = lm
        self.tasks = tuple(tasks)
        self.metric = metric
        self.metadata = dict(metadata or {})
        self.include_path = None if include_path is None else str(include_path)
        self.limit = limit
        self.calls = 0
        self.examples_scored = 0
        self._sizes_memo: dict[str, int] | None = None
        lm.memoize_tokens = True
        lm.progress_bars = False  # the search's own bar counts calls; lm-eval's would print per call
        self._task_manager = task_manager(self.tasks, self.include_path, self.metadata)
        self._loaded = {name: load_task(self._task_manager, name) for name in self.tasks}
        self.task_dict: TaskDict = merge_task_dicts(self._loaded.values())
        for task in self.task_dict["tasks"].values():
            if task.get_config("num_fewshot") is None:
                task.set_config(key="num_fewshot", value=0)  # as simple_evaluate does
            if gen_kwargs and task.get_config("output_type") == "generate_until":
                task.set_config(key="generation_kwargs", value=dict(gen_kwargs), update=True)  # as simple_evaluate does
        self.higher_is_better = metric_direction(self.task_dict["tasks"], metric)
        self._racing_problem = self._why_not_raceable()  # the tasks are fixed from here on
        self._racing, self._race_chunk = racing.enabled and self._racing_problem is None, racing.chunk

    @property
    def shape(self) -> ModelShape:
        """The model's L×H×G, the shape every mask must have."""
        return self.lm.head_mask.shape

    def __call__(self, mask: HeadMask) -> float:
        """Score ``mask``: the same float on every process.

        Raises:
            MaskError: the mask does not fit the model.
            LmEvalError: lm-eval reported no value for the metric (on every process).
        """
        self.lm.set_mask(mask)
        learn = self.racing and self.racing_problem() is None  # racing orders its examples by these values
        results = self._evaluate(self.task_dict, limit=self.limit, log_samples=learn)
        self.examples_scored += sum(self._sizes().values())
        self.calls += 1

        def from_results() -> tuple[float, dict[str, dict[int, float]]]:
            values = {name: self._example_values(results["samples"][name]) for name in self.tasks} if learn else {}
            return self._score(results["results"], self.metric), values

        main = from_results if results is not None else None  # lm-eval gathers the results on rank 0
        score, values = on_main_then_everywhere(main, LmEvalError, self.lm.world_size)
        if self.best_possible is not None and score > self.best_possible:
            raise LmEvalError(
                f"metric: {self.metric!r} gave S = {score!r}, above {self.best_possible}: the search takes a metric of this name "
                "for a mean of per-example values in [0, 1] and stops a sub-problem at the first mask scoring 1; "
                "these tasks report it otherwise, so name another metric (--calib-metric)"
            )
        if values:
            self._racer().learn(mask, values)
        return score

    @property
    def best_possible(self) -> float | None:
        """The best S the metric can take: 1.0 for a higher-is-better metric of
        :data:`UNIT_INTERVAL_METRICS`; ``None`` (unknown) otherwise."""
        return 1.0 if self.higher_is_better and self.metric.split(",")[0] in UNIT_INTERVAL_METRICS else None

    def scores(self, mask: HeadMask, metrics: Sequence[str]) -> dict[str, float]:
        """Score ``mask`` by several metrics of the same evaluation (one forward pass): what
        ``calib-check`` compares when it asks which metric orders masks as a dev split does.
        Not raced: racing stops a mask early by one metric's values."""
        for metric in metrics:
            metric_direction(self.task_dict["tasks"], metric)  # a metric no task reports fails here, named
        self.lm.set_mask(mask)
        results = self._evaluate(self.task_dict, limit=self.limit)
        self.examples_scored += sum(self._sizes().values())
        self.calls += 1
        main = (
            (lambda: {metric: self._score(results["results"], metric) for metric in metrics})
            if results is not None
            else None
        )
        return on_main_then_everywhere(main, LmEvalError, self.lm.world_size)

    def work(self) -> dict[str, float]:
        """What the calls so far cost: calls, examples forwarded per call (of the full count),
        and the share of decoder-layer computations the prefix cache skipped."""
        full = sum(self._sizes().values())
        examples = self.examples_scored + (self._racer_memo.examples_scored if self._racer_memo is not None else 0)
        work: dict[str, float] = {
            "calls": self.calls,
            "examples_per_call": round(examples / self.calls, 3) if self.calls else 0.0,
            "examples_per_full_call": full,
        }
        cache = getattr(self.lm, "prefix_cache", None)
        if cache is not None and cache.layers_run + cache.layers_skipped:
            work["layers_skipped_share"] = round(cache.layers_skipped / (cache.layers_run + cache.layers_skipped), 4)
        return work

    def relative_cost(self, lowest_layer: int | None) -> float:
        """One call's cost when masks differ only in layers >= ``lowest_layer``, relative to
        a call over every layer: with the prefix cache, the layers below are not run (for
        the examples it holds), without it every layer is."""
        if getattr(self.lm, "prefix_cache", None) is None or lowest_layer is None:
            return 1.0
        layers = self.shape.num_layers
        return (layers - min(max(lowest_layer, 0), layers - 1)) / layers

    def vary_layers_from(self, layer: int | None) -> None:
        """Masks scored next are run from ``layer`` (None: every layer) by the adapter's
        prefix-activation cache when it has one; states are reused only for the same rows below."""
        self.lm.vary_layers_from(layer)

    def describe(self) -> dict[str, Any]:
        """What S(z) is, for the provenance of a search (JSON-serializable). The same for one
        process or N, so a journal written by one resumes under the other, and the same in
        every checkout (the bundled model's directory is written as ``toy``, a converted
        ``smollm2`` as ``smollm2``)."""
        examples = self._sizes()
        return {
            "tasks": list(self.tasks),
            "metric": self.metric,
            "higher_is_better": self.higher_is_better,
            "aggregation": "mean over the named tasks; groups: lm-eval's aggregate, else unweighted mean of children",
            "metadata": {key: _portable(_jsonable(value)) for key, value in self.metadata.items()},
            "include_path": self.include_path,
            "limit": self.limit,
            "num_examples": dict(examples),
            "num_fewshot": {name: task.get_config("num_fewshot") for name, task in self.task_dict["tasks"].items()},
            "evaluate": EVALUATE_PATH,
            "lm_eval": importlib.metadata.version("lm_eval"),
        }

    # -- evaluation ---------------------------------------------------------------------
    def _evaluate(
        self,
        task_dict: TaskDict,
        *,
        limit: int | float | None = None,
        samples: dict[str, list[int]] | None = None,
        log_samples: bool = False,
    ) -> dict[str, Any] | None:
        """lm-eval's ``evaluate`` of the current mask (results on rank 0, None elsewhere)."""
        from lm_eval.evaluator import evaluate

        with global_rng_kept(), quiet("lm_eval"), no_context_bars(), templates_compiled_once():
            for task in task_dict["tasks"].values():
                task.set_fewshot_seed(seed=FEWSHOT_SEED)
            return evaluate(
                lm=self.lm,
                task_dict=task_dict,
                limit=limit,
                samples=samples,
                bootstrap_iters=0,
                log_samples=log_samples,
            )

    def _sizes(self) -> dict[str, int]:
        """Examples per calibration task (after ``limit``)."""
        from lm_eval.evaluator_utils import get_sample_size

        if self._sizes_memo is None:
            self._sizes_memo = {}
            for name, task in self.task_dict["tasks"].items():
                total = len(task.eval_docs)
                limit = get_sample_size(task, self.limit)
                self._sizes_memo[name] = total if limit is None else min(limit, total)
        return self._sizes_memo

    def _example_values(self, samples: Sequence[Mapping[str, Any]]) -> dict[int, float]:
        """The metric's per-example values of one chunk's logged samples, by document index."""
        name, _, filter_key = self.metric.partition(",")
        rows = [row for row in samples if not filter_key or row["filter"] == filter_key]
        if len({row["filter"] for row in rows}) > 1:
            raise LmEvalError(f"metric: {name!r} is reported under several filters; name one as {name},FILTER")
        return {int(row["doc_id"]): row[name] for row in rows}

    def _aggregate(self, task: str, values: Sequence[float]) -> float:
        """lm-eval's own aggregation of a task's per-example values (what ``evaluate`` reports)."""
        return float(self.task_dict["tasks"][task].aggregation()[self.metric.split(",")[0]](list(values)))

    # -- scores -----------------------------------------------------------------------
    def _score(self, results: Mapping[str, Mapping[str, Any]], metric: str) -> float:
        values = [self._name_score(name, results, self._loaded[name], metric) for name in self.tasks]
        return math.fsum(values) / len(values)

    def _name_score(self, name: str, results: Mapping[str, Mapping[str, Any]], loaded: TaskDict, metric: str) -> float:
        value = metric_value(results.get(name, {}), metric)
        if value is not None:
            return value
        groups = loaded.get("groups", {})
        if name in groups:
            return self._group_mean(groups[name], results, groups, metric)
        if name not in loaded["tasks"] and loaded["tasks"]:  # a tag or a YAML path: its tasks
            return _mean([self._leaf(task, results, metric) for task in loaded["tasks"]])
        return self._leaf(name, results, metric)

    def _group_mean(
        self, group: Group, results: Mapping[str, Mapping[str, Any]], groups: Mapping[str, Group], metric: str
    ) -> float:
        values = []
        for child in group.child_names:
            value = metric_value(results.get(child, {}), metric)
            if value is None and child in groups:
                value = self._group_mean(groups[child], results, groups, metric)
            values.append(self._leaf(child, results, metric) if value is None else value)
        return _mean(values)

    def _leaf(self, name: str, results: Mapping[str, Mapping[str, Any]], metric: str) -> float:
        value = metric_value(results.get(name, {}), metric)
        if value is None:
            reported = sorted(k for k in results.get(name, {}) if "," in k and "_stderr" not in k)
            raise LmEvalError(
                f"metric: lm-eval reported no {metric!r} for {name!r} (it reported {reported or 'nothing'}); "
                "pass --calib-metric with one of those (name,filter where a task has several filters)"
            )
        return value


# -- helpers ------------------------------------------------------------------------------
def _portable(value: Any) -> Any:
    """A bundled model's directory, or a packaged GGUF's converted checkpoint, as its alias
    (:func:`bosch_eval.models.model_identity.portable_name`): a journal written in one checkout or
    cache then resumes in another (the directory differs, the model does not)."""
    return portable_name(value) if isinstance(value, str) else value


def _mean(values: Sequence[float]) -> float:
    return math.fsum(values) / len(values)


def _jsonable(value: Any) -> Any:
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    if isinstance(value, Mapping):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    return str(value)
