"""A leaderboard YAML narrowed to the entries that can be scored now, or that were.

The searches and the comparison of one ratio run side by side (commands.sh compare): the
static entries are scored while the searches run, and a later call, once a search has
written its mask.json, resumes the same output directory with that entry added. Every
dropped entry is named on stderr, so nothing is left out silently.

``--finished OUT``: only what ``OUT`` holds finished (``runs/`` or ``runs.tar.xz``; the reference always; a seeded entry with the
seeds finished), so that ``compare --resume`` on it runs nothing and writes the leaderboard of
the runs made so far (commands.sh leaderboard). A ``claimant`` left out is dropped too (named on
stderr): its claims wait for its run.

    python benchmarks/studies/available_entries.py results/smollm2/leaderboard_r0.75.yaml OUT.yaml [--finished DIR]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import yaml

from bosch_eval.compare.run_archive import finished_runs


def entry_args(entry: str | dict[str, Any]) -> tuple[str, dict[str, str]]:
    """An entry's name and model_args, from ``NAME=k=v,...`` or ``{name, args, seeds}``."""
    name, args = (entry["name"], entry.get("args") or "") if isinstance(entry, dict) else entry.split("=", 1)
    return name, dict(pair.split("=", 1) for pair in args.split(",") if "=" in pair)


def missing_mask(args: dict[str, str]) -> Path | None:
    """The file an entry's ``mask=`` names, when it does not exist yet."""
    mask = args.get("mask", "full")
    return None if mask == "full" or Path(mask).is_file() else Path(mask)


def finished_seeds(name: str, runs: set[str]) -> list[int]:
    """The seeds of ``name`` whose run (``NAME@seed=S``) is among the finished ``runs``."""
    return sorted(int(run.split("@seed=")[1]) for run in runs if run.startswith(f"{name}@seed="))


def narrow(spec: dict[str, Any], finished: Path | None, where: str) -> list[str | dict[str, Any]]:
    """The entries of ``spec`` whose mask exists (and, with ``finished``, whose runs are done there)."""
    runs = finished_runs(finished) if finished is not None else set()
    kept = []
    for entry in spec["entries"]:
        name, args = entry_args(entry)
        if (mask := missing_mask(args)) is not None:
            print(f"{where}: entry {name!r} left for a later call: {mask} does not exist yet", file=sys.stderr)
            continue
        if finished is not None and name != spec.get("reference", "original"):
            seeded = args.get("layers") == "rand" and "seed" not in args
            seeds = finished_seeds(name, runs) if seeded else []
            if seeded and seeds:
                entry = {
                    "name": name,
                    "args": entry.split("=", 1)[1] if isinstance(entry, str) else entry.get("args"),
                    "seeds": seeds,
                }
            elif name not in runs:
                print(f"{where}: entry {name!r} has no finished run in {finished}; left out", file=sys.stderr)
                continue
            if seeded and seeds != list(spec.get("seeds") or []):
                print(f"{where}: entry {name!r} with its finished seeds {seeds} only", file=sys.stderr)
        kept.append(entry)
    return kept


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("config")
    parser.add_argument("out")
    parser.add_argument(
        "--finished", type=Path, help="keep only the entries with finished runs in this comparison folder"
    )
    args = parser.parse_args(argv)
    spec = yaml.safe_load(Path(args.config).read_text())
    note = f"# {args.config}, narrowed by benchmarks/studies/available_entries.py to the entries {'finished in ' + str(args.finished) if args.finished else 'whose mask exists'}\n"
    kept = narrow(spec, args.finished, args.config)
    narrowed = {**spec, "entries": kept}
    if spec.get("claimant") is not None and spec["claimant"] not in {entry_args(entry)[0] for entry in kept}:
        print(f"{args.config}: claimant {spec['claimant']!r} is left out, so no claims.md yet", file=sys.stderr)
        del narrowed["claimant"]
    Path(args.out).write_text(note + yaml.safe_dump(narrowed, sort_keys=False))


if __name__ == "__main__":
    main()
