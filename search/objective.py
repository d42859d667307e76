"""S(z): lm-eval's own evaluation of the ``bosch`` adapter on the calibration task(s).

One call = one mask: :meth:`BoschLM.set_mask` swaps it in place, then
``lm_eval.evaluator.evaluate`` scores the Task objects built once at construction.

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
  and restored around every call. ``evaluate`` itself draws from none of them (checked on
  0.4.13 with ``bosch_niah_calib``); a user's task may, and the search must not notice;
* tokenization is remembered by the adapter (``BoschLM.memoize_tokens``).

Data parallelism: under ``accelerate launch --num_processes N`` every process calls the
objective with the same mask; the adapter gives each process 1/N of the documents,
lm-eval gathers the per-example metrics on process 0, and process 0's score is
broadcast, so every process returns the same float (and every optimizer takes the same
step). For a zero-shot task such as ``bosch_niah_calib`` and a mean metric over 0/1
values (``acc``) the score is exactly the one-process score. Two lm-eval behaviours keep
other calibrations from that exactness: each process draws few-shot examples from its own
sampler over its own shard, and the mean adds the gathered values in another order.

Racing (:meth:`CalibrationObjective.race`, :mod:`bosch_eval.search.racing`): the same
evaluation in chunks of examples (``evaluate``'s per-task ``samples`` indices), stopped once
the mask provably cannot win. Exact for zero-shot tasks whose metric is lm-eval's ``mean``
of per-example values in [0, 1]: a mask scored to the end gets lm-eval's own aggregation of
the same values in the same order. :meth:`CalibrationObjective.racing_problem` says why
racing cannot apply to a calibration, before anything is evaluated.

Score of several tasks or a group: the mean, unweighted, over the names the user gave.
A name's score is lm-eval's own value for it when lm-eval reports the metric (a task, or
a group whose ``aggregate_metric_list`` aggregates it); otherwise, for a group, the
unweighted mean over its children (recursively), and for a tag, over its tasks.
"""

from __future__ import annotations

