"""BOSCH on a real model, from Python: :func:`search_model` (``bosch-eval search`` and
``python -m bosch_eval.search`` are its command line, :mod:`bosch_eval.search.search_cli`).

Writes ``mask.json`` (bosch-mask/1 with the search's provenance), ``journal.jsonl`` (every
evaluation, flushed as it finishes; ``resume`` continues a killed run with no
re-evaluation) and ``report.md``. Under ``accelerate launch`` every process runs the same
search, each objective call is split across processes, and only the main process writes.

Everything that can be checked from the model's name and config is checked before the
weights load and before the first evaluation: that the model exists, the settings that
need its shape (``validate_for_shape``), the window, and a calibration length the model
can hold. The main process then locks ``out`` for the whole run (``outdir_lock``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from accelerate import PartialState

from bosch_eval.device import pick_device
from bosch_eval.launch import launch_state, on_main_then_everywhere
from bosch_eval.masks import HeadMask, ModelShape, uniform_bit
from bosch_eval.model_check import IGNORE_FLAG, IGNORE_METADATA, check_length, model_config, resolve_model
from bosch_eval.model_defaults import model_defaults, resolve_window
from bosch_eval.outdir_lock import OutputLock
from bosch_eval.prefix_cache import DEFAULT_BUDGET_MB as DEFAULT_PREFIX_CACHE_MB
from bosch_eval.search.journal import Journal, JournalError
from bosch_eval.search.objective import CalibrationObjective
from bosch_eval.search.objective_loading import build_objective
from bosch_eval.search.pipeline import SearchResult, SearchSettings, run_search, validate_for_shape
from bosch_eval.search.racing import DEFAULT_RACE_CHUNK, ExampleMemo, RaceBound
from bosch_eval.search.report import render_report
from bosch_eval.search.score_book import ScoreBook
from bosch_eval.search.scoring import Anchors, SearchError
from bosch_eval.versions import versions

DEFAULT_CALIB_TASK = "bosch_niah_calib"
DEFAULT_CALIB_LEN = 32768  # bosch_niah_calib's own default (tasks/niah/calibration.py)
log = logging.getLogger("bosch_eval.search")
VERSIONED_PACKAGES = ("python", "bosch-eval", "torch", "transformers", "lm_eval", "accelerate", "PyNomadBBO")


def search_model(
    model: str,
    settings: SearchSettings,
    out: str | Path,
    *,
    window: int | None = None,
    resume: bool = False,
    calib_tasks: Sequence[str] = (DEFAULT_CALIB_TASK,),
    include_path: str | None = None,
    calib_metric: str = "acc",
    calib_examples: int | None = None,
    calib_len: int | None = None,
    calib_seed: int = 0,
    device: str | None = None,
    batch_size: int = 1,
    dtype: str | None = None,
    progress: bool = True,
    ignore_max_positions: bool = False,
    model_args: Mapping[str, Any] | None = None,
    racing: bool = True,
    race_chunk: int = DEFAULT_RACE_CHUNK,
    prefix_cache_mb: int = DEFAULT_PREFIX_CACHE_MB,
) -> SearchResult:
    """Run BOSCH on ``model`` and write mask.json, journal.jsonl and report.md into ``out``.

    The model is loaded once and the calibration tasks are built once; every process of an
    ``accelerate launch`` must call this with the same arguments. ``ignore_max_positions``:
    allow a calibration length past the config's ``max_position_embeddings``. ``model_args``:
    more adapter/loader arguments (``--model-args``, checked by ``parse_model_args``), pinned in
    the journal header when given. ``racing``, ``race_chunk`` and ``prefix_cache_mb`` make
    the search do less work without changing its mask or any full score (``racing`` is
    skipped, with a log line, where the calibration cannot be raced exactly).

    Raises:
        ModelError: the model does not exist, or a length does not fit it (MaskError: a window).
        SearchError: a setting does not fit the model (checked before any weight loads).
        JournalError: another search holds ``out``, or its journal cannot be resumed.
    """
    device = pick_device(device, "--device")  # None: cuda when torch sees a GPU, else cpu (said once)
    state = launch_state(device)  # before any other accelerate state: joins CPU processes over gloo
    if isinstance(race_chunk, bool) or not isinstance(race_chunk, int) or race_chunk < 1:
        raise SearchError(f"--race-chunk: expected a number of examples >= 1, got {race_chunk!r}")
    if isinstance(prefix_cache_mb, bool) or not isinstance(prefix_cache_mb, int) or prefix_cache_mb < 0:
        raise SearchError(f"--prefix-cache-mb: expected megabytes >= 0 (0 = no cache), got {prefix_cache_mb!r}")
    path = resolve_model(model)
    config = model_config(path)
    validate_for_shape(settings, ModelShape.from_config(config))
    defaults = model_defaults(path)
    window = resolve_window(window, default=defaults.window, source=model, flag="--window W")
    length = calib_len if calib_len is not None else defaults.calib_len
    if length is None and DEFAULT_CALIB_TASK in calib_tasks:
        length = DEFAULT_CALIB_LEN
    if length is not None and not ignore_max_positions:
        check_length(length, model, config, "--calib-len", IGNORE_FLAG)
    out = Path(out)
    lock = OutputLock(out, "search", JournalError) if state.is_main_process else None  # only the main process writes
    on_main_then_everywhere(lock.acquire if lock is not None else None, JournalError, state.num_processes)
    try:
        log.info("loading %s and building the calibration task(s) %s", model, ", ".join(calib_tasks))
        started = time.perf_counter()
        objective = build_objective(
            path,
            tasks=calib_tasks,
            include_path=include_path,
            calib_examples=calib_examples,
            calib_len=calib_len,
            calib_seed=calib_seed,
            metric=calib_metric,
            device=device,
            batch_size=batch_size,
            dtype=dtype,
            window=window,
            metadata={IGNORE_METADATA: True} if ignore_max_positions else None,
            max_length=length if ignore_max_positions else None,
            model_args=model_args,
            prefix_cache_mb=prefix_cache_mb,
        )
        objective.race_chunk = race_chunk
        if racing and (problem := objective.racing_problem()) is not None:
            log.info("racing off: %s; every mask is scored on every example", problem)
            racing = False
        objective.racing = racing
        log.info("ready in %.1f s; evaluating the anchors S(all SWA) and S(all full)", time.perf_counter() - started)
        calibration = objective.describe()
        header = {"model": model, "window": window, "calibration": calibration, "settings": settings.to_json()}
        if model_args:  # they can change every score (revision, peft, quantization): a resume must match them
            header["model_args"] = {key: str(value) for key, value in model_args.items()}
        journal, known, bounds, examples = _open_journal(out / "journal.jsonl", header, resume, state)
        score_fn = _AnchorLog(objective) if progress and state.is_main_process else objective
        if uniform_bit(settings.ratio) is not None:
            result = _only_mask(score_fn, objective.shape, settings, known, journal)
        else:
            result = run_search(
                score_fn,
                objective.shape,
                settings,
                known=known,
                journal=journal,
                progress=progress and state.is_main_process,
                higher_is_better=objective.higher_is_better,
                racing=racing,
                bounds=bounds,
                examples=examples,
            )
        result.work = objective.work()
        if state.is_main_process:
            result.wall_s += journal.prior_wall_s if journal is not None else 0.0  # earlier runs of a resumed search
            provenance = dict(
                result.provenance(), calibration=calibration, seed=settings.seed, versions=versions(*VERSIONED_PACKAGES), processes=state.num_processes
            )
            # --model-args sink=S ran every score with S sinks: the mask file says so.
            sinks = int((model_args or {}).get("sink") or 0)
            mask = result.mask.with_meta(window=window, sinks=sinks, model=model, provenance=provenance)
            mask.save(out / "mask.json")
            (out / "report.md").write_text(render_report(result, model, window, calibration))
        state.wait_for_everyone()
    finally:
        if lock is not None:
            lock.release()
    return result


def _only_mask(
    score_fn: Callable[[HeadMask], float],
    shape: ModelShape,
    settings: SearchSettings,
    known: dict[str, float],
    journal: Journal | None,
) -> SearchResult:
    """Ratio 0 or 1 allows one mask (all full or all SWA): the two anchors are the whole
    search (the stages would spend evaluations on partial masks that cannot be the answer).
    Both anchors are kept because every result reports S(full) and the normalized score."""
    started = time.perf_counter()
    book = ScoreBook(score_fn, shape, known, journal)
    swa, full = HeadMask.uniform(shape, full=False), HeadMask.uniform(shape, full=True)
    anchors = Anchors(all_swa=book.score(swa.bits, "anchor"), all_full=book.score(full.bits, "anchor"), gamma=settings.gamma)
    only = full if uniform_bit(settings.ratio) else swa
    method = "bosch" if settings.variant == "bosch" else f"bosch-{settings.variant}"
    return SearchResult(
        mask=HeadMask(only.bits, shape.num_heads, method=method),
        score=anchors.all_full if uniform_bit(settings.ratio) else anchors.all_swa,
        anchors=anchors,
        settings=settings,
        evaluations=len(book.known),
        new_evaluations=book.new_evaluations,
        wall_s=time.perf_counter() - started,
    )


class _AnchorLog:
    """The objective, logging the two anchor evaluations (the stage bars start only after
    them; on a long calibration they take minutes)."""

    def __init__(self, objective: CalibrationObjective) -> None:
        self.objective = objective

    def __call__(self, mask: HeadMask) -> float:
        started = time.perf_counter()
        score = self.objective(mask)
        kind = {mask.shape.num_layers * mask.shape.num_kv_heads: "all SWA", 0: "all full"}.get(mask.num_swa_groups)
        if kind is not None:
            log.info("S(%s) = %.4f (%.1f s)", kind, score, time.perf_counter() - started)
        return score

    def race(self, mask: HeadMask, can_win: Callable[[float], bool]) -> float | RaceBound:
        return self.objective.race(mask, can_win)

    def race_many(self, masks: list[HeadMask], rule_out: Callable[[list[tuple[float, float]]], set[int]]) -> list[float | RaceBound]:
        return self.objective.race_many(masks, rule_out)

    def recall(self, mask: HeadMask) -> float | None:
        return self.objective.recall(mask)

    def use_memo(self, memo: ExampleMemo) -> None:
        self.objective.use_memo(memo)

    def vary_layers_from(self, layer: int | None) -> None:
        self.objective.vary_layers_from(layer)


def _open_journal(
    path: Path, header: dict[str, Any], resume: bool, state: PartialState
) -> tuple[Journal | None, dict[str, float], dict[str, float], dict[str, dict[str, dict[int, float]]]]:
    """The main process opens the journal; every process gets its scores, racing bounds and
    per-example values (one broadcast: every process must replay the same races)."""
    journal: Journal | None = None

    def open_journal() -> tuple[dict[str, float], dict[str, float], dict[str, dict[str, dict[int, float]]]]:
        nonlocal journal
        path.parent.mkdir(parents=True, exist_ok=True)
        journal = Journal(path, header, resume=resume, reusable=("settings",), wall_time=True)
        return {record["key"]: record["score"] for record in journal.records}, journal.bounds, journal.examples

    main = open_journal if state.is_main_process else None
    known, bounds, examples = on_main_then_everywhere(main, JournalError, state.num_processes)
    return journal, known, bounds, examples
