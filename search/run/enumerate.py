"""The exact optimum of the calibration objective, by scoring every mask at a ratio.

BOSCH is a heuristic. On a model small enough to enumerate (the bundled toy model has
L·G = 16 KV groups: C(16, 12) = 1820 masks at ρ = 0.75, C(16, 14) = 120 at ρ = 0.875),
scoring *every* mask with exactly ⌈ρ·L·G⌉ SWA groups gives the true optimum of S(z) and
the place of any other mask among all of them: the optimality gap of BOSCH, of its
ablations and of the static rankings.

::

    python -m bosch_eval.search.run.enumerate --model toy --ratio 0.875 --out runs/enum-r0.875 \\
        --place bosch=runs/toy-r0.875/mask.json --place apl=apl-r0.875.json

Every score is journaled (``bosch-journal/1``, the search's own format and S(z)) before the
next mask is evaluated, so ``--resume`` continues a killed run and no mask is scored twice.
``optimum.md`` / ``optimum.json`` are written when every mask has a score.
"""

from __future__ import annotations

import argparse
import itertools
import json
import logging
import math
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from tqdm import tqdm

from bosch_eval.masks.head_mask import HeadMask, ModelShape, ceil_count, check_ratio
from bosch_eval.models.model_defaults import resolve_window
from bosch_eval.models.resolved_model import ResolvedModel
from bosch_eval.runtime.errors import JournalError, SearchError, exit_status
from bosch_eval.runtime.outdir_lock import OutputLock
from bosch_eval.search.journal.store import Journal, mask_key
from bosch_eval.search.objective.loading import CalibrationSettings, LoadSettings, build_objective

# A user who points this at a real model gets an error, not a run of years.
DEFAULT_MAX_MASKS = 5000

log = logging.getLogger("bosch_eval.search")

# Rows of the score-distribution table: (label, share of masks scoring at least that much).
QUANTILES = (
    ("best", 0.0),
    ("top 1%", 0.01),
    ("top 5%", 0.05),
    ("top 10%", 0.10),
    ("top 25%", 0.25),
    ("median", 0.5),
    ("worst", 1.0),
)


def masks_with_swa_count(shape: ModelShape, swa_groups: int) -> Iterator[tuple[tuple[int, ...], ...]]:
    """Every L×G 0/1 grid with exactly ``swa_groups`` zeros, in lexicographic order of the SWA cells."""
    cells = [(layer, group) for layer in range(shape.num_layers) for group in range(shape.num_kv_heads)]
    for swa in itertools.combinations(cells, swa_groups):
        chosen = set(swa)
        yield tuple(
            tuple(0 if (layer, group) in chosen else 1 for group in range(shape.num_kv_heads))
            for layer in range(shape.num_layers)
        )


@dataclass(frozen=True)
class Placement:
    """Where one mask's score stands among all masks with the same number of SWA groups."""

    name: str
    key: str
    score: float
    rank: int  # 1 + number of masks scoring strictly higher
    ties: int  # other masks with exactly this score
    below_share: float  # share of all masks scoring strictly lower
    gap: float  # optimum − score


def place(name: str, key: str, scores: Mapping[str, float]) -> Placement:
    """The place of mask ``key`` among ``scores`` (every mask of its SWA count).

    Raises:
        SearchError: if ``key`` was not enumerated (another SWA count or another shape).
    """
    if key not in scores:
        raise SearchError(
            f"{name}: mask {key} is not among the {len(scores)} enumerated masks (another SWA count or shape?)"
        )
    score = scores[key]
    values = list(scores.values())
    higher = sum(value > score for value in values)
    lower = sum(value < score for value in values)
    return Placement(
        name=name,
        key=key,
        score=score,
        rank=1 + higher,
        ties=len(values) - higher - lower - 1,
        below_share=lower / len(values),
        gap=max(values) - score,
    )


def enumerate_scores(
    score_fn: Callable[[HeadMask], float],
    shape: ModelShape,
    swa_groups: int,
    journal: Journal,
    progress: bool = True,
) -> dict[str, float]:
    """S(z) of every mask with ``swa_groups`` SWA groups; journaled masks are not evaluated again."""
    total = math.comb(shape.num_layers * shape.num_kv_heads, swa_groups)
    scores: dict[str, float] = {}
    bar = tqdm(total=total, desc=f"masks with {swa_groups} SWA groups", disable=not progress)
    for bits in masks_with_swa_count(shape, swa_groups):
        key = mask_key(bits)
        score = journal.lookup(key)
        if score is None:
            started = time.perf_counter()
            score = float(score_fn(HeadMask(bits, shape.num_heads)))
            journal.append(key, score, stage="enumerate", seconds=round(time.perf_counter() - started, 3))
        scores[key] = score
        bar.update(1)
        bar.set_postfix(best=f"{max(scores.values()):.4f}", refresh=False)  # no redraw per journaled mask
    bar.close()
    return scores


def render_optimum(scores: Mapping[str, float], placements: Sequence[Placement], heading: str) -> str:
    """Markdown: the optimum, the score distribution and where each named mask stands."""
    values = sorted(scores.values(), reverse=True)
    best = values[0]
    optima = sorted(key for key, value in scores.items() if value == best)
    lines = [
        heading,
        "",
        f"{len(values)} masks enumerated; optimum S = {best:.4f} ({len(optima)} mask(s) reach it: "
        + ", ".join(f"`{key}`" for key in optima[:5])
        + (", …" if len(optima) > 5 else "")
        + ").",
        "",
        "| quantile of all masks | S |",
        "|---|---|",
    ]
    for label, share in QUANTILES:
        index = int(round(share * (len(values) - 1)))
        lines.append(f"| {label} | {values[index]:.4f} |")
    if placements:
        lines += [
            "",
            "| mask | S | gap to optimum | rank | ties | masks scoring lower |",
            "|---|---|---|---|---|---|",
        ]
        for item in sorted(placements, key=lambda item: (-item.score, item.name)):
            lines.append(
                f"| {item.name} (`{item.key}`) | {item.score:.4f} | {item.gap:.4f} | {item.rank} of {len(values)} "
                f"| {item.ties} | {item.below_share:.1%} |"
            )
    return "\n".join(lines) + "\n"


