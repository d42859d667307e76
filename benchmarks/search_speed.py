"""The search with and without its work-saving options, side by side on the bundled toy model.

    python benchmarks/search_speed.py [--ratios 0.5 0.75] [--out DIR]

For each ratio, four one-process searches at the defaults (κ = 100, seed 0, 64 × 1024-token
calibration examples): everything off (``--no-racing --prefix-cache-mb 0``: the search as it
was before racing and the cache existed), racing only, the prefix cache only, and both (the
defaults). They run in the order off, racing, cache, both, then once more in reverse, and
each setting's time is the mean of its two runs (drift in the machine's speed cancels).
Checked: every run finds the same mask, every mask scored to the end has the same S() as
without the options, and every bound is at least the mask's true S().

Then mask-parallel racing: the default search under ``accelerate launch`` with 2 CPU
processes (one thread each) against one process with 2 threads, S() calls per second.

Prints the search wall times (model loading excluded) as ratios to "off", the calibration
examples forwarded per S() call, and the share of decoder-layer computations skipped.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

from bosch_eval.search.run.api import RunOptions, search_model
from bosch_eval.search.objective.loading import LoadSettings
from bosch_eval.search.run.pipeline import SearchSettings

SETTINGS = {
    "off": {"racing": False, "prefix_cache_mb": 0},
    "racing": {"racing": True, "prefix_cache_mb": 0},
    "cache": {"racing": False, "prefix_cache_mb": 1024},
    "both": {"racing": True, "prefix_cache_mb": 1024},
}


def journal(out: Path) -> tuple[dict[str, float], dict[str, float]]:
    """Scores and bounds of a search's journal."""
    scores, bounds = {}, {}
    for line in (out / "journal.jsonl").read_text().splitlines()[1:]:
        record = json.loads(line)
        if "values" in record:
            continue  # per-example values (what a resume replays), not a mask's outcome
        (scores if "score" in record else bounds)[record["key"]] = record.get("score", record.get("bound"))
    return scores, bounds


def one_process(ratio: float, name: str, out: Path) -> dict:
    racing, prefix_cache_mb = SETTINGS[name]["racing"], SETTINGS[name]["prefix_cache_mb"]
    load, run = LoadSettings(prefix_cache_mb=prefix_cache_mb), RunOptions(racing=racing, progress=False)
    result = search_model("toy", SearchSettings(ratio=ratio), out, load=load, run=run)
    return {"wall_s": result.wall_s, "bits": result.mask.bits, "score": result.score, "work": result.work, "out": out}


def check_same_answers(runs: dict[str, list[dict]]) -> None:
    reference = runs["off"][0]
    truth, _ = journal(reference["out"])
    for name, pair in runs.items():
        for run in pair:
            scores, bounds = journal(run["out"])
            assert run["bits"] == reference["bits"] and run["score"] == reference["score"], f"{name}: another mask"
            assert all(truth[key] == value for key, value in scores.items()), f"{name}: a full S() differs"
            assert all(truth[key] <= bound for key, bound in bounds.items()), f"{name}: a bound below the true S()"
            assert set(scores) | set(bounds) == set(truth), f"{name}: other masks evaluated"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def mask_parallel(ratio: float, root: Path) -> tuple[float, float, bool]:
    """S() calls per second: 2 processes × 1 thread, 1 process × 2 threads; same mask?"""
    rates, masks = [], []
    for processes in (2, 1):
        out = root / f"parallel-{processes}-r{ratio}"
        command = [
            sys.executable,
            "-m",
            "bosch_eval.search",
            "--model",
            "toy",
            "--ratio",
            str(ratio),
            "--device",
            "cpu",
            "--out",
            str(out),
        ]
        if processes > 1:
            command[1:3] = [
                "-m", "accelerate.commands.launch", "--multi_gpu", "--num_processes", str(processes), "--num_machines", "1",
                "--mixed_precision", "no", "--dynamo_backend", "no", "--main_process_port", str(free_port()), "-m", "bosch_eval.search",
            ]  # fmt: skip
        threads = str(2 // processes)
        env = dict(os.environ, CUDA_VISIBLE_DEVICES="", OMP_NUM_THREADS=threads, MKL_NUM_THREADS=threads)
        subprocess.run(command, check=True, env=env, capture_output=True, text=True)
        provenance = json.loads((out / "mask.json").read_text())["provenance"]
        rates.append(provenance["work"]["calls"] / provenance["wall_s"])
        masks.append(json.loads((out / "mask.json").read_text())["mask"])
    return rates[0], rates[1], masks[0] == masks[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ratios", type=float, nargs="+", default=[0.5, 0.75])
    parser.add_argument("--out", help="keep the searches here (default: a temporary directory)")
    args = parser.parse_args()
    root = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="search-speed-"))
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; searches in {root}")
    for ratio in args.ratios:
        runs: dict[str, list[dict]] = {name: [] for name in SETTINGS}
        order = list(SETTINGS) + list(reversed(SETTINGS))
        for number, name in enumerate(order):
            runs[name].append(one_process(ratio, name, root / f"r{ratio}-{name}-{number}"))
        check_same_answers(runs)
        off = sum(run["wall_s"] for run in runs["off"]) / 2
        print(
            f"\nrho {ratio}: every run found the same mask (S = {runs['off'][0]['score']:.4f} on the calibration task, in-sample); full S() values identical"
        )
        print(
            "| setting | search wall time (mean of 2) | vs off | examples per S() call | layer computations skipped |"
        )
        print("|---|---|---|---|---|")
        for name, pair in runs.items():
            wall = sum(run["wall_s"] for run in pair) / 2
            work = pair[0]["work"]
            skipped = f"{work['layers_skipped_share']:.1%}" if "layers_skipped_share" in work else "-"
            print(
                f"| {name} | {wall:.1f} s | {wall / off:.2f}x | {work['examples_per_call']:.1f} of {work['examples_per_full_call']} | {skipped} |"
            )
        two, one, same = mask_parallel(ratio, root)
        print(
            f"mask-parallel racing: 2 processes {two:.2f} S() calls/s, 1 process {one:.2f} calls/s "
            f"({two / one:.2f}x); same mask: {same}"
        )


if __name__ == "__main__":
    main()
