"""Run every entry × task through lm-eval, the model loaded once and masks swapped in place.

Layout under ``out``::

    compare.json          the settings of the finished runs (a resume must match them)
    runs/<run>/           one finished run: lm-eval's results_*.json and samples_*.jsonl
                          (one pair per task) and run.json (entry, mask, window, inputs)
    runs.tar.xz           finished runs packed for committing (``--pack``), read as they are;
                          new runs go to runs/ (:mod:`bosch_eval.compare.run_archive`)
    .partial/<run>/       the run in progress; moved to runs/ when its last task is done
    .requests/<run>/      its answers so far: lm-eval's request cache (``use_cache``), written per
                          batch, and pin.json (what decides them); removed when the run finishes
    .bosch-compare.lock   one comparison per ``out`` at a time (:mod:`bosch_eval.runtime.outdir_lock`)

Killing the run loses at most the batch in progress: ``.partial`` is cleared on restart, and the
run's requests answered before the kill come from its request cache if what decides them (the
settings, model_args and pinned inputs) is unchanged, else the cache is cleared too. A row's
answer does not depend on its batch's padding (``tests/test_batch_invariance.py``, fp32), so
the resumed run equals an uninterrupted one; in bf16 a near-tie may fall either way with the
batch's padded length, as it may between two batch sizes.
``resume=True`` skips finished runs whose pinned inputs (:mod:`bosch_eval.compare.inputs`)
are unchanged; one whose settings or inputs changed is refused, or with ``new_settings``
kept in ``previous/`` and evaluated again. The settings are pinned when the first run
finishes, not before: a comparison that fails before that (an unknown task, a CUDA error)
leaves nothing that refuses the corrected command.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bosch_eval.compare.entries import Entry
from bosch_eval.compare.inputs import FILE_SOURCES, changed, run_inputs
from bosch_eval.compare.run_archive import ARCHIVE, RUN_FILE, finished_runs, readable_runs, restore_runs
from bosch_eval.compare.spec import CompareSpec
from bosch_eval.masks.head_mask import HeadMask, ModelShape
from bosch_eval.masks.mask_sources import MaskRequest, resolve_mask
from bosch_eval.model_adapters.bosch import BoschLM
from bosch_eval.model_adapters.loader_args import adapter_settings, typed_model_args
from bosch_eval.model_adapters.settings import AdapterSettings
from bosch_eval.models.model_check import truthy
from bosch_eval.models.model_defaults import resolve_window
from bosch_eval.models.model_identity import model_identity, portable_name
from bosch_eval.models.resolved_model import ResolvedModel
from bosch_eval.runtime.device import AUTO, pick_device
from bosch_eval.runtime.doc_selection import samples_for_limit
from bosch_eval.runtime.errors import BoschError, EntryError, LmEvalError
from bosch_eval.runtime.lm_eval_session import load_task, task_manager
from bosch_eval.runtime.outdir_lock import OutputLock
from bosch_eval.runtime.previous_results import keep_aside

REQUESTS_DIR = ".requests"
PIN_FILE = "pin.json"
SETTINGS_FILE = "compare.json"
LEADERBOARD_FILES = ("leaderboard.md", "leaderboard.csv", "leaderboard.json", "pareto.png")  # made from the runs

log = logging.getLogger("bosch_eval.compare")


@dataclass(frozen=True)
class PlannedRun:
    """One run: its entry, name, model_args, the mask it applies and what it depends on."""

    entry: Entry
    run: str
    args: dict[str, str]
    mask: HeadMask
    inputs: dict[str, Any]


def output_lock(out: str | Path) -> OutputLock:
    """The one-writer lock of a comparison's output directory."""
    return OutputLock(out, "compare", EntryError)


def planned_runs(spec: CompareSpec) -> list[tuple[Entry, str, dict[str, str]]]:
    """``(entry, run name, model_args)`` for every run, in entry order."""
    return [(entry, run, args) for entry in spec.entries for run, args in entry.runs()]


def resolved_model(spec: CompareSpec) -> ResolvedModel:
    """The comparison's model, resolved once for the plan, the tasks and the adapter."""
    trust = truthy(spec.model_args.get("trust_remote_code", False), "model_args trust_remote_code")
    return ResolvedModel.named(spec.model, trust_remote_code=trust)


