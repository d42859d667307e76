"""The GPU check of issue 38: correctness, speed ratios, lm-eval and the search on one device.

    benchmarks/gpu_check.sh --out "$OUT"              # a bare CUDA machine: installs .whl/, then this
    python benchmarks/gpu_check.py --device cpu --quick --out /tmp/gpu_check   # every stage, tiny, on a CPU

Stages, in order, each in processes of its own under a time limit (its share of ``--budget``,
plus what the stages before it did not use), so that a slow or hanging stage cannot eat the
rest; each writes its files as it goes:

1. ``correctness``: every runnable attention backend against the dense band reference, 5
   model families × sinks 0/3 × fp32/bf16, max |Δ logit| (``benchmarks/backend_reference.py``).
2. ``bench``: ``bosch-eval bench`` per backend (flex first, then the other runnable ones) on
   a random-weight Qwen3-1.7B-shaped model in bf16 at T = 8192 and 32768, W = T/32, ρ = 0.75
   and 0.5: prefill, decode at batch 1 and 8 and prefill peak memory against the original
   model measured in the same run (issue 38's targets checked at 32k); after flex's eager rows,
   flex with its decode steps compiled over static caches (``bench --compile``: CUDA graphs,
   the original on transformers' ``StaticCache``, ρ = 0.75 at 32k). Flex and its compiled run
   get fixed shares of the stage's time; each other backend the time left over those left.
3. ``lm_eval``: one ``lm_eval --model bosch`` run (the toy model with a mixed per-group mask:
   ``bosch_niah_calib`` prefill and ``bosch_niah_single_1`` generation on the hybrid cache)
   on the device, again with ``kv_cache=captured`` (generation compiled, CUDA graphs), then
   the same run on the CPU; every score of both device runs compared with the CPU's.
4. ``objective``: one S() call (the search's objective, ``benchmarks/objective_speed.py``) with
   hybrid masks at ρ = 0.75 and 0.5 against the original model's forward on the same
   calibration requests, on the bench's model shape in bf16 (16 examples × 8192 tokens).
5. ``search``: the time of a small ``bosch-eval search --model toy-l`` on the device.

Writes ``<out>/<device name>/``: ``environment.json`` (device, versions, the command),
``stages.json``, ``summary.md`` (rewritten after every stage), and one folder per stage with
the commands' own outputs and logs. ``--quick`` runs the same stages at tiny sizes (a
2-layer model at T = 128/256, 2 families, a few examples), for a CPU.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bosch_eval.masks.head_mask import HeadMask
from bosch_eval.runtime.device import pick_device
from bosch_eval.runtime.errors import SettingsError, exit_status
from bosch_eval.runtime.versions import versions
from bosch_eval.tasks import TASKS_DIR

ROOT = Path(__file__).resolve().parent.parent

# Issue 38's targets at T = 32768: (configuration, ratio key of bench.speedups, least value or, for
# memory, the most).
TARGET_LENGTH = 32768
TARGETS = [
    ("ρ=0.75", "prefill", ">=", 1.25), ("ρ=0.5", "prefill", ">=", 1.1),
    ("ρ=0.75", "decode_batch_1", ">=", 1.0), ("ρ=0.75", "decode_batch_8", ">=", 1.3),
    ("ρ=0.75", "prefill_peak", "<=", 1.0), ("ρ=0.5", "prefill_peak", "<=", 1.0),
]  # fmt: skip

# BOSCH's mask for the toy model at ρ = 0.5 (results/toy_search/bosch-r0.5/mask.json): layers of
# every kind (mixed, full, mixed, all SWA), and scores far from 0, so equal scores say something.
TOY_MASK_ROWS = [[1, 0, 1, 1], [1, 1, 1, 1], [0, 0, 0, 1], [0, 0, 0, 0]]


@dataclass(frozen=True)
class Plan:
    """The sizes of one run: the full check on a GPU, or ``--quick`` on a CPU."""

    families: tuple[str, ...]
    bench_model: str
    bench_lengths: tuple[int, ...]
    decode_tokens: int
    lm_eval_length: int
    lm_eval_examples: int
    search_budget_per_layer: int
    search_examples: int
    search_length: int | None  # None: toy-l's own calibration length (1024)
    objective_length: int  # tokens per calibration example of the S() timing
    objective_examples: int
    budget_s: float
    shares: dict[str, int]  # of the budget per stage; a stage also gets what the stages before it left unused


# On a GPU the 32k bench rows take most of the time; lm_eval runs three times (device, device captured, CPU).
FULL = Plan(
    ("gpt2", "llama", "mistral", "qwen2", "qwen3"), "random:qwen3-1.7b", (8192, 32768), 8, 1024, 16, 15, 32, None, 8192, 16, 540,
    {"correctness": 60, "bench": 300, "lm_eval": 75, "objective": 60, "search": 45},
)  # fmt: skip
# On a CPU the correctness stage takes most: with a cold Inductor cache each of its 8 flex cases
# compiles its kernels, 25-60 s each (266 s in all on 2 Xeon cores with AMX, 2026-11-29).
QUICK = Plan(
    ("gpt2", "qwen3"), "random:attn-heavy", (128, 256), 2, 256, 4, 2, 4, 256, 256, 4, 900,
    {"correctness": 300, "bench": 120, "lm_eval": 75, "objective": 30, "search": 45},
)  # fmt: skip
RATIOS = ("0.75", "0.5")
DECODE_BATCH = 8
# bench runs this backend first, its longest length first, with this share of the stage's time:
# its 32k prefill and decode rows must finish; the other backends share what is left.
FIRST_BACKEND, FIRST_SHARE = "flex", 0.6
# Then its compiled-decode run (bench --compile: four Inductor compiles of the model, then CUDA graphs)
# takes this share of what is left; the other backends, slower on a GPU or measured elsewhere, the rest.
COMPILED_SHARE = 0.7
SCORE_TOLERANCE = 1e-4  # |score on the device − score on the CPU| counted as equal
ENV = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}


def slug(name: str) -> str:
    """A folder name for a device name: ``NVIDIA H100 80GB HBM3`` → ``nvidia-h100-80gb-hbm3``."""
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")


def run_limited(command: list[str], seconds: float, log: Path) -> dict[str, Any]:
    """Run ``command`` from the project root, output into ``log``; after ``seconds`` its whole
    process group is killed (compile workers included)."""
    log.parent.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    with log.open("w") as out:
        process = subprocess.Popen(
            command, stdout=out, stderr=subprocess.STDOUT, cwd=ROOT, start_new_session=True, env={**os.environ, **ENV}
        )
        try:
            code = process.wait(timeout=max(1.0, seconds))
            status = "ok" if code == 0 else f"failed (exit {code})"
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
            status = f"timed out after {seconds:.0f} s"
    return {
        "command": shlex.join(command),
        "status": status,
        "seconds": round(time.monotonic() - started, 1),
        "log": log.name,
    }


def _cli(*args: str) -> list[str]:
    return [sys.executable, "-m", "bosch_eval.cli", *args]


def _tail(log: Path, lines: int = 5) -> str:
    return "\n".join(log.read_text(errors="replace").splitlines()[-lines:]) if log.exists() else ""


# -- stages: each takes (folder, seconds, plan, device) and returns what summary.md shows ---------------


def stage_correctness(folder: Path, seconds: float, plan: Plan, device: str) -> dict[str, Any]:
    out = folder / "correctness"
    command = [
        sys.executable,
        str(ROOT / "benchmarks/backend_reference.py"),
        "--device",
        device,
        "--families",
        *plan.families,
        "--out",
        str(out),
    ]
    result = run_limited(command, seconds, out / "run.log")
    report = out / "reference.json"
    if report.exists():
        data = json.loads(report.read_text())
        result.update(summary=data["summary"], auto=data["auto"], skipped=data["skipped"])
        if result["status"] == "failed (exit 1)":  # the script ran to the end; some case is outside tolerance
            result["status"] = "done: some cases outside tolerance"
    else:
        cases = (
            [json.loads(line) for line in (out / "cases.jsonl").read_text().splitlines()]
            if (out / "cases.jsonl").exists()
            else []
        )
        result["summary"] = f"{len(cases)} cases finished (see cases.jsonl); {_tail(out / 'run.log', 1)}"
    return result


def stage_bench(folder: Path, seconds: float, plan: Plan, device: str) -> dict[str, Any]:
    import torch
    from backend_reference import runnable_backends  # benchmarks/ is sys.path[0]

    # torch (the modules of ours below load it): not for this script's --help
    from bosch_eval.bench.report import speedups
    from bosch_eval.bench.runner import BenchRow

    backends, skipped = runnable_backends(torch.device(device))
    auto = backends[0]
    deadline = time.monotonic() + seconds
    runs = {}
    order = bench_runs(backends, plan)
    for left, (name, backend, lengths, ratios, flags) in zip(range(len(order), 0, -1), order, strict=True):
        out = folder / "bench" / name.replace(" ", "")
        command = _cli(
            "bench", "--model", plan.bench_model, "--dtype", "bfloat16", "--device", device, "--backend", backend,
            "--ratios", *ratios, "--lengths", *map(str, lengths), "--decode-tokens", str(plan.decode_tokens),
            "--decode-batch", str(DECODE_BATCH), "--repeats", "3", "--warmup", "1", "--no-profile", *flags, "--out", str(out),
        )  # fmt: skip
        left_s = deadline - time.monotonic()
        shares = {FIRST_BACKEND: FIRST_SHARE, f"{FIRST_BACKEND} --compile": COMPILED_SHARE}
        share = left_s * shares[name] if name in shares and left > 1 else left_s / left
        run = run_limited(command, share, out / "bench.log")
        rows = (
            [BenchRow(**row) for row in json.loads((out / "bench.json").read_text())["rows"]]
            if (out / "bench.json").exists()
            else []
        )
        run["speedups"] = speedups(rows)
        if run["status"] != "ok":
            run["error"] = _tail(out / "bench.log", 3)
        runs[name] = run
        print(f"  bench {name}: {run['status']} ({run['seconds']} s)", flush=True)
        for ratio in run["speedups"]:  # printed as they come: a call cut short still shows them
            print(f"    T={ratio['length']} {ratio['label']}: prefill {ratio['prefill']:.2f}x, decode x1 {ratio['decode_batch_1']:.2f}x, "
                  f"x{DECODE_BATCH} {ratio[f'decode_batch_{DECODE_BATCH}']:.2f}x, prefill peak {_number(ratio['prefill_peak'])}", flush=True)  # fmt: skip
    return {
        "status": "ok" if all(r["status"] == "ok" for r in runs.values()) else "partial",
        "auto": auto,
        "skipped": skipped,
        "backends": runs,
    }


def bench_order(backends: list[str]) -> list[str]:
    """Compiled flex first (the fast path without flash-attn, whose long rows no other machine
    measures), then the others in the order given."""
    return sorted(backends, key=lambda name: name != FIRST_BACKEND)


def bench_runs(
    backends: list[str], plan: Plan
) -> list[tuple[str, str, tuple[int, ...], tuple[str, ...], tuple[str, ...]]]:
    """``(name, backend, lengths, ratios, extra flags)`` of each bench run, in order: the first
    backend eagerly, its longest length first; then, where it runs, the same backend with its
    decode steps compiled over static caches (``--compile``: CUDA graphs; ρ = 0.75 at the
    longest length, the decode targets' row); then the other backends."""
    runs = []
    for backend in bench_order(backends):
        first = backend == FIRST_BACKEND
        lengths = tuple(sorted(plan.bench_lengths, reverse=True)) if first else tuple(plan.bench_lengths)
        runs.append((backend, backend, lengths, RATIOS, ()))
        if first:
            runs.append((f"{backend} --compile", backend, (max(plan.bench_lengths),), ("0.75",), ("--compile",)))
    return runs


def stage_lm_eval(folder: Path, seconds: float, plan: Plan, device: str) -> dict[str, Any]:
    out = folder / "lm_eval"
    out.mkdir(parents=True, exist_ok=True)
    mask = out / "toy_mask.json"
    HeadMask.from_rows(TOY_MASK_ROWS, num_heads=8, window=32, method="bosch").save(mask)
    executable = shutil.which("lm_eval", path=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}")
    if executable is None:
        return {"status": "failed: no lm_eval command next to this Python or on PATH"}
    n, length = plan.lm_eval_examples, plan.lm_eval_length
    deadline = time.monotonic() + seconds
    runs, scores = {}, {}
    # The device twice: the eager hybrid cache, then the captured one (generate compiles its decode
    # steps there, CUDA graphs on a GPU); both against the CPU's eager run.
    variants = (("device", device, ""), ("captured", device, ",kv_cache=captured"), ("cpu", "cpu", ""))
    for left, (name, where, extra) in zip(range(len(variants), 0, -1), variants, strict=True):
        command = [
            executable, "--model", "bosch", "--model_args", f"pretrained=toy,mask={mask}{extra}", "--tasks", "bosch_niah_calib,bosch_niah_single_1",
            "--include_path", str(TASKS_DIR), "--metadata", f"seq_len={length}", f"num_examples={n}", "calib_seed=0",
            f"max_seq_lengths=[{length}]", f"num_samples={n}", "--device", where, "--batch_size", "8", "--output_path", str(out / name),
        ]  # fmt: skip
        runs[name] = run_limited(command, (deadline - time.monotonic()) / left, out / f"{name}.log")
        files = sorted((out / name).rglob("results_*.json"))
        scores[name] = _scores(json.loads(files[-1].read_text())) if files else {}
    compared = sorted(set().union(*scores.values()))
    differences = {
        f"{name}:{key}": abs(scores[name][key] - scores["cpu"][key])
        for name in ("device", "captured") for key in compared if key in scores[name] and key in scores["cpu"]
    }  # fmt: skip
    # acc and the per-length scores are counts: equal or not. acc_tiebreak adds a probability, whose
    # last digits may differ between kernels; SCORE_TOLERANCE is far below one example's weight.
    equal = (
        bool(compared)
        and len(differences) == 2 * len(compared)
        and all(d <= SCORE_TOLERANCE for d in differences.values())
    )
    status = "ok" if all(r["status"] == "ok" for r in runs.values()) else "failed"
    return {
        "status": status, "runs": runs, "scores": scores, "equal": equal,
        "max_abs_difference": max(differences.values(), default=None), "exactly_equal": sum(d == 0 for d in differences.values()),
    }  # fmt: skip


def _scores(results: dict[str, Any]) -> dict[str, float]:
    """``task/metric`` → value from an lm-eval results file (no stderr, no aliases)."""
    return {
        f"{task}/{metric.split(',')[0]}": value
        for task, metrics in results["results"].items()
        for metric, value in metrics.items()
        if isinstance(value, (int, float)) and "stderr" not in metric
    }


def stage_search(folder: Path, seconds: float, plan: Plan, device: str) -> dict[str, Any]:
    out = folder / "search"
    flags = ["--budget-per-layer", str(plan.search_budget_per_layer), "--calib-examples", str(plan.search_examples)]
    if plan.search_length is not None:
        flags += ["--calib-len", str(plan.search_length)]
    command = _cli("search", "--model", "toy-l", "--ratio", "0.75", *flags, "--device", device, "--out", str(out))
    result = run_limited(command, seconds, folder / "search.log")
    if (out / "mask.json").exists():
        provenance = json.loads((out / "mask.json").read_text())["provenance"]
        calls = provenance["evaluations"]
        result.update(search_wall_s=provenance["wall_s"], evaluations=calls, score=provenance["score"],
                      seconds_per_call=provenance["wall_s"] / max(1, calls))  # fmt: skip
    elif (out / "journal.jsonl").exists():  # cut short: how far it got
        result["scored_masks"] = sum('"score"' in line for line in (out / "journal.jsonl").read_text().splitlines())
    return result


def stage_objective(folder: Path, seconds: float, plan: Plan, device: str) -> dict[str, Any]:
    """S() of hybrids against S() of the original (every group full, the unpatched kernel) on the
    same calibration requests, on the bench's model shape in bf16 (benchmarks/objective_speed.py)."""
    out = folder / "objective"
    configs = ["dtype=bfloat16,mask=full", *(f"dtype=bfloat16,layers=bme,ratio={ratio}" for ratio in RATIOS)]
    command = [
        sys.executable, str(ROOT / "benchmarks/objective_speed.py"), "--model", plan.bench_model, "--task", "bosch_niah_calib",
        "--seq-len", str(plan.objective_length), "--examples", str(plan.objective_examples), "--batch-size", "4", "--device", device,
        "--repeats", "3", "--work", str(out / "model"), "--configs", *configs, "--out", str(out / "objective.md"),
    ]  # fmt: skip
    result = run_limited(command, seconds, out / "run.log")
    report = out / "objective.json"
    if report.exists():
        result["rows"] = [
            {key: row[key] for key in ("config", "median_s", "vs_first")}
            for row in json.loads(report.read_text())["rows"]
        ]
    shutil.rmtree(out / "model", ignore_errors=True)  # gigabytes of random weights
    return result


STAGES = {
    "correctness": stage_correctness,
    "bench": stage_bench,
    "lm_eval": stage_lm_eval,
    "objective": stage_objective,
    "search": stage_search,
}


# -- the summary ------------------------------------------------------------------------------------------


def targets(speedups: list[dict[str, Any]]) -> list[str]:
    """Issue 38's targets at T = 32768, each met or not (nothing when that length did not run)."""
    lines = []
    for label, key, relation, bound in TARGETS:
        found = [s for s in speedups if s["label"] == label and s["length"] == TARGET_LENGTH]
        if found:
            value = found[0][key]
            if value is None:
                lines.append(f"{label} {key}: not measured")
                continue
            met = value >= bound if relation == ">=" else value <= bound
            lines.append(f"{label} {key} {value:.2f}× (target {relation} {bound}): {'met' if met else 'NOT met'}")
    return lines


def summary(environment: dict[str, Any], results: dict[str, dict[str, Any]]) -> str:
    lines = [
        f"# GPU check: {environment['device']}",
        "",
        f"$ {environment['command']}",
        "",
        "```",
        json.dumps(environment, indent=1),
        "```",
        "",
    ]
    lines += ["| stage | status | seconds | limit s |", "|---|---|---|---|"]
    lines += [f"| {name} | {r['status']} | {r.get('seconds', '-')} | {r['limit_s']} |" for name, r in results.items()]
    if "correctness" in results:
        r = results["correctness"]
        lines += ["", "## Backends against the dense band reference", "", f"`auto` → {r.get('auto', '?')}; not runnable: {r.get('skipped') or 'none'}",
                  "", r.get("summary", ""), "", "Every case: `correctness/reference.md`."]  # fmt: skip
    if "bench" in results and "backends" in results["bench"]:
        lines += [
            "",
            "## Bench: hybrid / original tokens/s in the same run (above 1: faster; memory: below 1 is less)",
            "",
        ]
        lines += [
            "| backend | T | config | prefill | decode ×1 | decode ×8 | prefill peak | KV bytes | status |",
            "|---|---|---|---|---|---|---|---|---|",
        ]
        for backend, run in results["bench"]["backends"].items():
            name = f"{backend} (= auto)" if backend == results["bench"]["auto"] else backend
            for s in run["speedups"]:
                lines.append(
                    f"| {name} | {s['length']} | {s['label']} | {s['prefill']:.2f} | {s['decode_batch_1']:.2f} | "
                    f"{s['decode_batch_8']:.2f} | {_number(s['prefill_peak'])} | {s['kv_bytes']:.3f} | {run['status']} |"
                )
            if not run["speedups"]:
                error = (run.get("error") or "").splitlines()
                lines.append(
                    f"| {name} | - | - | - | - | - | - | - | {run['status']}{': ' + error[-1] if error else ''} |"
                )
        for backend, run in results["bench"]["backends"].items():
            met = targets(run["speedups"])
            lines += [
                "",
                f"Targets at T = {TARGET_LENGTH}, {backend}: " + ("; ".join(met) if met else "T = 32768 not measured"),
            ]
    if "lm_eval" in results and "scores" in results["lm_eval"]:
        r = results["lm_eval"]
        verdict = "equal" if r["equal"] else "NOT equal"
        lines += ["", f"## lm_eval --model bosch on the device against the CPU: {verdict} (max |Δ| {r['max_abs_difference']}, "
                  f"{r['exactly_equal']} scores bit-equal; tolerance {SCORE_TOLERANCE})", ""]  # fmt: skip
        lines += ["| score | device | device, captured cache | cpu |", "|---|---|---|---|"]
        columns = [r["scores"].get(name, {}) for name in ("device", "captured", "cpu")]
        for key in sorted(set().union(*columns)):
            lines.append(f"| {key} | " + " | ".join(str(column.get(key, "-")) for column in columns) + " |")
    if "objective" in results and "rows" in results["objective"]:
        lines += ["", "## S() of a hybrid against the original's forward on the same requests (below 1: cheaper)", ""]
        lines += ["| configuration | median s | vs original |", "|---|---|---|"]
        lines += [
            f"| `{row['config']}` | {row['median_s']:.2f} | {row['vs_first']:.2f} |"
            for row in results["objective"]["rows"]
        ]
    if "search" in results and "command" in results["search"]:
        r = results["search"]
        if "evaluations" in r:
            text = (f"{r['search_wall_s']:.1f} s of search ({r['seconds']} s with start-up), {r['evaluations']} masks evaluated, "
                    f"{r['seconds_per_call']:.2f} s per evaluation, S = {r['score']:.4f}")  # fmt: skip
        else:
            text = f"{r['status']}; {r.get('scored_masks', 0)} masks scored in the journal before it stopped"
        lines += ["", "## toy-l search", "", f"{text}; `{r['command']}`"]
    return "\n".join(lines) + "\n"


def pack(folder: Path, into: Path) -> None:
    """``into/gpu_check.tar.gz`` (``<device name>/...`` inside) and ``into/summary.md``, each
    replaced whole, so a run killed while packing still leaves the previous stage's pack."""
    import tarfile

    into.mkdir(parents=True, exist_ok=True)
    partial = into / "gpu_check.tar.gz.partial"
    with tarfile.open(partial, "w:gz") as archive:
        archive.add(folder, arcname=folder.name)
    os.replace(partial, into / "gpu_check.tar.gz")
    shutil.copyfile(folder / "summary.md", into / "summary.md.partial")
    os.replace(into / "summary.md.partial", into / "summary.md")


def _number(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def environment_of(device: str, argv: list[str], plan: Plan) -> dict[str, Any]:
    import torch

    # torch (the modules of ours below load it): not for this script's --help
    from bosch_eval.bench.report import environment

    commit = subprocess.run(
        ["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=False
    ).stdout.strip()
    return {
        **environment(torch.device(device)), **versions("lm_eval", "accelerate", "bosch-eval"),
        "command": shlex.join(["python", "benchmarks/gpu_check.py", *argv]), "installed": os.environ.get("GPU_CHECK_INSTALLED", ""),
        "commit": commit or "unknown", "platform": platform.platform(), "plan": plan.__dict__,
    }  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda", help="cuda, cuda:N or cpu (default cuda)")
    parser.add_argument("--quick", action="store_true", help="every stage at tiny sizes (for a CPU)")
    parser.add_argument(
        "--out", type=Path, default=ROOT / "results/gpu", help="results go to OUT/<device name>/ (default results/gpu)"
    )
    parser.add_argument("--budget", type=float, help="seconds for all stages together (default 540; --quick 900)")
    parser.add_argument(
        "--stages", nargs="+", choices=list(STAGES), default=list(STAGES), help="stages to run (default: all)"
    )
    parser.add_argument(
        "--pack", type=Path,
        help="after every stage, also write PACK/gpu_check.tar.gz (the whole result folder) and PACK/summary.md: two files, "
        "for a device machine that returns only a few files from a shallow folder ($OUT)",
    )  # fmt: skip
    args = parser.parse_args(argv)
    plan = QUICK if args.quick else FULL

    def run() -> None:
        device = pick_device(args.device, "--device")  # no CUDA: an error naming --device, before anything runs
        environment = environment_of(device, argv, plan)
        folder = args.out / slug(environment["device"])
        if folder.exists() and any(folder.iterdir()):
            raise SettingsError(
                f"--out: {folder} already holds a check; pass another --out (results are never overwritten)"
            )
        folder.mkdir(parents=True)
        (folder / "environment.json").write_text(json.dumps(environment, indent=1) + "\n")
        budget = args.budget or plan.budget_s
        deadline = time.monotonic() + budget
        results: dict[str, dict[str, Any]] = {}
        for index, name in enumerate(args.stages):
            shares = [plan.shares[s] for s in args.stages[index:]]
            limit = (deadline - time.monotonic()) * shares[0] / sum(shares)
            print(f"[{name}] up to {limit:.0f} s", flush=True)
            result: dict[str, Any] = {"limit_s": round(limit)}
            started = time.monotonic()
            if limit < 5:
                result["status"] = "skipped: no time left in --budget"
            else:
                result.update(STAGES[name](folder, limit, plan, device))
                result["seconds"] = round(time.monotonic() - started, 1)
            results[name] = result
            print(f"[{name}] {result['status']} ({result.get('seconds', '-')} s)", flush=True)
            (folder / "stages.json").write_text(json.dumps(results, indent=1) + "\n")
            (folder / "summary.md").write_text(summary(environment, results))
            if args.pack:
                pack(folder, args.pack)
        print((folder / "summary.md").read_text())
        print(f"written: {folder}")

    return exit_status("gpu_check", run)


if __name__ == "__main__":
    sys.exit(main())