import importlib.metadata
import math
import os
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bosch_eval.lm_eval_session import (
    FEWSHOT_SEED,
    LmEvalError,
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
from bosch_eval.masks import HeadMask, ModelShape
from bosch_eval.model_check import bundled_alias, resolve_model
from bosch_eval.model_defaults import model_defaults
from bosch_eval.search.racing import DEFAULT_RACE_CHUNK, ExampleMemo, RaceBound, Racer, Tally

if TYPE_CHECKING:
    from lm_eval.api.group import Group
    from lm_eval.tasks import TaskDict

    from bosch_eval.model_adapters.bosch import BoschLM

DEFAULT_TASKS = ("bosch_niah_calib",)
DEFAULT_CALIB_EXAMPLES = 64
EVALUATE_PATH = "lm_eval.evaluator.evaluate"


# A calibration task, metric or result that cannot give S(z): the lm-eval session's error,
# under the name the search's callers catch.
ObjectiveError = LmEvalError


class CalibrationObjective:
    """S(z): lm-eval's evaluation of a BoschLM on calibration task(s), mask swapped in place.

    Args:
        lm: the adapter, loaded once; its tokenization is memoized from here on.
        tasks: lm-eval task, group or tag names (or YAML paths), ``bosch_niah_calib`` by default.
        include_path: an extra lm-eval task directory (bosch-eval's own tasks are always in).
        metadata: the TaskManager metadata (``bosch_niah_calib`` reads ``seq_len``,
            ``num_examples``, ``calib_seed`` and ``tokenizer``/``pretrained`` from it).
        metric: the metric name (``acc``), or ``name,filter`` when a task has several filters.
        limit: lm-eval's ``limit`` (first N documents of each task, or a fraction).

    Attributes:
        calls: evaluations done so far (raced ones included).
        examples_scored: calibration examples forwarded by plain (unraced) calls so far.
        higher_is_better: the metric's direction, from lm-eval's ``higher_is_better`` of
            every calibration task (its ``metric_list`` entry, else lm-eval's metric registry).
    """

    def __init__(
        self,
        lm: BoschLM,
        tasks: Sequence[str] = DEFAULT_TASKS,
        *,
        include_path: str | Path | None = None,
        metadata: Mapping[str, Any] | None = None,
        metric: str = "acc",
        limit: int | float | None = None,
    ) -> None:
        if isinstance(tasks, str):
            tasks = (tasks,)
        if not tasks:
            raise ObjectiveError("tasks: expected at least one lm-eval task or group name")
        if not metric:
            raise ObjectiveError("metric: expected a metric name such as 'acc'")
        self.lm = lm
        self.tasks = tuple(tasks)
        self.metric = metric
        self.metadata = dict(metadata or {})
        self.include_path = None if include_path is None else str(include_path)
        self.limit = limit
        self.calls = 0
        self.examples_scored = 0
        self.race_chunk = DEFAULT_RACE_CHUNK
        self.racing = False  # set by a racing search: plain calls then log per-example values for the racer
        self._sizes_memo: dict[str, int] | None = None
        self._racer_memo: Racer | None = None
        lm.memoize_tokens = True
        lm.progress_bars = False  # the search's own bar counts calls; lm-eval's would print per call
        self._task_manager = task_manager(self.tasks, self.include_path, self.metadata)
        self._loaded = {name: load_task(self._task_manager, name) for name in self.tasks}
        self.task_dict: TaskDict = merge_task_dicts(self._loaded.values())
        for task in self.task_dict["tasks"].values():
            if task.get_config("num_fewshot") is None:
                task.set_config(key="num_fewshot", value=0)  # as simple_evaluate does
        self.higher_is_better = metric_direction(self.task_dict["tasks"], metric)
        self._racing_problem = self._why_not_raceable()  # the tasks are fixed from here on

    @property
    def shape(self) -> ModelShape:
        """The model's L×H×G, the shape every mask must have."""
        return self.lm.head_mask.shape

    def __call__(self, mask: HeadMask) -> float:
        """Score ``mask``: the same float on every process.

        Raises:
            MaskError: the mask does not fit the model.
            ObjectiveError: lm-eval reported no value for the metric (on every process).
        """
        self.lm.set_mask(mask)
        learn = self.racing and self.racing_problem() is None  # racing orders its examples by these values
        results = self._evaluate(self.task_dict, limit=self.limit, log_samples=learn)
        self.examples_scored += sum(self._sizes().values())
        payload: tuple[float, dict[str, dict[int, float]]] | str | None = None
        if results is not None:  # rank 0 only
            try:
                values = {name: self._example_values(results["samples"][name]) for name in self.tasks} if learn else {}
                payload = (self._score(results["results"]), values)
            except ObjectiveError as err:
                payload = str(err)  # every process must raise, not wait for a broadcast
        payload = self._from_rank_zero(payload)
        self.calls += 1
        if isinstance(payload, str):
            raise ObjectiveError(payload)
        score, values = payload
        if values:
            self._racer().learn(mask, values)
        return score

    def recall(self, mask: HeadMask) -> float | None:
        """What ``self(mask)`` answers, from per-example values scored before (in a race, or
        journaled by a killed search), with no lm-eval call; None when some are missing.

        Raises:
            ObjectiveError: racing cannot apply (:meth:`racing_problem`).
        """
        return self._racer().recall(mask, self.metric)

    def use_memo(self, memo: ExampleMemo) -> None:
        """Answer every (mask, example) ``memo`` knows from it, and add every value scored
        from here on to it (the search journals them).

        Raises:
            ObjectiveError: racing cannot apply (:meth:`racing_problem`).
        """
        self._racer().memo = memo

    def race(self, mask: HeadMask, can_win: Callable[[float], bool]) -> float | RaceBound:
        """S(z) of ``mask`` scored ``race_chunk`` examples at a time (hardest first), or a
        :class:`RaceBound` as soon as ``can_win(best S still reachable)`` is False; the same
        answer on every process. A mask scored to the end gets exactly ``self(mask)``.

        Raises:
            ObjectiveError: racing cannot apply (:meth:`racing_problem`), or a per-example
                value lies outside [0, 1].
        """
        outcome = self._racer().race(mask, can_win, self.metric)
        self.calls += 1
        return outcome

    def race_many(
        self, masks: Sequence[HeadMask], rule_out: Callable[[list[tuple[float, float]]], set[int]]
    ) -> list[float | RaceBound]:
        """Score ``masks`` together (:meth:`Racer.race_many`): masks ``rule_out`` names stop
        with a :class:`RaceBound`, the rest get exactly ``self(mask)``.

        Raises:
            ObjectiveError: as :meth:`race`.
        """
        outcomes = self._racer().race_many(masks, rule_out, self.metric)
        self.calls += len(masks)
        return outcomes

    def _racer(self) -> Racer:
        problem = self.racing_problem()
        if problem is not None:
            raise ObjectiveError(f"racing: {problem}")
        if self._racer_memo is None:
            self._racer_memo = Racer(
                self._sizes(), self.higher_is_better, self._chunk_values, self._exact, self.race_chunk, self.lm.world_size
            )
        self._racer_memo.chunk = self.race_chunk
        return self._racer_memo

    def _chunk_values(self, items: Sequence[tuple[HeadMask, str, list[int]]]) -> list[dict[int, float]]:
        """Per-example values of each ``(mask, task, document indices)`` item, on every process.

        One process scores every item. N processes share the items out (item ``i`` to process
        ``i mod N``), each scoring its own alone (lm-eval sees one process: no document
        sharding, no collectives), and gather all values: different masks at once, or parts
        of one chunk (the racer splits chunks so that every process has an item).

        Raises:
            ObjectiveError: a value outside [0, 1] (racing's bound would not hold), or no
                single filter for the metric (on every process).
        """
        world = self.lm.world_size
        if world <= 1:
            values = [self._local_values(*item) for item in items]
            return [self._checked(value) for value in values]
        from accelerate.utils import gather_object

        mine: dict[int, dict[int, float] | str] = {}
        rank = self.lm.rank
        with self.lm.alone():
            for number in range(rank, len(items), world):
                mine[number] = self._local_values(*items[number])
        merged: dict[int, dict[int, float] | str] = {}
        for part in gather_object([mine]):
            merged.update(part)
        return [self._checked(merged[number]) for number in range(len(items))]

    def _local_values(self, mask: HeadMask, name: str, indices: list[int]) -> dict[int, float] | str:
        """This process's per-example values of ``mask`` on ``indices`` of ``name`` (an error as text)."""
        self.lm.set_mask(mask)
        sub = {"tasks": {name: self.task_dict["tasks"][name]}, "groups": {}, "group_map": {}}
        results = self._evaluate(sub, samples={name: indices}, log_samples=True)
        try:
            values = self._example_values(results["samples"][name])
            Tally({name: len(indices)}, self.higher_is_better).add(name, values, self.metric)  # values in [0, 1]
        except (ObjectiveError, ValueError) as err:
            return str(err)
        return values

    @staticmethod
    def _checked(values: dict[int, float] | str) -> dict[int, float]:
        if isinstance(values, str):
            raise ObjectiveError(values)
        return values

    def _exact(self, tally: Tally) -> float:
        """S(z) from a complete tally: lm-eval's aggregation of each task's values in document order."""
        return self._score({task: {self.metric: self._aggregate(task, tally.in_document_order(task))} for task in tally.sizes})


    def racing_problem(self) -> str | None:
        """Why S(z) cannot be raced exactly, or None when it can: racing needs plain tasks
        (not groups or tags), zero-shot (few-shot draws depend on the examples before), and
        lm-eval's ``mean`` as the metric's aggregation."""
        return self._racing_problem

    def _why_not_raceable(self) -> str | None:
        from lm_eval.api.metrics import mean

        for name in self.tasks:
            if set(self._loaded[name]["tasks"]) != {name} or self._loaded[name].get("groups"):
                return f"{name!r} is a group, tag or YAML path (racing scores plain tasks)"
        metric = self.metric.split(",")[0]
        for name, task in self.task_dict["tasks"].items():
            if task.get_config("num_fewshot"):
                return f"task {name!r} is few-shot (its examples' few-shot draws would change with the chunks)"
            if task.aggregation().get(metric) is not mean:
                return f"task {name!r} does not aggregate {metric!r} with lm-eval's mean"
        return None

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

    def vary_layers_from(self, layer: int | None) -> None:
        """Masks scored next differ only in layers >= ``layer`` (None: no promise); passed
        to the adapter's prefix-activation cache when it has one."""
        self.lm.vary_layers_from(layer)

    def describe(self) -> dict[str, Any]:
        """What S(z) is, for the provenance of a search (JSON-serializable). The same for one
        process or N, so a journal written by one resumes under the other, and the same in
        every checkout (the bundled model's directory is written as ``toy``)."""
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
    def _evaluate(self, task_dict: TaskDict, *, limit: int | float | None = None, samples: dict[str, list[int]] | None = None, log_samples: bool = False) -> dict[str, Any] | None:
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
            raise ObjectiveError(f"metric: {name!r} is reported under several filters; name one as {name},FILTER")
        return {int(row["doc_id"]): row[name] for row in rows}

    def _aggregate(self, task: str, values: Sequence[float]) -> float:
        """lm-eval's own aggregation of a task's per-example values (what ``evaluate`` reports)."""
        return float(self.task_dict["tasks"][task].aggregation()[self.metric.split(",")[0]](list(values)))

    # -- scores -----------------------------------------------------------------------
    def _score(self, results: Mapping[str, Mapping[str, Any]]) -> float:
        values = [self._name_score(name, results, self._loaded[name]) for name in self.tasks]
        return math.fsum(values) / len(values)

    def _name_score(self, name: str, results: Mapping[str, Mapping[str, Any]], loaded: TaskDict) -> float:
        value = metric_value(results.get(name, {}), self.metric)
        if value is not None:
            return value
        groups = loaded.get("groups", {})
        if name in groups:
            return self._group_mean(groups[name], results, groups)
        if name not in loaded["tasks"] and loaded["tasks"]:  # a tag or a YAML path: its tasks
            return _mean([self._leaf(task, results) for task in loaded["tasks"]])
        return self._leaf(name, results)

    def _group_mean(self, group: Group, results: Mapping[str, Mapping[str, Any]], groups: Mapping[str, Group]) -> float:
        values = []
        for child in group.child_names:
            value = metric_value(results.get(child, {}), self.metric)
            if value is None and child in groups:
                value = self._group_mean(groups[child], results, groups)
            values.append(self._leaf(child, results) if value is None else value)
        return _mean(values)

    def _leaf(self, name: str, results: Mapping[str, Mapping[str, Any]]) -> float:
        value = metric_value(results.get(name, {}), self.metric)
        if value is None:
            reported = sorted(k for k in results.get(name, {}) if "," in k and "_stderr" not in k)
            raise ObjectiveError(
                f"metric: lm-eval reported no {self.metric!r} for {name!r} (it reported {reported or 'nothing'}); "
                "pass --calib-metric with one of those (name,filter where a task has several filters)"
            )
        return value

    def _from_rank_zero(self, payload: Any) -> Any:
        if self.lm.world_size <= 1:
            assert payload is not None  # one process is rank 0
            return payload
        from accelerate.utils import broadcast_object_list

        box = [payload]
        broadcast_object_list(box, from_process=0)
        return box[0]


def build_objective(
    model: str,
    *,
    tasks: Sequence[str] = DEFAULT_TASKS,
    include_path: str | Path | None = None,
    calib_examples: int | None = None,
    calib_len: int | None = None,
    calib_seed: int = 0,
    metric: str = "acc",
    device: str | None = None,
    batch_size: int = 1,
    dtype: str | None = None,
    attn_backend: str = "auto",
    window: int | None = None,
    metadata: Mapping[str, Any] | None = None,
    limit: int | float | None = None,
    max_length: int | None = None,
    model_args: Mapping[str, Any] | None = None,
    prefix_cache_mb: int = 0,
) -> CalibrationObjective:
    """Load ``model`` once as a ``bosch`` adapter (all heads full) and build its S(z).

    Args:
        model: a Hugging Face id or local directory; ``toy`` is the bundled model.
        tasks: calibration task/group names (``bosch_niah_calib`` by default).
        include_path: an extra lm-eval task directory for ``tasks``.
        calib_examples: ``bosch_niah_calib`` examples (default 64).
        calib_len: ``bosch_niah_calib`` length in tokens (default: the model's
            ``bosch_defaults.json``, else the task's 32768).
        calib_seed: seed of the ``bosch_niah_calib`` examples.
        metric: the calibration metric.
        device: ``cpu`` or ``cuda`` (under ``accelerate launch``: each process's device);
            None: cuda when torch sees a GPU, else cpu (:func:`bosch_eval.device.pick_device`).
        batch_size: lm-eval batch size of one call.
        dtype: model dtype (default: the checkpoint's).
        attn_backend: hybrid attention backend.
        window: the SWA window of every scored mask (default: ``bosch_defaults.json``).
        metadata: more TaskManager metadata for the user's own tasks (wins over ours).
        limit: lm-eval's ``limit`` per task.
        max_length: HFLM's ``max_length`` (default: the config's; inputs are left-truncated
            to it), for configs that understate the model's context.
        model_args: more adapter/loader keyword arguments (``--model-args``).
        prefix_cache_mb: the adapter's prefix-activation cache budget (0 = none).
    """
    from bosch_eval.device import pick_device
    from bosch_eval.model_adapters.bosch import BoschLM

    device = pick_device(device, "device")
    launch_state(device)
    path = resolve_model(model)
    defaults = model_defaults(path)
    window = window if window is not None else defaults.window
    lm = BoschLM(
        pretrained=path,
        layers="intr",
        ratio=0.0,  # all full until the first set_mask
        window=window,
        device=device,
        batch_size=batch_size,
        dtype=dtype if dtype is not None else "auto",
        attn_backend=attn_backend,
        memoize_tokens=True,
        prefix_cache_mb=prefix_cache_mb,
        **({"max_length": max_length} if max_length is not None else {}),
        **dict(model_args or {}),
    )
    task_metadata: dict[str, Any] = {"pretrained": path, "tokenizer": path, "calib_seed": calib_seed}
    calib_len = calib_len if calib_len is not None else defaults.calib_len
    if calib_len is not None:
        task_metadata["seq_len"] = calib_len
    if calib_examples is not None or "bosch_niah_calib" in tasks:
        task_metadata["num_examples"] = calib_examples if calib_examples is not None else DEFAULT_CALIB_EXAMPLES
    task_metadata.update(metadata or {})
    return CalibrationObjective(lm, tasks, include_path=include_path, metadata=task_metadata, metric=metric, limit=limit)


def launch_state(device: str = "cpu") -> Any:
    """accelerate's process state, set up for ``device`` before anything else touches it.

    Under a launcher (``WORLD_SIZE`` > 1) on CPU, accelerate joins the processes over gloo
    only when its state is first created with ``cpu=True``; a plain ``PartialState()``
    on a machine without GPUs leaves every process alone, each scoring every document.
    ``accelerate launch --cpu`` starts a single process unless given an MPI hostfile, so
    CPU processes are started with ``accelerate launch --multi_gpu --num_processes N``
    (or ``torchrun --nproc_per_node N``) and ``--device cpu``. Call this before the first
    ``PartialState()``/``Accelerator()`` of the program (:func:`build_objective` does, too
    late if the caller made one already); outside a launcher it is ``PartialState()``.

    Raises:
        ObjectiveError: launched as N processes, but accelerate's state already exists for
            another number (it was created earlier, without ``cpu=True``).
    """
    from accelerate import PartialState

    launched = int(os.environ.get("WORLD_SIZE", "1"))
    if launched <= 1:
        return PartialState()
    state = PartialState(cpu=device.split(":")[0] == "cpu")
    if state.num_processes != launched:
        raise ObjectiveError(
            f"launched as {launched} processes, but accelerate's state was created for {state.num_processes}: "
            "something called PartialState()/Accelerator() before launch_state(device); on a machine "
            "without GPUs that leaves every process alone (each would score every document and write "
            "every file). Call bosch_eval.search.objective.launch_state(device) first."
        )
    return state


# -- helpers ------------------------------------------------------------------------------
def _portable(value: Any) -> Any:
    """A bundled toy model's directory as its alias: a journal written in one checkout then
    resumes in another (the directory differs, the model does not)."""
    return (isinstance(value, str) and bundled_alias(value)) or value


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
