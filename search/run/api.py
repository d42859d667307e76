"""BOSCH on a real model, from Python: :func:`search_model` (``bosch-eval search`` and
``python -m bosch_eval.search`` are its command line, :mod:`bosch_eval.search.cli.find_mask`).

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
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from accelerate import PartialState

from bosch_eval.masks.head_mask import HeadMask, ModelShape, uniform_bit
from bosch_eval.models.model_check import IGNORE_FLAG, check_length
from bosch_eval.models.model_defaults import resolve_window
from bosch_eval.models.model_identity import model_identity, portable_name, same_model
from bosch_eval.models.resolved_model import ResolvedModel
from bosch_eval.runtime.checks import is_int
from bosch_eval.runtime.device import pick_device
from bosch_eval.runtime.errors import JournalError, SearchError
from bosch_eval.runtime.launch import launch_state, on_main_then_everywhere
from bosch_eval.runtime.outdir_lock import OutputLock
from bosch_eval.runtime.previous_results import keep_aside
from bosch_eval.runtime.versions import versions
from bosch_eval.search.objective.defaults import (
    DEFAULT_CALIB_EXAMPLES,
    DEFAULT_CALIB_LEN,
    DEFAULT_PREFIX_CACHE_MB,
)
from bosch_eval.search.guard.incumbent_rankings import (
    RankingLoad,
    computed_incumbents,
    file_incumbents,
    ranking_sources,
)
from bosch_eval.search.journal.store import Journal, mask_key
from bosch_eval.search.journal.header import header_changes, other_settings_error
from bosch_eval.search.objective.calibration import CalibrationObjective
from bosch_eval.search.objective.loading import CalibrationSettings, LoadSettings, build_objective
from bosch_eval.search.objective.racing import DEFAULT_RACE_CHUNK, ExampleMemo, RaceBound, Racing
from bosch_eval.search.objective.score_book import ScoreBook
from bosch_eval.search.objective.scoring import Anchors, ScoreScale
from bosch_eval.search.run.pipeline import (
    VARIANTS,
    Resumed,
    SearchResult,
    SearchSettings,
    run_search,
    validate_for_shape,
)
from bosch_eval.search.rankers.driver import RankingInputs
from bosch_eval.search.run.report import render_report
from bosch_eval.model_adapters.loader_args import adapter_settings
from bosch_eval.search.objective.tie_break import (
    TieBreak,
    TieBreakFile,
    best_key,
    break_ties,
    shared_rows_layer,
    tie_key_bits,
)

log = logging.getLogger("bosch_eval.search")
VERSIONED_PACKAGES = ("python", "bosch-eval", "torch", "transformers", "lm_eval", "accelerate", "PyNomadBBO")
GUARDED_FIELDS = ("local_calls", "incumbents", "rankings")  # settings the guarded variant added (migrate_header)
RESULT_FILES = ("mask.json", "report.md")  # what a search under new settings replaces (kept aside first)


@dataclass(frozen=True)
class RunOptions:
    """How the search runs; none of it changes the mask or any full score.

    Attributes:
        racing: stop a candidate once it provably cannot win (skipped, with a log line,
            where the calibration cannot be raced exactly).
        race_chunk: examples per racing step.
        progress: tqdm bars and per-sub-problem log lines (main process only).
    """

    racing: bool = True
    race_chunk: int = DEFAULT_RACE_CHUNK
    progress: bool = True

    def __post_init__(self) -> None:
        if not is_int(self.race_chunk) or self.race_chunk < 1:
            raise SearchError(f"--race-chunk: expected a number of examples >= 1, got {self.race_chunk!r}")


SEARCH_LOAD = LoadSettings(prefix_cache_mb=DEFAULT_PREFIX_CACHE_MB)


def search_model(
    model: str,
    settings: SearchSettings,
    out: str | Path,
    *,
    calibration: CalibrationSettings = CalibrationSettings(),
    load: LoadSettings = SEARCH_LOAD,
    run: RunOptions = RunOptions(),
    resume: bool = False,
    new_settings: bool = False,
) -> SearchResult:
    """Run BOSCH on ``model`` and write mask.json, journal.jsonl and report.md into ``out``.

    The model is loaded once and the calibration tasks are built once; every process of an
    ``accelerate launch`` must call this with the same arguments. ``load.model_args`` (more
    adapter/loader arguments, ``--model-args``, checked by ``parse_model_args``) are pinned in
    the journal header when given. ``resume`` continues the search journaled in ``out``; one
    under other search settings would replace its result and is refused unless
    ``new_settings``, which keeps the old mask.json and report.md in ``out/previous/``.

    Raises:
        ModelError: the model does not exist, or a length does not fit it (MaskError: a window).
        SearchError: a setting does not fit the model (checked before any weight loads).
        JournalError: another search holds ``out``, or its journal cannot be resumed.
    """
    device = pick_device(load.device, "--device")  # None: cuda when torch sees a GPU, else cpu (said once)
    state = launch_state(device)  # before any other accelerate state: joins CPU processes over gloo
    if not is_int(load.prefix_cache_mb) or load.prefix_cache_mb < 0:
        raise SearchError(f"--prefix-cache-mb: expected megabytes >= 0 (0 = no cache), got {load.prefix_cache_mb!r}")
    calibration = calibration.for_model(model)
    target = _target(model, settings, calibration, load.window)
    pinned = settings.pinned_json(target.shape)
    out = Path(out)
    ranked = (
        ranking_sources(settings.rankings, calibration.tasks, calibration.include_paths)
        if VARIANTS[settings.variant].incumbents
        else None
    )
    if resume and not new_settings:  # before the model loads; the journal checks again, under the lock
        _refuse_other_settings(out, pinned, ranked is not None, calibration)
    if not resume:
        _refuse_a_used_folder(out, pinned, ranked is not None, calibration)
    lock = OutputLock(out, "search", JournalError) if state.is_main_process else None  # only the main process writes
    on_main_then_everywhere(lock.acquire if lock is not None else None, JournalError, state.num_processes)
    try:
        if ranked is not None:  # before the search's model loads: the rankers load their own copy
            settings = _with_incumbents(settings, ranked, target, calibration, load, device, out, state)
            pinned = settings.pinned_json(target.shape)
        objective = _load_objective(target, calibration, replace(load, window=target.window, device=device), run)
        calibration_json = objective.describe()
        dtype = str(objective.lm.model.dtype).removeprefix("torch.")
        header = journal_header(model, target.path, target.window, calibration_json, pinned, load.model_args, dtype)
        journal, resumed = _open_journal(out, header, resume, new_settings, state)
        # Built before the search, so that a bad task or a tiebreak.jsonl of other settings fails first.
        tie_breaker = _tie_break_objective(objective, calibration.tie_break_tasks, out, header, state.is_main_process)
        result = _search(objective, settings, journal, resumed, tie_breaker, run.progress and state.is_main_process)
        if state.is_main_process:
            # --model-args sink=S ran every score with S sinks (the adapter's setting, checked there): the mask file says so.
            sinks = objective.lm.settings.sink or 0
            _write_result(out, result, target, calibration_json, sinks, state.num_processes)
        state.wait_for_everyone()
    finally:
        if lock is not None:
            lock.release()
    return result


@dataclass(frozen=True)
class _Target:
    """The model a search runs on, as checked from its name and config before any weight loads."""

    resolved: ResolvedModel
    window: int
    length: int | None  # of the calibration examples; None: the tasks' own

    @property
    def model(self) -> str:  # as given
        return str(self.resolved.name)

    @property
    def path(self) -> str:
        return str(self.resolved.path)

    @property
    def shape(self) -> ModelShape:
        return self.resolved.shape


def _target(model: str, settings: SearchSettings, calibration: CalibrationSettings, window: int | None) -> _Target:
    """The model resolved and every setting that needs its config checked: the search's settings
    against its shape, the window, and a calibration length it can hold.

    Raises:
        ModelError: the model does not exist, or the length does not fit it.
        SearchError: a setting does not fit the model.
    """
    resolved = ResolvedModel.named(model)
    validate_for_shape(settings, resolved.shape)
    if calibration.tie_break_tasks and uniform_bit(settings.ratio) is not None:
        raise SearchError(f"--tie-break-tasks: ratio {settings.ratio:g} allows one mask, so there are no ties to break")
    defaults = resolved.defaults
    window = resolve_window(window, default=defaults.window, source=model, flag="--window W")
    length = calibration.length if calibration.length is not None else defaults.calib_len
    if length is None and calibration.sized:
        length = DEFAULT_CALIB_LEN
    if length is not None and not calibration.ignore_max_positions:
        check_length(length, model, resolved.config, "--calib-len", IGNORE_FLAG)
    return _Target(resolved, window, length)


def _refuse_other_settings(
    out: Path, pinned: dict[str, Any], incumbents: bool, calibration: CalibrationSettings
) -> None:
    """A resume under other settings refused before the model loads (the journal checks again, under the
    lock)."""
    changed = _setting_changes(out / "journal.jsonl", pinned, incumbents, calibration)
    if changed:
        raise other_settings_error(out / "journal.jsonl", changed)


def _refuse_a_used_folder(
    out: Path, pinned: dict[str, Any], incumbents: bool, calibration: CalibrationSettings
) -> None:
    """Without ``--resume``, a folder that holds a search is refused before the model loads (the
    journal would refuse it after), saying what a resume would change, so the next command is right."""
    path = out / "journal.jsonl"
    packed = path.with_name(path.name + ".gz")
    records = path.exists() and path.read_bytes().count(b"\n") >= 2  # a header alone starts afresh
    if not (packed.exists() or records):
        return
    changed = _setting_changes(path, pinned, incumbents, calibration)
    hint = (
        f"; a resume would change {'; '.join(changed)}, so it needs --new-settings (the old result is kept)"
        if changed
        else "; it ran under these settings"
    )
    raise JournalError(
        f"{path if path.exists() else packed}: holds a search; pass --resume to continue it{hint}, or choose another "
        "--out (finished work is never overwritten)"
    )


def _setting_changes(
    path: Path, pinned: dict[str, Any], incumbents: bool, calibration: CalibrationSettings
) -> list[str]:
    """What a resume of the journal at ``path`` would change: the search's settings, and the
    calibration's tasks and metric (a journal of the paper's ``acc`` resumed under today's default
    metric is the common case)."""

    def as_now(stored: dict[str, Any]) -> dict[str, Any]:
        header = migrate_header(stored, {"settings": pinned})
        if not incumbents or not isinstance(header.get("settings"), dict):
            return header
        # The rankings' incumbents are known once computed; the journal compares them then.
        return dict(header, settings=dict(header["settings"], incumbents=pinned["incumbents"]))

    chosen = {"tasks": list(calibration.tasks), "metric": calibration.metric}

    def chosen_of(stored: dict[str, Any]) -> dict[str, Any]:
        known = stored.get("calibration")
        return dict(stored, calibration={key: known.get(key) for key in chosen}) if isinstance(known, dict) else stored

    return header_changes(path, "settings", pinned, migrate=as_now) + header_changes(
        path, "calibration", chosen, migrate=chosen_of
    )


def _with_incumbents(
    settings: SearchSettings,
    ranked: tuple[list[str], list[str]],
    target: _Target,
    calibration: CalibrationSettings,
    load: LoadSettings,
    device: Any,
    out: Path,
    state: PartialState,
) -> SearchSettings:
    """``settings`` with the guarded variant's incumbents: the masks of the ranking files and of
    the rankers (computed on the main process, then shared, on ``device`` with ``load.model_args``),
    checked against the model's shape."""
    methods, files = ranked
    inputs = RankingInputs(
        window=target.window, examples=calibration.examples or DEFAULT_CALIB_EXAMPLES, length=target.length or DEFAULT_CALIB_LEN,
        seed=calibration.seed, task=calibration.tasks[0], include_paths=calibration.include_paths,
    )  # fmt: skip
    # The rankers read the model as it is (full attention): the adapter's own settings (sink=,
    # attn_backend=, ...) are not theirs, only how the model loads (revision=, trust_remote_code=, ...).
    loader_args = adapter_settings(load.model_args or {})[1]
    ranking_load = RankingLoad(target.model, target.path, inputs, device, loader_args)

    def incumbents() -> list[tuple[str, str]]:
        return [
            *file_incumbents(files, target.shape, settings.ratio),
            *computed_incumbents(methods, ranking_load, settings.ratio, out),
        ]

    given = on_main_then_everywhere(incumbents if state.is_main_process else None, SearchError, state.num_processes)
    settings = replace(settings, incumbents=(*settings.incumbents, *map(tuple, given)))
    validate_for_shape(settings, target.shape)
    return settings


