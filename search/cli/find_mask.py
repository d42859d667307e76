"""``bosch-eval search`` / ``python -m bosch_eval.search``: BOSCH on a real model, resumable.

::

    bosch-eval search --model toy --ratio 0.5 --out runs/toy-r0.5
    accelerate launch --num_processes 4 -m bosch_eval.search --model Qwen/Qwen3-1.7B-Base \\
        --ratio 0.75 --window 1024 --calib-len 32768 --device cuda --out runs/q3-1.7b-r0.75
    lm_eval --model bosch --model_args pretrained=toy,mask=runs/toy-r0.5/mask.json --tasks ...

The flags and their parsing; the search itself, what it writes and checks, is
:func:`bosch_eval.search.run.api.search_model`.
"""

from __future__ import annotations

import argparse
import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

# Nothing that imports torch, lm-eval or numpy, so that `--help` prints at once: the search
# itself and its cost model are imported where they run.
from bosch_eval.masks.head_mask import ModelShape, ceil_count
from bosch_eval.model_adapters.loader_args import parse_model_args
from bosch_eval.models.model_check import IGNORE_FLAG, model_config, resolve_model
from bosch_eval.runtime.errors import SearchError
from bosch_eval.search.objective.defaults import (
    DEFAULT_CALIB_METRIC,
    DEFAULT_CALIB_TASK,
    DEFAULT_PREFIX_CACHE_MB,
    PAPER_CALIB_TASK,
    default_calib_task,
)
from bosch_eval.search.guard.incumbent_rankings import ranking_sources
from bosch_eval.search.objective.racing import DEFAULT_RACE_CHUNK
from bosch_eval.search.objective.scoring import DEFAULT_ALPHA, DEFAULT_GAMMA
from bosch_eval.search.run.pipeline import VARIANTS, SearchSettings, validate_for_shape
from bosch_eval.search.stages.optimizers import optimizer_methods
from bosch_eval.search.stages.stage2 import DEFAULT_BUCKETS
from bosch_eval.search.stages.subproblems import QUOTAS

if TYPE_CHECKING:
    from bosch_eval.search.run.api import RunOptions
    from bosch_eval.search.objective.loading import CalibrationSettings, LoadSettings

# `--estimate` given without its number: the calls, without a time.
CALLS_ONLY = float("nan")


def add_search_arguments(parser: argparse.ArgumentParser) -> None:
    """The search's flags (shared by ``bosch-eval search`` and ``python -m bosch_eval.search``), in
    the order ``--help`` lists them."""
    _add_run_flags(parser)
    _add_algorithm_flags(parser)
    _add_calibration_flags(parser)
    _add_loading_flags(parser)
    _add_execution_flags(parser)


