"""``bosch-eval rank``: score every KV group of a model with a training-free method (paper B.3).

::

    bosch-eval rank --method dcam --model toy --out ranking.json
    bosch-eval mask from-ranking ranking.json --ratio 0.75 --out mask.json

The window and the calibration length default to the model's ``bosch_defaults.json``
(the bundled toy model ships one); any other model needs ``--window`` and
``--calib-len``. The output is a ``bosch-ranking/1`` file whose provenance records the
method, its settings, the calibration settings, the wall time and the versions.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

from bosch_eval.model_adapters.loader_args import parse_model_args
from bosch_eval.models.model_check import check_length
from bosch_eval.models.model_defaults import resolve_window
from bosch_eval.runtime.device import pick_device
from bosch_eval.runtime.errors import SettingsError, TemplateTooLong
from bosch_eval.search.rankers import RANKERS
from bosch_eval.search.objective.defaults import DEFAULT_CALIB_TASK, PAPER_CALIB_TASK, default_calib_task
from bosch_eval.tasks.niah.calibration_sets import calibration_sets

_HELP = {"-h", "--help"}


class _RankParser(argparse.ArgumentParser):
    """``rank``'s parser: the flags every method takes; what it does not know it keeps, as
    ``method_flags``, for the ranker ``--method`` names, whose own flags (``Ranker.flags``)
    :func:`method_options` parses when the command runs. Knowing every ranker's flags here
    would import every ranker, and torch, to parse any command; ``--help`` beside
    ``--method NAME`` lists that ranker's flags."""

    def parse_known_args(self, args: Any = None, namespace: Any = None) -> tuple[argparse.Namespace, list[str]]:
        args = list(sys.argv[1:] if args is None else args)
        if _HELP & set(args):
            self._add_flags_of(_named_method(args))
        parsed, rest = super().parse_known_args(args, namespace)
        parsed.method_flags = rest
        return parsed, []

    def _add_flags_of(self, method: str | None) -> None:
        if method is None or method not in RANKERS:  # an unknown name: rank_main says so when it runs
            return
        flags = RANKERS[method].flags
        group = self.add_argument_group(f"--method {method}'s flags", None if flags else "none")
        for flag in flags:
            flag.add_to(group)


def _named_method(args: list[str]) -> str | None:
    """The ``--method`` in ``args``, read without the other flags (None: not given)."""
    reader = argparse.ArgumentParser(add_help=False)
    reader.add_argument("--method")
    return reader.parse_known_args(args)[0].method


