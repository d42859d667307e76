"""``bosch-eval analyze overlap|turnover|replace|windows``.

bosch-eval analyze overlap A.json B.json ... --out DIR     # Jaccard table + heatmap PNG
bosch-eval analyze turnover M_0.5.json M_0.75.json ... --out turnover.md
bosch-eval analyze replace --mask M --ranking R --k 1 2 --out DIR   # masks + compare entries
bosch-eval analyze windows --mask M --windows 16 32 64 --out entries.yaml
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from bosch_eval.analyze.mask_stats import jaccard, turnover
from bosch_eval.analyze.plots import heatmap
from bosch_eval.analyze.replace import replace_heads
from bosch_eval.masks.head_mask import HeadMask, HeadRanking


def add_analyze_parser(subparsers: Any) -> argparse.ArgumentParser:
    parser = subparsers.add_parser("analyze", help="analyses of masks: overlap, turnover, head replacement, windows")
    commands = parser.add_subparsers(dest="analyze_command", required=True)
    overlap = commands.add_parser("overlap", help="Jaccard similarity of SWA sets (paper Fig. 2): table + heatmap")
    overlap.add_argument("masks", nargs="+", help="bosch-mask/1 files (label: NAME=FILE or the file's parent folder)")
    overlap.add_argument("--out", required=True, help="directory for jaccard.md and jaccard.png")
    overlap.set_defaults(run=_overlap)
    turn = commands.add_parser(
        "turnover", help="turnover between masks of one method at increasing ratios (paper §4.3)"
    )
    turn.add_argument("masks", nargs="+", help="bosch-mask/1 files of one method; sorted by SWA ratio")
    turn.add_argument("--out", required=True, help="markdown table to write")
    turn.set_defaults(run=_turnover)
    rep = commands.add_parser("replace", help="swap k SWA heads with a ranking's choice and back (paper Table 5)")
    rep.add_argument("--mask", required=True, help="bosch-mask/1 file")
    rep.add_argument("--ranking", required=True, help="bosch-ranking/1 file")
    rep.add_argument("--k", type=int, nargs="+", required=True, help="numbers of groups to swap")
    rep.add_argument("--out", required=True, help="directory for the masks and entries.yaml (compare entries)")
    rep.set_defaults(run=_replace)
    win = commands.add_parser("windows", help="compare entries of one mask at several windows (paper C.3)")
    win.add_argument("--mask", required=True, help="bosch-mask/1 file")
    win.add_argument("--windows", type=int, nargs="+", required=True, help="SWA windows W")
    win.add_argument("--out", required=True, help="YAML file of entries to paste into a leaderboard")
    win.set_defaults(run=_windows)
    return parser


def _labelled(items: list[str]) -> list[tuple[str, HeadMask]]:
    out = []
    for item in items:
        label, sep, path = item.partition("=")
        if not sep:
            label, path = Path(item).parent.name or Path(item).stem, item
        out.append((label, HeadMask.load(path)))
    return out


def _overlap(args: argparse.Namespace) -> None:
    masks = _labelled(args.masks)
    matrix = [[jaccard(a, b) for _, b in masks] for _, a in masks]
    labels = [label for label, _ in masks]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    lines = [f"$ bosch-eval {' '.join(args.argv)}", "", "Jaccard similarity of SWA sets (1 − distance of the paper's Fig. 2)", "",
             "| | " + " | ".join(labels) + " |", "|---" * (len(labels) + 1) + "|"]  # fmt: skip
    lines += [f"| {labels[i]} | " + " | ".join(f"{v:.3f}" for v in row) + " |" for i, row in enumerate(matrix)]
    (out / "jaccard.md").write_text("\n".join(lines) + "\n")
    heatmap(matrix, labels, out / "jaccard.png")
    print("\n".join(lines))


def _turnover(args: argparse.Namespace) -> None:
    masks = sorted(_labelled(args.masks), key=lambda item: item[1].swa_ratio)
    lines = [f"$ bosch-eval {' '.join(args.argv)}", "", "T = |S_s \\ S_l| / |S_s|; T̃ = T / T_max (paper §4.3, Table 3)", "",
             "| ρ_s → ρ_l | T | T_max | T̃ |", "|---|---|---|---|"]  # fmt: skip
    for (_, small), (_, large) in zip(masks, masks[1:]):
        t, t_max, norm = turnover(small, large)
        lines.append(f"| {small.swa_ratio:.3g} → {large.swa_ratio:.3g} | {t:.1%} | {t_max:.1%} | {norm:.1%} |")
    Path(args.out).write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


def _replace(args: argparse.Namespace) -> None:
    mask, ranking = HeadMask.load(args.mask), HeadRanking.load(args.ranking)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    entries = []
    for k in args.k:
        forward, reverse = replace_heads(mask, ranking, k)
        for name, variant in ((f"mask+{k}{ranking.method}", forward), (f"{ranking.method}+{k}mask", reverse)):
            variant.save(out / f"{name}.json")
            entries.append(f"  - {name}=mask={out / f'{name}.json'}")
    (out / "entries.yaml").write_text("entries:\n" + "\n".join(entries) + "\n")
    print((out / "entries.yaml").read_text())


def _windows(args: argparse.Namespace) -> None:
    HeadMask.load(args.mask)  # fail here, not in the leaderboard run
    lines = ["entries:"] + [f"  - w{w}=mask={args.mask},window={w}" for w in args.windows]
    Path(args.out).write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