def plan_runs(spec: CompareSpec, model: ResolvedModel | None = None) -> list[PlannedRun]:
    """Resolve every run's mask against the model's shape, and pin its inputs, before
    anything is loaded or written.

    Raises:
        EntryError: naming the entry and the field (a missing file, a mask for another model,
            a ratio outside [0, 1], ...).
    """
    resolved = model if model is not None else resolved_model(spec)
    path, shape = str(resolved.path), resolved.shape
    identity = model_identity(path, spec.model_args.get("revision"))
    plan = []
    for entry, run, args in planned_runs(spec):
        try:
            # Every value as the adapter will convert it (kv_cache=paged, allow_truncation=maybe), before any load.
            adapter_settings(typed_model_args({**spec.model_args, **args}, "model_args"))
            mask = resolve_entry_mask(args, shape, resolved.defaults.window, spec.model)
            sink = {**spec.model_args, **args}.get("sink")
            if sink is not None:  # the adapter's sink= wins over the mask's own: record what runs (and its KV bytes)
                mask = mask.with_meta(sinks=int(sink))
            plan.append(PlannedRun(entry, run, args, mask, run_inputs(args, mask, identity)))
        except (BoschError, OSError) as err:
            raise EntryError(f"entry {entry.name!r}: {err}") from None
    return plan


def check_out_dir(
    spec: CompareSpec, out: Path, resume: bool, plan: list[PlannedRun], new_settings: bool = False
) -> set[str]:
    """Prepare ``out`` (its lock held); return the finished runs to skip.

    A finished run is never replaced unasked: with other settings, other model_args or other
    inputs (:func:`bosch_eval.compare.inputs.changed`) a resume is refused, naming what
    differs, unless ``new_settings``; then the finished runs that no longer stand, and the
    leaderboard made from them, move to ``out/previous/<time>/`` and are evaluated again. Runs
    packed into ``runs.tar.xz`` count as finished and stay there (new runs go to ``runs/``); the
    archive is restored to ``runs/`` only when some of its runs are evaluated again.

    Raises:
        EntryError: finished runs exist without ``resume``, or they were made with other
            settings, model_args or inputs (without ``new_settings``).
    """
    finished = finished_runs(out)
    if finished and not resume:
        raise EntryError(
            f"{out}: {len(finished)} runs are already finished ({sorted(finished)[:3]}...); pass --resume or another --out"
        )
    settings_file = out / SETTINGS_FILE
    if finished and settings_file.is_file():
        saved = _portable_settings(json.loads(settings_file.read_text())["settings"])
        differ = [
            f"{key}: {saved.get(key)!r} → {value!r}"
            for key, value in spec.settings().items()
            if saved.get(key) != value
        ]
        if differ and not new_settings:
            raise EntryError(
                f"{out}: its finished runs were made with other settings ({'; '.join(differ)}); use another --out, or pass "
                "--new-settings to evaluate them again (the old runs and leaderboard are kept in previous/)"
            )
        if differ:
            keep_aside(out, ["runs", ARCHIVE, SETTINGS_FILE, *LEADERBOARD_FILES], {"settings": saved})
            finished = set()
    with readable_runs(out) as runs:
        records = {run: json.loads((runs / run / RUN_FILE).read_text()) for run in finished}
    skip, stale = set(), {}
    for item in plan:
        if item.run not in finished:
            continue
        record = records[item.run]
        reasons = changed(record.get("inputs"), item.inputs)
        if _args_key(record["model_args"]) != _args_key(item.args):
            reasons.insert(0, f"field 'args' is {item.args} but the run was made with {record['model_args']}")
        if reasons:
            stale[item.run] = f"run {item.run!r} (entry {item.entry.name!r}): {'; '.join(reasons)}"
        else:
            skip.add(item.run)
    if stale and not new_settings:
        raise EntryError(
            f"{out}: finished runs no longer match this comparison: {' | '.join(stale.values())}; pass --new-settings to "
            "evaluate them again (the old runs and leaderboard are kept in previous/), or use another --out"
        )
    if stale:
        log.warning("%s: evaluating again: %s", out, " | ".join(stale.values()))
        if restored := restore_runs(out):  # the stale runs move aside from runs/; --pack archives the rest again
            log.info("%s: %d finished runs restored from %s to runs/", out, restored, ARCHIVE)
        keep_aside(out, [f"runs/{run}" for run in stale] + list(LEADERBOARD_FILES), {"runs": stale})
    shutil.rmtree(out / ".partial", ignore_errors=True)  # the run a kill interrupted
    _clear_stale_request_caches(spec, out, [item for item in plan if item.run not in skip])
    return skip


def _request_pin(spec: CompareSpec, item: PlannedRun) -> dict[str, Any]:
    """What decides a run's answers, beside the requests themselves (lm-eval's cache key)."""
    return json.loads(
        json.dumps({"settings": spec.settings(), "model_args": _args_key(item.args), "inputs": item.inputs})
    )


