"""``bosch-eval search`` / ``python -m bosch_eval.search``: BOSCH on a real model, resumable.

::

    bosch-eval search --model toy --ratio 0.5 --out runs/toy-r0.5
    accelerate launch --num_processes 4 -m bosch_eval.search --model Qwen/Qwen3-1.7B-Base \\
        --ratio 0.75 --window 1024 --calib-len 32768 --device cuda --out runs/q3-1.7b-r0.75
    lm_eval --model bosch --model_args pretrained=toy,mask=runs/toy-r0.5/mask.json --tasks ...

Writes ``mask.json`` (bosch-mask/1 with the search's provenance), ``journal.jsonl`` (every
evaluation, flushed as it finishes; ``--resume`` continues a killed run with no
re-evaluation) and ``report.md``. Under ``accelerate launch`` every process runs the same
search, each objective call is split across processes, and only the main process writes.

Everything that can be checked from the model's name and config is checked before the
weights load and before the first evaluation: that the model exists, the settings that
need its shape (``validate_for_shape``), the window, and a calibration length the model
can hold. The main process then locks ``--out`` for the whole run (``outdir_lock``).
"""

from __future__ import annotations

import argparse
import importlib.metadata
import logging
import platform
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from accelerate import PartialState
from accelerate.utils import broadcast_object_list

from bosch_eval.model_adapters.loader_args import parse_model_args
from bosch_eval.masks import HeadMask, MaskError, ModelShape
from bosch_eval.device import pick_device
from bosch_eval.model_check import IGNORE_FLAG, IGNORE_METADATA, check_length, model_config, resolve_model
from bosch_eval.model_defaults import model_defaults
from bosch_eval.prefix_cache import DEFAULT_BUDGET_MB as DEFAULT_PREFIX_CACHE_MB
from bosch_eval.search.cost import estimate_calls
from bosch_eval.search.journal import Journal, JournalError
from bosch_eval.search.objective import CalibrationObjective, ObjectiveError, build_objective, launch_state
from bosch_eval.search.optimizers import METHODS
from bosch_eval.outdir_lock import OutputLock
from bosch_eval.search.pipeline import VARIANTS, SearchResult, SearchSettings, run_search, validate_for_shape
from bosch_eval.search.report import render_report
from bosch_eval.search.racing import DEFAULT_RACE_CHUNK, ExampleMemo, RaceBound
from bosch_eval.search.scoring import DEFAULT_ALPHA, DEFAULT_GAMMA, Anchors, SearchError
from bosch_eval.search.stage2 import DEFAULT_BUCKETS
from bosch_eval.search.score_book import ScoreBook
from bosch_eval.search.stages import QUOTAS
from bosch_eval.tasks.niah.haystack import TemplateTooLong