def _load_objective(
    target: _Target, calibration: CalibrationSettings, load: LoadSettings, run: RunOptions
) -> CalibrationObjective:
    """The model loaded once and the calibration task(s) built once: S(z)."""
    log.info("loading %s and building the calibration task(s) %s", target.model, ", ".join(calibration.tasks))
    started = time.perf_counter()
    objective = build_objective(target.resolved, calibration, load, Racing(run.racing, run.race_chunk))
    if run.racing and not objective.racing:
        log.info("racing off: %s; every mask is scored on every example", objective.racing_problem())
    log.info("ready in %.1f s; evaluating the anchors S(all SWA) and S(all full)", time.perf_counter() - started)
    return objective


def _search(
    objective: CalibrationObjective,
    settings: SearchSettings,
    journal: Journal | None,
    resumed: Resumed,
    tie_breaker: tuple[CalibrationObjective, TieBreakFile] | None,
    progress: bool,
) -> SearchResult:
    """The stages (or the one mask a ratio of 0 or 1 allows), the tie-break, and the work and
    time of every run of the journal."""
    score_fn = _AnchorLog(objective) if progress else objective
    if uniform_bit(settings.ratio) is not None:
        result = _only_mask(score_fn, objective.shape, settings, resumed.scores, journal)
    else:
        result = run_search(
            score_fn,
            objective.shape,
            settings,
            resumed=resumed,
            journal=journal,
            progress=progress,
            # A tie-break orders the masks S ties: stopping at the first perfect one would leave it fewer.
            scale=ScoreScale(objective.higher_is_better, objective.best_possible if tie_breaker is None else None),
            racing=objective.racing,
        )
        if tie_breaker is not None:
            result = _break_ties(result, *tie_breaker, progress)
    prior_wall_s = journal.prior_wall_s if journal is not None else 0.0  # earlier runs of a resumed search
    return replace(result, work=objective.work(), wall_s=result.wall_s + prior_wall_s)