def _parse_places(items: Sequence[str], shape: ModelShape, swa_groups: int, model: str) -> list[tuple[str, str]]:
    """``NAME=MASK.json`` → (name, key), each checked against the model and the SWA count before any evaluation."""
    named: list[tuple[str, str]] = []
    for item in items:
        name, sep, path = item.partition("=")
        if not sep or not name or not path:
            raise SearchError(f"--place {item!r}: expected NAME=MASK.json")
        mask = HeadMask.load(path)
        mask.check_fits(shape, source=path, model=model)
        if mask.num_swa_groups != swa_groups:
            raise SearchError(
                f"--place {name}: {path} has {mask.num_swa_groups} SWA groups, expected {swa_groups} "
                "(masks are compared with masks of the same SWA count)"
            )
        named.append((name, mask_key(mask.bits)))
    return named


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m bosch_eval.search.run.enumerate", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument(
        "--model",
        required=True,
        help="HF model id or local dir; 'toy' or 'toy-l' is a bundled model, 'smollm2' a packaged one; or a .gguf file",
    )
    parser.add_argument(
        "--ratio", type=float, required=True, help="SWA ratio ρ: every mask with ⌈ρ·L·G⌉ SWA groups is scored"
    )
    parser.add_argument("--out", required=True, help="output directory (journal.jsonl, optimum.md, optimum.json)")
    parser.add_argument("--resume", action="store_true", help="continue the enumeration journaled in --out")
    parser.add_argument("--window", type=int, help="SWA window W (default: the model's bosch_defaults.json)")
    parser.add_argument("--calib-len", type=int, help="bosch_niah_calib length in tokens (default: the model's)")
    parser.add_argument("--calib-examples", type=int, help="bosch_niah_calib examples (default 64)")
    parser.add_argument(
        "--place",
        action="append",
        default=[],
        metavar="NAME=MASK.json",
        help="report where this mask ranks (repeatable)",
    )
    parser.add_argument(
        "--max-masks", type=int, default=DEFAULT_MAX_MASKS, help=f"refuse larger spaces (default {DEFAULT_MAX_MASKS})"
    )
    parser.add_argument("--device", help="cpu or cuda (default: cuda when torch sees a GPU, else cpu)")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    return exit_status("bosch_eval.search.run.enumerate", lambda: run(args))


def run(args: argparse.Namespace) -> None:
    model = ResolvedModel.named(args.model)
    shape = model.shape
    cells = shape.num_layers * shape.num_kv_heads
    swa_groups = ceil_count(check_ratio(args.ratio, "--ratio"), cells)
    total = math.comb(cells, swa_groups)
    # Everything that can be checked is checked before the model is loaded.
    if total > args.max_masks:
        raise SearchError(
            f"--ratio {args.ratio}: C({cells}, {swa_groups}) = {total} masks, more than --max-masks {args.max_masks}"
        )
    places = _parse_places(args.place, shape, swa_groups, args.model)
    window = resolve_window(args.window, default=model.defaults.window, source=args.model, flag="--window W")
    objective = build_objective(
        model,
        CalibrationSettings(length=args.calib_len, examples=args.calib_examples),
        LoadSettings(window=window, device=args.device),
    )
    header = {
        "model": args.model,
        "window": window,
        "calibration": objective.describe(),
        "enumeration": {"ratio": args.ratio, "swa_groups": swa_groups},
    }
    out = Path(args.out)
    with OutputLock(out, "search", JournalError):  # one process writes an output directory at a time
        journal = Journal(out / "journal.jsonl", header, resume=args.resume)
        log.info(
            "%s: %d masks with %d of %d KV groups SWA (%d already evaluated)",
            args.model,
            total,
            swa_groups,
            cells,
            journal.masks_evaluated,
        )
        scores = enumerate_scores(objective, shape, swa_groups, journal)
        _write_summary(out, header, cells, scores, places)


def _write_summary(
    out: Path, header: Mapping[str, Any], cells: int, scores: Mapping[str, float], places: Sequence[tuple[str, str]]
) -> None:
    """``optimum.md`` and ``optimum.json``: the optimum and where each named mask stands."""
    ratio, swa_groups = header["enumeration"]["ratio"], header["enumeration"]["swa_groups"]
    total = len(scores)
    placements = [place(name, key, scores) for name, key in places]
    heading = (
        f"# Every mask of {header['model']} at ρ = {ratio} ({swa_groups} of {cells} KV groups SWA, W = {header['window']})\n\n"
        f"S(z) on the calibration task ({', '.join(header['calibration']['tasks'])}); every score is in-sample for a "
        "mask searched on it."
    )
    (out / "optimum.md").write_text(render_optimum(scores, placements, heading))
    best = max(scores.values())
    summary = {
        "header": header,
        "masks": total,
        "optimum": best,
        "optima": sorted(key for key, value in scores.items() if value == best),
        "placements": [asdict(item) for item in placements],
    }
    (out / "optimum.json").write_text(json.dumps(summary, indent=2) + "\n")
    print(f"{out}/optimum.md: optimum S = {best:.4f} over {total} masks")


if __name__ == "__main__":
    raise SystemExit(main())