DEFAULT_CALIB_TASK = "bosch_niah_calib"
DEFAULT_CALIB_LEN = 32768  # bosch_niah_calib's own default (tasks/niah/calibration.py)
log = logging.getLogger("bosch_eval.search")
VERSIONED_PACKAGES = ("bosch-eval", "torch", "transformers", "lm_eval", "accelerate", "PyNomadBBO")


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
        MaskError: the model does not exist, or a length or window does not fit it.
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
    if window is None:
        window = defaults.window
        if window is None:
            raise SearchError(
                f"{model}: no --window given and the model ships no bosch_defaults.json; pass --window "
                "(the paper uses 1024 for a 32k calibration length)"
            )
        log.info("--window %d from %s/bosch_defaults.json", window, path)
    length = calib_len if calib_len is not None else defaults.calib_len
    if length is None and DEFAULT_CALIB_TASK in calib_tasks:
        length = DEFAULT_CALIB_LEN
    if length is not None and not ignore_max_positions:
        check_length(length, model, config, "--calib-len", IGNORE_FLAG)
    out = Path(out)
    lock = OutputLock(out, "search", JournalError) if state.is_main_process else None  # only the main process writes
    _on_main_then_everywhere(state, lock.acquire if lock is not None else None)
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
        if settings.ratio in (0.0, 1.0):
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
                result.provenance(), calibration=calibration, seed=settings.seed, versions=_versions(), processes=state.num_processes
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
    only = swa if settings.ratio == 1.0 else full
    method = "bosch" if settings.variant == "bosch" else f"bosch-{settings.variant}"
    return SearchResult(
        mask=HeadMask(only.bits, shape.num_heads, method=method),
        score=anchors.all_swa if settings.ratio == 1.0 else anchors.all_full,
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


def _on_main_then_everywhere(state: PartialState, action: Callable[[], None] | None) -> None:
    """Run ``action`` on the main process; if it fails, every process raises its error
    (instead of the others waiting for a collective that never comes)."""
    payload: list[Any] = [None]
    if action is not None:
        try:
            action()
        except JournalError as err:
            payload = [str(err)]
    if state.num_processes > 1:
        broadcast_object_list(payload, from_process=0)
    if payload[0] is not None:
        raise JournalError(payload[0])


def _open_journal(
    path: Path, header: dict[str, Any], resume: bool, state: PartialState
) -> tuple[Journal | None, dict[str, float], dict[str, float], dict[str, dict[str, dict[int, float]]]]:
    """The main process opens the journal; every process gets its scores, racing bounds and
    per-example values (one broadcast: every process must replay the same races)."""
    journal: Journal | None = None
    payload: list[Any] = [None]
    if state.is_main_process:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            journal = Journal(path, header, resume=resume, reusable=("settings",), wall_time=True)
            payload = [({record["key"]: record["score"] for record in journal.records}, journal.bounds, journal.examples)]
        except JournalError as err:
            payload = [str(err)]  # every process must raise, not wait for a broadcast that never comes
    if state.num_processes > 1:
        broadcast_object_list(payload, from_process=0)
    if isinstance(payload[0], str):
        raise JournalError(payload[0])
    known, bounds, examples = payload[0]
    return journal, known, bounds, examples


def _versions() -> dict[str, str]:
    versions = {"python": platform.python_version()}
    for package in VERSIONED_PACKAGES:
        try:
            versions[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            versions[package] = "not installed"
    return versions


def add_search_arguments(parser: argparse.ArgumentParser) -> None:
    """The search's flags (shared by ``bosch-eval search`` and ``python -m bosch_eval.search``)."""
    parser.add_argument("--model", required=True, help="HF model id or local dir; 'toy' or 'toy-l' is a bundled model")
    parser.add_argument("--ratio", type=float, required=True, help="target share ρ of KV groups turned to SWA, in [0, 1]")
    parser.add_argument("--window", type=int, help="SWA window W (default: the model's bosch_defaults.json)")
    parser.add_argument("--out", help="output directory (default: bosch_search/<model>-<variant>-r<ratio>-s<seed>)")
    parser.add_argument("--resume", action="store_true", help="continue the search journaled in --out, re-evaluating nothing")
    parser.add_argument("--seed", type=int, default=0, help="seed of every optimizer (default 0)")
    parser.add_argument("--budget-per-layer", type=int, default=100, help="κ: evaluations per layer (default 100, paper B.2)")
    parser.add_argument("--variant", choices=VARIANTS, default="bosch", help="bosch (stages 1–3) or an ablation of §3.4")
    parser.add_argument("--optimizer", choices=METHODS, default="auto", help="auto: exhaustive if it fits the budget, else NOMAD up to 50 variables, else (1+1)-EA")
    parser.add_argument("--alpha", type=float, default=DEFAULT_ALPHA, help="α, weight of the ratio penalty (Eq. 5)")
    parser.add_argument("--gamma", type=float, default=DEFAULT_GAMMA, help="γ, headroom of the upper anchor b = (1+γ)·S(full)")
    parser.add_argument(
        "--buckets", type=float, nargs="+", default=list(DEFAULT_BUCKETS), help="Stage-2 layer ratios (default 0 0.25 0.5 0.75 1)"
    )
    parser.add_argument(
        "--chunk-layers",
        type=int,
        help="most layers one Stage-3 (and B-multi) sub-problem searches jointly (default: the largest power of two p "
        "with p·G <= 50, the paper's B.2 example: 4 for 8 KV groups)",
    )
    parser.add_argument(
        "--quota",
        choices=QUOTAS,
        default="layer",
        help="layer (default, Algorithm 3): ⌈r·G⌉ SWA groups in every layer of a sub-problem; chunk: that many "
        "times the layers anywhere in the sub-problem (a deviation from the paper)",
    )
    parser.add_argument(
        "--refine",
        type=int,
        default=0,
        help="coordinate-descent passes after Stage 3, each re-solving every layer with the others fixed (beyond the "
        "paper; default 0 = plain BOSCH)",
    )
    parser.add_argument("--calib-tasks", nargs="+", default=[DEFAULT_CALIB_TASK], help="lm-eval task(s) or group(s) scored as S(z)")
    parser.add_argument("--include-path", help="extra lm-eval task directory for --calib-tasks")
    parser.add_argument("--calib-metric", default="acc", help="metric of the calibration tasks (default acc)")
    parser.add_argument("--calib-examples", type=int, help="bosch_niah_calib examples (default 64)")
    parser.add_argument(
        "--calib-len", type=int, help="bosch_niah_calib length in tokens (default: the model's bosch_defaults.json, else 32768)"
    )
    parser.add_argument(
        IGNORE_FLAG,
        action="store_true",
        help="allow a --calib-len past the config's max_position_embeddings (a config that understates "
        "the context, e.g. with rope scaling); inputs are then not truncated to it",
    )
    parser.add_argument("--calib-seed", type=int, default=0, help="seed of the calibration examples")
    parser.add_argument(
        "--device", help="cpu or cuda (default: cuda when torch sees a GPU, else cpu; under accelerate: each process's own GPU)"
    )
    parser.add_argument("--batch-size", type=int, default=1, help="lm-eval batch size of one objective call")
    parser.add_argument("--dtype", help="model dtype, e.g. bfloat16 (default: the checkpoint's)")
    parser.add_argument(
        "--model-args",
        help="more model loader arguments, as lm_eval --model_args: revision=..,trust_remote_code=True,parallelize=True,peft=..",
    )
    parser.add_argument(
        "--estimate",
        type=float,
        metavar="SECONDS_PER_CALL",
        help="print how many S() calls the search makes (bosch_eval.search.cost) and the time at this many seconds per "
        "call (time one lm_eval run of the calibration task), then exit without loading weights",
    )
    parser.add_argument(
        "--no-racing",
        dest="racing",
        action="store_false",
        help="score every candidate on every calibration example (default: stop one once it provably cannot win; "
        "same mask and scores)",
    )
    parser.add_argument(
        "--race-chunk", type=int, default=DEFAULT_RACE_CHUNK, help=f"examples per racing step (default {DEFAULT_RACE_CHUNK})"
    )
    parser.add_argument(
        "--prefix-cache-mb",
        type=int,
        default=DEFAULT_PREFIX_CACHE_MB,
        help="memory for the hidden states entering a sub-problem's lowest layer, reused by every candidate "
        f"(default {DEFAULT_PREFIX_CACHE_MB}; 0 = off; over it, the rest of the examples run every layer)",
    )


def run_from_args(args: argparse.Namespace) -> None:
    """Build the settings from parsed flags and run the search."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    settings = SearchSettings(
        ratio=args.ratio,
        variant=args.variant,
        optimizer=args.optimizer,
        budget_per_layer=args.budget_per_layer,
        alpha=args.alpha,
        gamma=args.gamma,
        seed=args.seed,
        buckets=tuple(args.buckets),
        chunk_layers=args.chunk_layers,
        quota=args.quota,
        refine=args.refine,
    )
    model_args = parse_model_args(args.model_args)
    if args.estimate is not None:
        print(render_estimate(args.model, settings, args.estimate))
        return
    out = args.out or f"bosch_search/{Path(args.model).name}-{args.variant}-r{args.ratio:g}-s{args.seed}"
    result = search_model(
        args.model,
        settings,
        out,
        window=args.window,
        resume=args.resume,
        calib_tasks=args.calib_tasks,
        include_path=args.include_path,
        calib_metric=args.calib_metric,
        calib_examples=args.calib_examples,
        calib_len=args.calib_len,
        calib_seed=args.calib_seed,
        device=args.device,
        batch_size=args.batch_size,
        dtype=args.dtype,
        ignore_max_positions=args.ignore_max_positions,
        model_args=model_args,
        racing=args.racing,
        race_chunk=args.race_chunk,
        prefix_cache_mb=args.prefix_cache_mb,
    )
    if PartialState().is_main_process:
        print(
            f"{out}/mask.json: S = {result.score:.4f} (full {result.anchors.all_full:.4f}, all-SWA {result.anchors.all_swa:.4f}), "
            f"SWA ratio {result.mask.swa_ratio:.4f}, {result.evaluations} masks evaluated ({result.new_evaluations} now), "
            f"{result.wall_s:.1f} s of search"
        )


def render_estimate(model: str, settings: SearchSettings, seconds_per_call: float) -> str:
    """The cost model's call range and time for ``model`` (its config only) under ``settings``.

    Raises:
        SearchError: a negative time, or settings that do not fit the model.
    """
    if not seconds_per_call > 0:
        raise SearchError(f"--estimate: expected the seconds one S() call takes (> 0), got {seconds_per_call}")
    shape = ModelShape.from_config(model_config(resolve_model(model)))
    validate_for_shape(settings, shape)
    chunk = settings.chunk_layers_for(shape)
    calls = estimate_calls(shape, settings.ratio, settings.budget_per_layer, chunk, settings.optimizer, settings.quota)
    hours = [n * seconds_per_call / 3600 for n in (calls.low, calls.high)]
    return (
        f"{model}: L={shape.num_layers} × G={shape.num_kv_heads}, ρ={settings.ratio:g}, κ={settings.budget_per_layer}, "
        f"{chunk} layers per Stage-3 sub-problem: {calls.low}–{calls.high} S() calls (2 anchors + {calls.stage1} Stage 1 "
        f"+ {calls.stage3_low}–{calls.stage3_high} Stage 3, by Stage 2's ratios) ≈ {hours[0]:.2f}–{hours[1]:.2f} h at "
        f"{seconds_per_call:g} s per call, before racing"
    )


def add_search_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add ``search`` to ``bosch-eval``'s sub-commands."""
    parser = subparsers.add_parser("search", help="BOSCH: find the head mask for a target SWA ratio (resumable)")
    add_search_arguments(parser)
    parser.set_defaults(run=run_from_args)
    return parser


# What the command line reports as a one-line error instead of a traceback.
ERRORS = (MaskError, SearchError, JournalError, ObjectiveError, TemplateTooLong)