def _write_result(
    out: Path, result: SearchResult, target: _Target, calibration_json: dict[str, Any], sinks: int, processes: int
) -> None:
    """mask.json, with the search's provenance, and report.md (the main process's)."""
    provenance = dict(
        result.provenance(),
        calibration=calibration_json,
        seed=result.settings.seed,
        versions=versions(*VERSIONED_PACKAGES),
        processes=processes,
    )
    mask = result.mask.with_meta(window=target.window, sinks=sinks, model=target.model, provenance=provenance)
    mask.save(out / "mask.json")
    (out / "report.md").write_text(render_report(result, target.model, target.window, calibration_json))


def _tie_break_objective(
    objective: CalibrationObjective, tasks: tuple[str, ...], out: Path, header: Mapping[str, Any], main_process: bool
) -> tuple[CalibrationObjective, TieBreakFile] | None:
    """The tie-break's S on ``tasks`` (the same model, metric and task metadata as ``objective``)
    and its ``tiebreak.jsonl``, which every process reads here, before any collective call, after
    which only the main process appends to it; None without tie-break tasks."""
    if not tasks:
        return None
    chooser = CalibrationObjective(
        objective.lm, tasks, include_path=objective.include_path, metadata=objective.metadata, metric=objective.metric,
        limit=objective.limit, racing=Racing(objective.racing, objective.race_chunk),  # racing changes which mask wins in no case
    )  # fmt: skip
    return chooser, TieBreakFile(out, {"objective": chooser.describe(), "journal": header}, write=main_process)