def add_rank_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add the ``rank`` command to ``subparsers`` (from ``parser.add_subparsers()``)."""
    parser = subparsers.add_parser(
        "rank",
        help="rank KV groups with a training-free method (paper B.3)",
        description="Run a model over the bosch_niah_calib examples (Razor: a repeated random block) and write a "
        "bosch-ranking/1 file of per-KV-group locality scores (paper Appendix B.3); a group's score is the mean "
        "of its query heads'. Use it with ranking=FILE,ratio=R or 'bosch-eval mask from-ranking'.",
        epilog="A method's own flags are named after it (--proxy-block, --qada-buffer); "
        "'bosch-eval rank --method NAME --help' lists them.",
    )
    # argparse builds every sub-command's parser of the one class add_subparsers() got; rank's keeps
    # the flags it does not know for the method (_RankParser.parse_known_args).
    parser.__class__ = _RankParser
    # No `choices`: listing the rankers imports them (and torch); rank_main checks the name first.
    parser.add_argument(
        "--method",
        required=True,
        metavar="NAME",
        help="ranking method: a ranker registered in bosch_eval.search.rankers (paper B.3.1–B.3.6; a wrong name lists them)",
    )
    parser.add_argument(
        "--model",
        required=True,
        help="HF model id, local checkpoint directory, 'toy' / 'toy-l' (bundled), 'smollm2' (packaged), or a .gguf file",
    )
    parser.add_argument("--out", required=True, help="where to write the bosch-ranking/1 JSON")
    parser.add_argument("--window", type=int, help="SWA window W (default: the model's bosch_defaults.json)")
    parser.add_argument(
        "--calib-examples", type=int, default=64, help="calibration examples (Razor: probes); default 64 (paper B.4)"
    )
    parser.add_argument(
        "--calib-len", type=int, help="tokens per calibration example (default: the model's bosch_defaults.json)"
    )
    parser.add_argument(
        "--ignore-max-positions",
        action="store_true",
        help="allow a --calib-len past the config's max_position_embeddings (a config that understates the context)",
    )
    parser.add_argument("--seed", type=int, default=0, help="calibration seed (Razor: probe seed); default 0")
    parser.add_argument(
        "--calib-task",
        help=f"the calibration set the method reads (not Razor; a task of tasks/ or --include-path whose generator "
        f"defines calibration_examples); default {DEFAULT_CALIB_TASK}, {PAPER_CALIB_TASK} on the bundled toys",
    )
    parser.add_argument("--include-path", help="a folder of lm-eval task YAMLs that holds --calib-task")
    parser.add_argument("--block-size", type=int, default=64, help="query rows per streamed attention block")
    parser.add_argument("--device", help="cpu, cuda, ... (default: cuda when torch sees a GPU, else cpu)")
    parser.add_argument(
        "--dtype", default="float32", choices=["float32", "bfloat16", "float16"], help="model weights dtype"
    )
    parser.add_argument(
        "--model-args",
        help="more model loader arguments, as lm_eval --model_args (the model is then loaded by lm-eval's HFLM): "
        "revision=..,trust_remote_code=True,parallelize=True,peft=..",
    )
    parser.add_argument(
        "--compute-dtype",
        default="float32",
        choices=["float32", "float64"],
        help="precision of the attention blocks (accumulators are always float64)",
    )
    parser.set_defaults(run=rank_main)
    return parser


def method_options(args: argparse.Namespace) -> dict[str, Any]:
    """The options ``args.method_flags`` sets, by the flags the ranker of ``--method`` declares;
    a flag of another method, or of none, is an error."""
    ranker = RANKERS.lookup(args.method, field="--method")
    parser = argparse.ArgumentParser(prog=f"bosch-eval rank --method {args.method}", add_help=False)
    for flag in ranker.flags:
        flag.add_to(parser)
    given, unknown = parser.parse_known_args(getattr(args, "method_flags", []))
    if unknown:
        raise SettingsError(_not_a_flag_of(args.method, unknown[0]))
    return {
        option: tuple(value) if isinstance(value, list) else value
        for option, value in vars(given).items()
        if value is not None
    }


def _not_a_flag_of(method: str, text: str) -> str:
    flag = text.partition("=")[0]
    owners = [name for name, ranker in RANKERS.items() if any(declared.flag == flag for declared in ranker.flags)]
    if owners:
        return f"{flag} applies to --method {' or '.join(owners)}, not {method}"
    return f"unrecognized argument {text!r}: not a flag of bosch-eval rank, nor of --method {method}"


def rank_main(args: argparse.Namespace) -> None:
    """Run ``bosch-eval rank``; raises a :class:`~bosch_eval.runtime.errors.BoschError` on any bad input."""
    import torch

    # The command's work (the rankers, the calibration texts: torch, transformers), imported when
    # it runs: parsing and --help stay free of them (tests/test_cli_help.py).
    from bosch_eval.models.resolved_model import ResolvedModel
    from bosch_eval.search.rankers.driver import RankingCompute, RankingInputs, compute_ranking, load_for_ranking

    options = method_options(args)  # the method checked before anything loads
    include_paths = (args.include_path,) if args.include_path else ()
    args.calib_task = args.calib_task or default_calib_task(args.model)
    known = calibration_sets(include_paths)
    if args.calib_task not in known:
        raise SettingsError(
            f"--calib-task: {args.calib_task!r} is not a calibration set; expected one of {sorted(known)}"
        )
    model_args = parse_model_args(getattr(args, "model_args", None), adapter=False)
    resolved = ResolvedModel.named(args.model)
    path, defaults = resolved.path, resolved.defaults
    window = resolve_window(args.window, default=defaults.window, source=args.model, flag="--window W")
    calib_len = args.calib_len if args.calib_len is not None else defaults.calib_len
    if calib_len is None:
        raise SettingsError(
            f"{args.model}: no --calib-len given and no bosch_defaults.json with 'calib_len'; pass --calib-len T"
        )
    if not args.ignore_max_positions:  # before the weights load: past it, every score would be ~0
        check_length(calib_len, args.model, resolved.config, "--calib-len", "--ignore-max-positions")
    device = pick_device(args.device, "--device")
    model, tokenizer = load_for_ranking(path, args.dtype, device, model_args)
    try:
        ranking = compute_ranking(
            args.method,
            model,
            tokenizer,
            RankingInputs(
                window=window,
                examples=args.calib_examples,
                length=calib_len,
                seed=args.seed,
                task=args.calib_task,
                include_paths=include_paths,
            ),
            compute=RankingCompute(block_size=args.block_size, device=device, dtype=getattr(torch, args.compute_dtype)),
            options=options,
            model_name=args.model,
        )
    except TemplateTooLong as err:
        raise SettingsError(f"--calib-len {calib_len}: {err}") from None
    argv = getattr(args, "argv", None)
    if argv is not None:
        ranking = replace(ranking, provenance={**ranking.provenance, "command": " ".join(["bosch-eval", *argv])})
    if model_args:
        ranking = replace(
            ranking, provenance={**ranking.provenance, "model_args": {k: str(v) for k, v in model_args.items()}}
        )
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    ranking.save(args.out)
    shape = ranking.shape
    print(
        f"{args.out}: {args.method} ranking (bosch-ranking/1) of {args.model}, L={shape.num_layers} × "
        f"G={shape.num_kv_heads} KV groups (H={shape.num_heads}); W={window}, {args.calib_examples} × {calib_len} "
        f"tokens, seed {args.seed}, {ranking.provenance['wall_time_s']:.1f} s"
    )
    print(f"  more local = {ranking.more_local} score; use it with ranking={args.out},ratio=R")