def _add_run_flags(parser: argparse.ArgumentParser) -> None:
    """The model, the target, where the result goes, and resuming."""
    parser.add_argument(
        "--model",
        required=True,
        help="HF model id or local dir; 'toy' or 'toy-l' is a bundled model, 'smollm2' a packaged one; or a .gguf file",
    )
    parser.add_argument(
        "--ratio", type=float, required=True, help="target share ρ of KV groups turned to SWA, in [0, 1]"
    )
    parser.add_argument("--window", type=int, help="SWA window W (default: the model's bosch_defaults.json)")
    parser.add_argument("--out", help="output directory (default: bosch_search/<model>-<variant>-r<ratio>-s<seed>)")
    parser.add_argument(
        "--resume", action="store_true", help="continue the search journaled in --out, re-evaluating nothing"
    )
    parser.add_argument(
        "--new-settings",
        action="store_true",
        help="with --resume: run settings other than the journal's (ratio, seed, ...) on its scores; without it such a "
        "resume is refused, since it would replace the result. The old mask.json and report.md move to --out/previous/",
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of every optimizer (default 0)")


def _add_algorithm_flags(parser: argparse.ArgumentParser) -> None:
    """How the search runs its stages: the variant, the optimizer, the loss and Stage 2 and 3's settings."""
    parser.add_argument(
        "--budget-per-layer", type=int, default=100, help="κ: evaluations per layer (default 100, paper B.2)"
    )
    parser.add_argument(
        "--variant", choices=VARIANTS, default="guarded",
        help="guarded (default, beyond the paper: bosch after scoring the static rankings' and layer heuristics' masks, "
        "with a local search over the whole model after Stage 3 and one-layer Stage-1 probes when ⌈ρG⌉ = G; never "
        "returns less than the best of those masks), bosch (the paper's stages 1–3), nested (bosch with no layer given "
        "more than Stage 1's SWA groups, chosen among them) or an ablation of §3.4",
    )  # fmt: skip
    parser.add_argument(
        "--rankings", nargs="*", metavar="METHOD|NAME=FILE",
        help="guarded: the static rankings whose masks are incumbents: a ranker computed on the calibration set "
        "(written to OUT/rankings/) or a bosch-ranking/1 file (default: every ranker; none when given no value)",
    )  # fmt: skip
    parser.add_argument(
        "--local-calls", type=int, default=100,
        help="guarded: S() calls of the local search after Stage 3, shared by its two starts (default 100; 0 = none)",
    )  # fmt: skip
    parser.add_argument(
        "--optimizer",
        choices=optimizer_methods(),
        default="auto",
        help="auto: exhaustive if it fits the budget, else NOMAD up to 50 variables, else (1+1)-EA",
    )
    parser.add_argument("--alpha", type=float, default=DEFAULT_ALPHA, help="α, weight of the ratio penalty (Eq. 5)")
    parser.add_argument(
        "--gamma", type=float, default=DEFAULT_GAMMA, help="γ, headroom of the upper anchor b = (1+γ)·S(full)"
    )
    parser.add_argument(
        "--buckets",
        type=float,
        nargs="+",
        help=f"Stage-2 layer ratios, whole numbers of a layer's KV groups (default {' '.join(f'{b:g}' for b in DEFAULT_BUCKETS)}, "
        "the paper's; where those are not whole numbers of G groups, e.g. G = 3, every ratio k/G)",
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


def _add_calibration_flags(parser: argparse.ArgumentParser) -> None:
    """What S(z) is measured on."""
    parser.add_argument(
        "--calib-tasks",
        nargs="+",
        help=f"lm-eval task(s) or group(s) scored as S(z) (default {DEFAULT_CALIB_TASK}; {PAPER_CALIB_TASK} on the "
        "bundled toys, the format they were trained on)",
    )
    parser.add_argument("--include-path", help="extra lm-eval task directory for --calib-tasks")
    parser.add_argument(
        "--calib-metric",
        default=DEFAULT_CALIB_METRIC,
        help=f"metric of the calibration tasks (default {DEFAULT_CALIB_METRIC}: accuracy, the answer's probability on ties; "
        "acc is the paper's)",
    )
    parser.add_argument(
        "--tie-break-tasks", nargs="+", default=[], metavar="TASK",
        help="after the search, score the found mask and the masks the calibration tasks tie with it on these "
        "task(s) (same metric and metadata) and return the best; a deviation from the paper (docs/search.md)",
    )  # fmt: skip
    parser.add_argument("--calib-examples", type=int, help="bosch_niah_calib examples (default 64)")
    parser.add_argument(
        "--calib-len",
        type=int,
        help="bosch_niah_calib length in tokens (default: the model's bosch_defaults.json, else 32768)",
    )
    parser.add_argument(
        IGNORE_FLAG,
        action="store_true",
        help="allow a --calib-len past the config's max_position_embeddings (a config that understates "
        "the context, e.g. with rope scaling); inputs are then not truncated to it",
    )
    parser.add_argument("--calib-seed", type=int, default=0, help="seed of the calibration examples")


def _add_loading_flags(parser: argparse.ArgumentParser) -> None:
    """How the model is loaded."""
    parser.add_argument(
        "--device",
        help="cpu or cuda (default: cuda when torch sees a GPU, else cpu; under accelerate: each process's own GPU)",
    )
    parser.add_argument("--batch-size", type=int, default=1, help="lm-eval batch size of one objective call")
    parser.add_argument("--dtype", help="model dtype, e.g. bfloat16 (default: the checkpoint's)")
    parser.add_argument(
        "--model-args",
        help="more model loader arguments, as lm_eval --model_args: revision=..,trust_remote_code=True,parallelize=True,peft=..",
    )


def _add_execution_flags(parser: argparse.ArgumentParser) -> None:
    """The cost estimate instead of a run, and how S(z) calls are made cheaper (same mask and scores)."""
    parser.add_argument(
        "--estimate",
        type=float,
        nargs="?",
        const=CALLS_ONLY,
        metavar="SECONDS_PER_CALL",
        help="print how many S() calls the search makes (bosch_eval.search.run.cost) and, given the seconds one call takes "
        "(time one lm_eval run of the calibration task), the time; then exit without loading weights (a GGUF model "
        "is converted on first use, to read its config)",
    )
    parser.add_argument(
        "--no-racing",
        dest="racing",
        action="store_false",
        help="score every candidate on every calibration example (default: stop one once it provably cannot win; "
        "same mask and scores)",
    )
    parser.add_argument(
        "--race-chunk",
        type=int,
        default=DEFAULT_RACE_CHUNK,
        help=f"examples per racing step (default {DEFAULT_RACE_CHUNK})",
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
    from accelerate import PartialState

    from bosch_eval.search.run.api import search_model  # the search: torch, lm-eval, accelerate; not for --help

    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    if args.new_settings and not args.resume:
        raise SearchError("--new-settings: continues a journaled search under other settings; pass it with --resume")
    settings = search_settings(args)
    model_args = parse_model_args(args.model_args)
    if args.estimate is not None:
        print(
            render_estimate(
                args.model,
                settings,
                None if args.estimate is CALLS_ONLY else args.estimate,
                tuple(args.calib_tasks or (default_calib_task(args.model),)),
                (args.include_path,) if args.include_path else (),
            )
        )
        return
    out = args.out or f"bosch_search/{Path(args.model).name}-{args.variant}-r{args.ratio:g}-s{args.seed}"
    calibration, load, run = run_settings(args, model_args)
    result = search_model(
        args.model,
        settings,
        out,
        calibration=calibration,
        load=load,
        run=run,
        resume=args.resume,
        new_settings=args.new_settings,
    )
    if PartialState().is_main_process:
        print(
            f"{out}/mask.json: S = {result.score:.4f} (full {result.anchors.all_full:.4f}, all-SWA {result.anchors.all_swa:.4f}), "
            f"SWA ratio {result.mask.swa_ratio:.4f}, {result.evaluations} masks evaluated ({result.new_evaluations} in this run), "
            f"{result.wall_s:.1f} s of search"
        )


def search_settings(args: argparse.Namespace) -> SearchSettings:
    """What decides the search's result, from its flags."""
    return SearchSettings(
        ratio=args.ratio,
        variant=args.variant,
        optimizer=args.optimizer,
        budget_per_layer=args.budget_per_layer,
        alpha=args.alpha,
        gamma=args.gamma,
        seed=args.seed,
        buckets=tuple(args.buckets) if args.buckets is not None else None,  # None: the model's (default_buckets)
        chunk_layers=args.chunk_layers,
        quota=args.quota,
        refine=args.refine,
        local_calls=args.local_calls,
        rankings=None if args.rankings is None else tuple(args.rankings),
    )


def run_settings(
    args: argparse.Namespace, model_args: dict[str, Any]
) -> tuple[CalibrationSettings, LoadSettings, RunOptions]:
    """The calibration, the model's load settings and how the search runs, from its flags."""
    # Their modules load the model (torch, transformers, accelerate): not for --help.
    from bosch_eval.search.run.api import RunOptions
    from bosch_eval.search.objective.loading import CalibrationSettings, LoadSettings

    calibration = CalibrationSettings(
        tasks=tuple(args.calib_tasks or ()),
        include_path=args.include_path,
        metric=args.calib_metric,
        examples=args.calib_examples,
        length=args.calib_len,
        seed=args.calib_seed,
        ignore_max_positions=args.ignore_max_positions,
        tie_break_tasks=tuple(args.tie_break_tasks),
    )
    load = LoadSettings(
        window=args.window,
        device=args.device,
        batch_size=args.batch_size,
        dtype=args.dtype,
        model_args=model_args or None,
        prefix_cache_mb=args.prefix_cache_mb,
    )
    return calibration, load, RunOptions(racing=args.racing, race_chunk=args.race_chunk)


def render_estimate(
    model: str,
    settings: SearchSettings,
    seconds_per_call: float | None,
    calib_tasks: tuple[str, ...] = (),
    include_paths: tuple[str, ...] = (),
) -> str:
    """The cost model's call range, and its time at ``seconds_per_call`` (None: calls only), for
    ``model`` (its config only) under ``settings``; ``calib_tasks`` decide which rankings the
    guarded variant computes for its incumbents (a calibration set's YAML may be in ``include_paths``).

    Raises:
        SearchError: a time that is not positive, or settings that do not fit the model.
    """
    from bosch_eval.search.run.cost import estimate_calls  # numpy: not for --help

    if seconds_per_call is not None and not seconds_per_call > 0:
        raise SearchError(f"--estimate: expected the seconds one S() call takes (> 0), got {seconds_per_call}")
    shape = ModelShape.from_config(model_config(resolve_model(model)))
    validate_for_shape(settings, shape)
    chunk, buckets = settings.chunk_layers_for(shape), settings.buckets_for(shape)
    methods, files = (
        ranking_sources(settings.rankings, calib_tasks or (default_calib_task(model),), include_paths)
        if VARIANTS[settings.variant].incumbents
        else ([], [])
    )
    calls = estimate_calls(shape, settings, rankings=len(methods), ranking_files=len(files))
    per_layer = ceil_count(settings.ratio, shape.num_kv_heads)
    text = (
        f"{model}: L={shape.num_layers} × G={shape.num_kv_heads}, ρ={settings.ratio:g}, κ={settings.budget_per_layer}, "
        f"Stage-2 buckets {', '.join(f'{b:.4g}' for b in buckets)}, {chunk} layers per Stage-3 sub-problem: "
        f"{calls.low}–{calls.high} S() calls ({calls.terms(f' [{per_layer} of {shape.num_kv_heads} groups per layer]')}, "
        "by Stage 2's ratios)"
    )
    if seconds_per_call is None:
        return (
            text
            + calls.rankings_note()
            + "; pass --estimate SECONDS (one lm_eval run of the calibration task) for the time"
        )
    hours = [n * seconds_per_call / 3600 for n in (calls.low, calls.high)]
    return (
        text
        + f" ≈ {hours[0]:.2f}–{hours[1]:.2f} h at {seconds_per_call:g} s per call, before racing"
        + calls.rankings_note()
    )


def add_search_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add ``search`` to ``bosch-eval``'s sub-commands."""
    parser = subparsers.add_parser("search", help="BOSCH: find the head mask for a target SWA ratio (resumable)")
    add_search_arguments(parser)
    parser.set_defaults(run=run_from_args)
    return parser