def _break_ties(
    result: SearchResult, chooser: CalibrationObjective, record: TieBreakFile, progress: bool
) -> SearchResult:
    """Score the found mask and the masks tied with it by ``chooser``: the result with the best
    of them as its mask, and how the tie-break ordered them."""
    found = mask_key(result.mask.bits)
    candidates = (found, *(result.ties.keys if result.ties is not None else ()))
    prefix_layer = shared_rows_layer(candidates)
    if prefix_layer is not None and chooser.relative_cost(prefix_layer) < 1.0:
        log.info(
            "search: tie-break: the prefix cache runs each candidate from layer %d (the rows below are shared in runs)",
            prefix_layer,
        )
    chooser.vary_layers_from(prefix_layer)
    if chooser.racing:  # one example order for every candidate: the same batches, so the cache's states are reused
        chooser.fix_example_order(True)
    try:
        scores = break_ties(
            candidates, chooser, chooser.shape.num_heads, record.scores, race=chooser.racing,
            higher_is_better=chooser.higher_is_better, on_score=record.append, progress=progress,
        )  # fmt: skip
    finally:
        chooser.vary_layers_from(None)
        if chooser.racing:
            chooser.fix_example_order(False)
    tie_break = TieBreak(chooser.tasks, scores, best_key(scores, chooser.higher_is_better))
    log.info("search: tie-break on %s: %s", ", ".join(chooser.tasks), tie_break.message())
    mask = result.mask
    if tie_break.chosen != found:
        mask = HeadMask(tie_key_bits(tie_break.chosen), chooser.shape.num_heads, method=result.mask.method)
    return replace(result, mask=mask, tie_break=tie_break)


