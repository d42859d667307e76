"""Racing S(z): the evaluation of :class:`~bosch_eval.search.objective.calibration.CalibrationObjective`
in chunks of examples (``evaluate``'s per-task ``samples`` indices), stopped once the mask
provably cannot win (:mod:`bosch_eval.search.objective.racing` keeps the bounds and the order).

Exact for zero-shot tasks whose metric is lm-eval's ``mean`` of per-example values in
[0, 1]: a mask scored to the end gets lm-eval's own aggregation of the same values in the
same order. :meth:`ObjectiveRacing.racing_problem` says why racing cannot apply to a
calibration, before anything is evaluated.

Under N processes the chunks are shared out, not the documents: each process scores whole
items (a mask on some documents of a task) alone, and all values are gathered, so different
masks or parts of one chunk are scored at once.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from bosch_eval.masks.head_mask import HeadMask
from bosch_eval.runtime.errors import LmEvalError
from bosch_eval.search.objective.racing import DEFAULT_RACE_CHUNK, ExampleMemo, RaceBound, Racer, Tally


class ObjectiveRacing:
    """The racing half of :class:`~bosch_eval.search.objective.calibration.CalibrationObjective`, which
    provides the adapter (``lm``), the tasks, metric and direction, the call count, and the
    evaluation of one mask (``_evaluate``, ``_sizes``, ``_example_values``, ``_aggregate``, ``_score``).

    Set at construction (``racing``, ``race_chunk`` of the objective), read here:
        race_chunk: examples per racing step.
        racing: a racing search's objective, where racing can apply: plain calls then log
            per-example values for the racer.
    """

    _race_chunk: int = DEFAULT_RACE_CHUNK
    _racing: bool = False
    _racer_memo: Racer | None = None

    @property
    def race_chunk(self) -> int:
        return self._race_chunk

    @property
    def racing(self) -> bool:
        return self._racing

    def recall(self, mask: HeadMask) -> float | None:
        """What ``self(mask)`` answers, from per-example values scored before (in a race, or
        journaled by a killed search), with no lm-eval call; None when some are missing.

        Raises:
            LmEvalError: racing cannot apply (:meth:`racing_problem`).
        """
        return self._racer().recall(mask, self.metric)

    def use_memo(self, memo: ExampleMemo) -> None:
        """Answer every (mask, example) ``memo`` knows from it, and add every value scored
        from here on to it (the search journals them).

        Raises:
            LmEvalError: racing cannot apply (:meth:`racing_problem`).
        """
        self._racer().memo = memo

    def race(self, mask: HeadMask, can_win: Callable[[float], bool]) -> float | RaceBound:
        """S(z) of ``mask`` scored ``race_chunk`` examples at a time (hardest first), or a
        :class:`RaceBound` as soon as ``can_win(best S still reachable)`` is False; the same
        answer on every process. A mask scored to the end gets exactly ``self(mask)``.

        Raises:
            LmEvalError: racing cannot apply (:meth:`racing_problem`), or a per-example
                value lies outside [0, 1].
        """
        racer = self._racer()
        before = racer.masks_forwarded
        outcome = racer.race(mask, can_win, self.metric)
        self.calls += racer.masks_forwarded - before  # a mask answered from the journal's values is no call
        return outcome

    def race_many(
        self, masks: Sequence[HeadMask], rule_out: Callable[[list[tuple[float, float]]], set[int]]
    ) -> list[float | RaceBound]:
        """Score ``masks`` together (:meth:`Racer.race_many`): masks ``rule_out`` names stop
        with a :class:`RaceBound`, the rest get exactly ``self(mask)``.

        Raises:
            LmEvalError: as :meth:`race`.
        """
        racer = self._racer()
        before = racer.masks_forwarded
        outcomes = racer.race_many(masks, rule_out, self.metric)
        self.calls += racer.masks_forwarded - before
        return outcomes

    def fix_example_order(self, fixed: bool) -> None:
        """Race every mask on the same chunks while ``fixed`` (the order as it stands), so
        that the adapter's prefix cache sees the same batches from one mask to the next.

        Raises:
            LmEvalError: racing cannot apply (:meth:`racing_problem`).
        """
        self._racer().order.fixed = fixed

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

    def _racer(self) -> Racer:
        problem = self.racing_problem()
        if problem is not None:
            raise LmEvalError(f"racing: {problem}")
        if self._racer_memo is None:
            self._racer_memo = Racer(
                self._sizes(),
                self.higher_is_better,
                self._chunk_values,
                self._exact,
                self.race_chunk,
                self.lm.world_size,
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
            LmEvalError: a value outside [0, 1] (racing's bound would not hold), or no
                single filter for the metric (on every process).
        """
        world = self.lm.world_size
        if world <= 1:
            values = [self._local_values(*item) for item in items]
            return [self._checked(value) for value in values]
        from accelerate.utils import gather_object

        mine: dict[int, dict[int, float] | str] = {}
        rank = self.lm.rank
        with self.lm.shard.alone():
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
        # Ascending, whatever the racer's (hardest-first) order: lm-eval reads the chosen
        # documents in dataset order and logs the k-th it read as ``samples[k]``, so indices out
        # of order would give documents each other's values (and one process, scoring a chunk
        # whole, other values than N processes, scoring it in parts).
        results = self._evaluate(sub, samples={name: sorted(indices)}, log_samples=True)
        try:
            values = self._example_values(results["samples"][name])
            Tally({name: len(indices)}, self.higher_is_better).add(name, values, self.metric)  # values in [0, 1]
        except (LmEvalError, ValueError) as err:
            return str(err)
        return values

    @staticmethod
    def _checked(values: dict[int, float] | str) -> dict[int, float]:
        if isinstance(values, str):
            raise LmEvalError(values)
        return values

    def _exact(self, tally: Tally) -> float:
        """S(z) from a complete tally: lm-eval's aggregation of each task's values in document order."""
        return self._score(
            {task: {self.metric: self._aggregate(task, tally.in_document_order(task))} for task in tally.sizes},
            self.metric,
        )