def _clear_stale_request_caches(spec: CompareSpec, out: Path, todo: list[PlannedRun]) -> None:
    """Keep the request cache of each run still to do whose pin matches; remove every other."""
    caches = out / REQUESTS_DIR
    if not caches.is_dir():
        return
    pins = {item.run: _request_pin(spec, item) for item in todo}
    for folder in caches.iterdir():
        pin_file = folder / PIN_FILE
        saved = json.loads(pin_file.read_text()) if pin_file.is_file() else None
        current = pins.get(folder.name)
        if saved is not None and current is not None:
            same = saved["settings"] == current["settings"] and saved["model_args"] == current["model_args"]
            if same and not changed(saved["inputs"], current["inputs"]):
                log.info("%s: run %s resumes from its %s", out, folder.name, folder)
                continue
        shutil.rmtree(folder)


def _request_cache(spec: CompareSpec, out: Path, item: PlannedRun) -> str:
    """The ``use_cache`` prefix of ``item``'s request cache (lm-eval adds ``_rank0.db``), pinned."""
    folder = out / REQUESTS_DIR / item.run
    folder.mkdir(parents=True, exist_ok=True)
    partial_pin = folder / f"{PIN_FILE}.partial"  # a kill while writing leaves no half pin
    partial_pin.write_text(json.dumps(_request_pin(spec, item), indent=1) + "\n")
    os.replace(partial_pin, folder / PIN_FILE)
    return str(folder / "requests")


def _close_request_cache(lm: Any) -> None:
    """Close the cache ``simple_evaluate(use_cache=...)`` hooked into ``lm`` (its writer thread
    and file), so the next task or run opens its own."""
    from lm_eval.api.model import CacheHook

    if lm.cache_hook.dbdict is not None:
        lm.cache_hook.dbdict.close()
    lm.set_cache_hook(CacheHook(None))


def _args_key(args: dict[str, str]) -> dict[str, str]:
    """A run's model_args as they decide its scores: a mask or ranking file by its content
    (pinned in the run's inputs), not by the path it was named by, so a relative and an
    absolute path, or another clone's, name the same run."""
    return {key: value for key, value in args.items() if key not in FILE_SOURCES or value == "full"}


def _portable_settings(saved: dict[str, Any]) -> dict[str, Any]:
    """Pinned settings as this version writes them: a bundled model's path is its alias."""
    saved = dict(saved)
    if isinstance(saved.get("model"), str):
        saved["model"] = portable_name(saved["model"])
    return saved


def _finish_run(spec: CompareSpec, out: Path, item: PlannedRun, partial: Path) -> None:
    """Pin the settings (first run) and move the run into ``runs/``, replacing a stale one."""
    record = {"entry": item.entry.name, "run": item.run, "model_args": item.args, "mask": item.mask.to_json(),
              "window": item.mask.window, "inputs": item.inputs}  # fmt: skip
    (partial / RUN_FILE).write_text(json.dumps(record, indent=1) + "\n")
    (out / SETTINGS_FILE).write_text(json.dumps({"settings": spec.settings()}, indent=1) + "\n")
    (out / "runs").mkdir(exist_ok=True)
    # A killed process between these two leaves no run, which the next resume evaluates.
    shutil.rmtree(out / "runs" / item.run, ignore_errors=True)
    os.replace(partial, out / "runs" / item.run)
    shutil.rmtree(out / REQUESTS_DIR / item.run)  # left by a kill before this line, the next resume clears it


def _load_model(spec: CompareSpec, model: ResolvedModel, load_args: dict[str, str]) -> Any:
    """The ``bosch`` adapter with every group full; each run then swaps its mask in."""
    window = resolve_window(default=model.defaults.window, all_full=True, source=spec.model)
    full = HeadMask.uniform(model.shape, full=True, window=window, method="original")
    kwargs = typed_model_args({**spec.model_args, **load_args}, "model_args")
    kwargs.setdefault("progress_bars", False)  # lm-eval's bar per request type; compare shows its own per task
    return BoschLM(pretrained=model, mask=full, **kwargs)


def resolve_entry_mask(args: dict[str, str], shape: ModelShape, default_window: int | None, model: str) -> HeadMask:
    """The mask a run's model_args ask for (all full for the original), validated against ``shape``."""
    # Converted as the adapter converts them (ratio='0.5' -> 0.5, window='abc' -> an error naming window).
    given = AdapterSettings(**{k: v for k, v in args.items() if k in AdapterSettings.mask_source_names()})
    source = {k: v for k, v in given.mask_sources().items() if v is not None}
    if source.get("mask") == "full" or not any(k in source for k in ("mask", "ranking", "layers")):
        # mask=full is the adapter's spelling of no head mask (e.g. a KV-quantized original).
        window = resolve_window(given.window, default=default_window, all_full=True, source=model)
        return HeadMask.uniform(shape, full=True, window=window, method="full" if "mask" in source else "original")
    mask, _ = resolve_mask(shape, MaskRequest(**source), default_window=default_window, model_name=model)
    return mask