def journal_header(
    model: str,
    path: str,
    window: int,
    calibration: Mapping[str, Any],
    settings: Mapping[str, Any],
    model_args: Mapping[str, Any] | None,
    dtype: str,
) -> dict[str, Any]:
    """What the journal pins: the model by its name (a bundled model's alias, wherever the
    checkout lies) and identity (:func:`bosch_eval.models.model_identity.model_identity`), the
    dtype it computes in (bf16 and fp32 round differently, so S can differ by an example), the
    window, the calibration and the search settings (:meth:`SearchSettings.pinned_json`)."""
    header = {
        "model": portable_name(model),
        "model_identity": model_identity(path, (model_args or {}).get("revision")),
        "dtype": dtype,
        "window": window,
        "calibration": dict(calibration),
        "settings": dict(settings),
    }
    if model_args:  # they can change every score (revision, peft, quantization): a resume must match them
        header["model_args"] = {key: str(value) for key, value in model_args.items()}
    return header


def migrate_header(stored: dict[str, Any], current: Mapping[str, Any]) -> dict[str, Any]:
    """A journal header as this version writes it: paths of a bundled model's directory (from
    any checkout) become its alias, a journal from before models were pinned by identity
    takes today's identity (it pinned the model by name only; logged), one from before the
    dtype was pinned takes this run's (logged: the file cannot say which it was), and Stage-2
    buckets pinned as null (the model's default, before pins named them) become the ones
    they meant."""
    header = dict(stored)
    if isinstance(header.get("model"), str):
        header["model"] = portable_name(header["model"])
    calibration = header.get("calibration")
    if isinstance(calibration, dict) and isinstance(calibration.get("metadata"), dict):
        metadata = {
            key: portable_name(value) if isinstance(value, str) else value
            for key, value in calibration["metadata"].items()
        }
        header["calibration"] = dict(calibration, metadata=metadata)
    if (
        "model_identity" in header
        and "model_identity" in current
        and same_model(header["model_identity"], current["model_identity"])
    ):
        header["model_identity"] = current["model_identity"]  # the same files, read by another transformers release
    if "model_identity" not in header and "model_identity" in current:
        log.info(
            "the journal pins the model %r by name only (an older bosch-eval); its files are pinned now",
            header.get("model"),
        )
        header["model_identity"] = current["model_identity"]
    if "dtype" not in header and "dtype" in current:
        log.info(
            "the journal does not pin the dtype (an older bosch-eval); its scores are taken as %s, this run's",
            current["dtype"],
        )
        header["dtype"] = current["dtype"]
    settings, now = header.get("settings"), current.get("settings")
    if (
        isinstance(settings, dict)
        and "buckets" in settings
        and settings["buckets"] is None
        and isinstance(now, Mapping)
    ):
        header["settings"] = settings = dict(
            settings, buckets=now.get("buckets")
        )  # the model is pinned: its default is the same
    if isinstance(settings, dict) and "local_calls" not in settings and isinstance(now, Mapping):
        # From before the guarded variant: no variant it could run reads these fields.
        header["settings"] = dict(settings, **{key: now.get(key) for key in GUARDED_FIELDS})
    return header


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
    anchors = Anchors(
        all_swa=book.score(swa.bits, "anchor"), all_full=book.score(full.bits, "anchor"), gamma=settings.gamma
    )
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

    def race_many(
        self, masks: list[HeadMask], rule_out: Callable[[list[tuple[float, float]]], set[int]]
    ) -> list[float | RaceBound]:
        return self.objective.race_many(masks, rule_out)

    def recall(self, mask: HeadMask) -> float | None:
        return self.objective.recall(mask)

    def use_memo(self, memo: ExampleMemo) -> None:
        self.objective.use_memo(memo)

    def vary_layers_from(self, layer: int | None) -> None:
        self.objective.vary_layers_from(layer)

    def relative_cost(self, lowest_layer: int | None) -> float:
        return self.objective.relative_cost(lowest_layer)


def _open_journal(
    out: Path, header: dict[str, Any], resume: bool, new_settings: bool, state: PartialState
) -> tuple[Journal | None, Resumed]:
    """The main process opens the journal; every process gets what it holds (one broadcast:
    every process must replay the same races)."""
    journal: Journal | None = None

    def keep_old_result(stored: dict[str, Any]) -> None:
        keep_aside(out, RESULT_FILES, {"journal header": stored})

    def open_journal() -> Resumed:
        nonlocal journal
        out.mkdir(parents=True, exist_ok=True)
        journal = Journal(
            out / "journal.jsonl",
            header,
            resume=resume,
            reusable=("settings",),
            wall_time=True,
            on_new_settings=keep_old_result if new_settings else None,
            migrate=lambda stored: migrate_header(stored, header),
        )
        return Resumed.of(journal)

    main = open_journal if state.is_main_process else None
    resumed = on_main_then_everywhere(main, JournalError, state.num_processes)
    return journal, resumed