def _build_tasks(spec: CompareSpec, path: str) -> tuple[Any, dict[str, list[Any]], dict[str, dict[str, Any]]]:
    """The TaskManager, each task name's objects and its leaf Tasks (built once)."""
    # Synthetic tasks (RULER, bosch_niah*) size their documents with the model's tokenizer.
    metadata = {"pretrained": path, "tokenizer": path} | spec.task_metadata()
    try:
        manager = task_manager(spec.tasks, spec.include_path, metadata)
    except LmEvalError as err:
        raise EntryError(str(err)) from None
    objects: dict[str, list[Any]] = {}
    leaves: dict[str, dict[str, Any]] = {}
    for name in spec.tasks:
        loaded = load_task(manager, name, spec.doc_seed)
        groups = loaded.get("groups", {})
        objects[name] = [groups[name]] if name in groups else list(loaded["tasks"].values())
        leaves[name] = dict(loaded["tasks"])
    return manager, objects, leaves


def _by_model_load(spec: CompareSpec, todo: list[PlannedRun]) -> dict[tuple[tuple[str, str], ...], list[PlannedRun]]:
    """The runs to do, grouped by the load arguments of their model (one load per group)."""
    groups: dict[tuple[tuple[str, str], ...], list[PlannedRun]] = {}
    for item in todo:
        groups.setdefault(tuple(sorted(item.entry.load_args.items())), []).append(item)
    for key in groups:  # the one "no device given" line before the bar starts, not in the middle of it
        device = {**spec.model_args, **dict(key)}.get("device")
        if device in (None, AUTO):
            pick_device(device)
    return groups


def run_compare(
    spec: CompareSpec,
    out: str | Path,
    resume: bool = False,
    progress: bool = True,
    locked: bool = False,
    new_settings: bool = False,
    model: ResolvedModel | None = None,
) -> list[str]:
    """Evaluate every planned run not yet finished (with these inputs); return their names.

    ``locked``: the caller already holds :func:`output_lock` on ``out`` (it writes more there).
    ``new_settings``: finished runs made otherwise are kept aside and evaluated again
    (:func:`check_out_dir`). ``model``: the spec's model, resolved already (:func:`resolved_model`).

    Raises:
        EntryError: a bad entry or task, another comparison running on ``out``, or ``out``
            holding runs this comparison cannot continue (see :func:`check_out_dir`).
    """
    from lm_eval.evaluator import simple_evaluate
    from lm_eval.loggers import EvaluationTracker
    from tqdm import tqdm

    out = Path(out)
    model = model if model is not None else resolved_model(spec)
    plan = plan_runs(spec, model)
    with contextlib.nullcontext() if locked else output_lock(out):
        finished = check_out_dir(spec, out, resume, plan, new_settings)
        todo = [item for item in plan if item.run not in finished]
        if not todo:
            return []
        # Task names and metadata are checked before minutes of model loading.
        manager, objects, leaves = _build_tasks(spec, str(model.path))
        samples = {name: samples_for_limit(tasks, spec.limit) for name, tasks in leaves.items()}
        groups = _by_model_load(spec, todo)
        bar = tqdm(total=len(todo) * len(spec.tasks), disable=not progress, desc="compare", unit="task")
        done: list[str] = []
        for load_key, items in groups.items():
            lm = _load_model(spec, model, dict(load_key))
            for item in items:
                lm.set_mask(item.mask)
                partial = out / ".partial" / item.run
                partial.mkdir(parents=True)
                cache = _request_cache(spec, out, item)
                for task in spec.tasks:
                    bar.set_description(f"compare {len(done) + len(finished) + 1}/{len(plan)} {item.run} · {task}")
                    tracker = EvaluationTracker(output_path=str(partial))
                    try:
                        results = simple_evaluate(
                            model=lm,
                            model_args=",".join(
                                f"{k}={v}"
                                for k, v in {"pretrained": spec.model, **spec.model_args, **item.args}.items()
                            ),
                            tasks=objects[task],
                            task_manager=manager,
                            samples=samples[task],
                            gen_kwargs=spec.gen_kwargs,
                            bootstrap_iters=spec.bootstrap_iters,
                            log_samples=True,
                            evaluation_tracker=tracker,
                            use_cache=cache,
                        )
                    finally:
                        _close_request_cache(lm)
                    logged = results.pop("samples")
                    tracker.save_results_aggregated(results=results, samples=logged)
                    for name in results["configs"]:
                        tracker.save_results_samples(task_name=name, samples=logged[name])
                    bar.update(1)
                _finish_run(spec, out, item, partial)
                done.append(item.run)
            del lm
        bar.close()
    return done
