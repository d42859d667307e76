"""Run every entry × task through lm-eval, the model loaded once and masks swapped in place.

Layout under ``out``::

    compare.json          the settings (a resume must match them)
    runs/<run>/           one finished run: lm-eval's results_*.json and samples_*.jsonl
                          (one pair per task) and run.json (entry, mask, window)
    .partial/<run>/       the run in progress; moved to runs/ when its last task is done

Killing the run loses at most the run in progress (``.partial`` is cleared on restart);
``resume=True`` skips finished runs, and a finished run is never overwritten.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

from bosch_eval.compare.doc_selection import samples_for_limit
from bosch_eval.compare.entries import Entry, EntryError
from bosch_eval.compare.spec import CompareSpec
from bosch_eval.masks import HeadMask, MaskError, ModelShape

RUN_FILE = "run.json"


def planned_runs(spec: CompareSpec) -> list[tuple[Entry, str, dict[str, str]]]:
    """``(entry, run name, model_args)`` for every run, in entry order."""
    return [(entry, run, args) for entry in spec.entries for run, args in entry.runs()]


def check_out_dir(spec: CompareSpec, out: Path, resume: bool) -> set[str]:
    """Prepare ``out``; return the runs already finished (to skip).

    Raises:
        EntryError: finished runs exist without ``resume``, or ``out`` was made with
            other settings, or a finished run was made with other model_args.
    """
    settings_file = out / "compare.json"
    finished = {p.name for p in (out / "runs").iterdir() if (p / RUN_FILE).is_file()} if (out / "runs").is_dir() else set()
    if settings_file.is_file():
        saved = json.loads(settings_file.read_text())["settings"]
        for key, value in spec.settings().items():
            if saved.get(key) != value:
                raise EntryError(f"{out}: field {key!r} was {saved.get(key)!r} in this output directory, now {value!r}; use another --out")
    if finished and not resume:
        raise EntryError(f"{out}: {len(finished)} runs are already finished ({sorted(finished)[:3]}...); pass --resume or another --out")
    for entry, run, args in planned_runs(spec):
        if run in finished:
            saved_args = json.loads((out / "runs" / run / RUN_FILE).read_text())["model_args"]
            if saved_args != args:
                raise EntryError(f"entry {entry.name!r}: field 'args' is {args} but run {run!r} in {out} was made with {saved_args}")
    out.mkdir(parents=True, exist_ok=True)
    settings_file.write_text(json.dumps({"settings": spec.settings()}, indent=1) + "\n")
    shutil.rmtree(out / ".partial", ignore_errors=True)  # the run a kill interrupted
    return finished


def validate_entries(spec: CompareSpec) -> None:
    """Resolve every run's mask against the model's shape before anything is loaded or written.

    Raises:
        EntryError: naming the entry and the field (a missing file, a mask for another model,
            a ratio outside [0, 1], ...).
    """
    from transformers import AutoConfig

    from bosch_eval.model_defaults import model_defaults
    from bosch_eval.toy import resolve_model

    path = resolve_model(spec.model)
    shape = ModelShape.from_config(AutoConfig.from_pretrained(path))
    for entry, _, args in planned_runs(spec):
        try:
            resolve_entry_mask(args, shape, model_defaults(path).window, spec.model)
        except (MaskError, OSError) as err:
            raise EntryError(f"entry {entry.name!r}: {err}") from None


def _load_model(spec: CompareSpec, load_args: dict[str, str]) -> tuple[Any, ModelShape, int | None, str]:
    from lm_eval.utils import simple_parse_args_string
    from transformers import AutoConfig

    from bosch_eval.model_adapters.bosch import BoschLM
    from bosch_eval.model_defaults import model_defaults
    from bosch_eval.toy import resolve_model

    path = resolve_model(spec.model)
    shape = ModelShape.from_config(AutoConfig.from_pretrained(path))
    default_window = model_defaults(path).window
    full = HeadMask.uniform(shape, full=True, window=default_window or 1, method="original")
    kwargs = simple_parse_args_string(",".join(f"{k}={v}" for k, v in {**spec.model_args, **load_args}.items()))
    lm = BoschLM(pretrained=path, mask=full, **kwargs)
    return lm, shape, default_window, path


def resolve_entry_mask(args: dict[str, str], shape: ModelShape, default_window: int | None, model: str) -> HeadMask:
    """The mask a run's model_args ask for (all full for the original), validated against ``shape``."""
    from bosch_eval.mask_sources import resolve_mask

    source: dict[str, Any] = {k: args[k] for k in ("mask", "ranking", "layers", "ratio", "seed", "window") if k in args}
    for key, kind in (("ratio", float), ("seed", int), ("window", int)):
        if key in source:
            try:
                source[key] = kind(source[key])
            except ValueError:
                raise MaskError(f"{key}: expected {'a number' if kind is float else 'an integer'}, got {source[key]!r}") from None
    if not any(k in source for k in ("mask", "ranking", "layers")):
        window = int(source.get("window", default_window or 1))
        return HeadMask.uniform(shape, full=True, window=window, method="original")
    mask, _ = resolve_mask(shape, default_window=default_window, model_name=model, **source)
    return mask


def _build_tasks(spec: CompareSpec, path: str) -> tuple[Any, dict[str, list[Any]], dict[str, dict[str, Any]]]:
    """The TaskManager, each task name's objects and its leaf Tasks (built once)."""
    from bosch_eval.search.objective import ObjectiveError, _task_manager, load_task

    # Synthetic tasks (RULER, bosch_niah*) size their documents with the model's tokenizer.
    metadata = {"pretrained": path, "tokenizer": path} | dict(spec.metadata)
    try:
        manager = _task_manager(spec.tasks, spec.include_path, metadata)
    except ObjectiveError as err:
        raise EntryError(str(err)) from None
    objects: dict[str, list[Any]] = {}
    leaves: dict[str, dict[str, Any]] = {}
    for name in spec.tasks:
        loaded = load_task(manager, name)
        groups = loaded.get("groups", {})
        objects[name] = [groups[name]] if name in groups else list(loaded["tasks"].values())
        leaves[name] = dict(loaded["tasks"])
    return manager, objects, leaves


def run_compare(spec: CompareSpec, out: str | Path, resume: bool = False, progress: bool = True) -> list[str]:
    """Evaluate every planned run not yet finished; return the names of the runs evaluated."""
    from lm_eval.evaluator import simple_evaluate
    from lm_eval.loggers import EvaluationTracker
    from tqdm import tqdm

    out = Path(out)
    validate_entries(spec)
    finished = check_out_dir(spec, out, resume)
    todo = [(e, r, a) for e, r, a in planned_runs(spec) if r not in finished]
    groups: dict[tuple[tuple[str, str], ...], list[tuple[Entry, str, dict[str, str]]]] = {}
    for item in todo:
        groups.setdefault(tuple(sorted(item[0].load_args.items())), []).append(item)
    bar = tqdm(total=len(todo) * len(spec.tasks), disable=not progress, desc="compare", unit="task")
    done: list[str] = []
    for load_key, items in groups.items():
        lm, shape, default_window, path = _load_model(spec, dict(load_key))
        manager, objects, leaves = _build_tasks(spec, path)
        samples = {name: samples_for_limit(tasks, spec.limit) for name, tasks in leaves.items()}
        for entry, run, args in items:
            try:
                mask = resolve_entry_mask(args, shape, default_window, spec.model)
            except MaskError as err:
                raise EntryError(f"entry {entry.name!r}: {err}") from None
            lm.set_mask(mask)
            partial = out / ".partial" / run
            partial.mkdir(parents=True)
            for index, task in enumerate(spec.tasks):
                bar.set_description(f"compare {len(done) + len(finished) + 1}/{len(planned_runs(spec))} {run} · {task}")
                tracker = EvaluationTracker(output_path=str(partial))
                results = simple_evaluate(
                    model=lm,
                    model_args=",".join(f"{k}={v}" for k, v in {"pretrained": spec.model, **spec.model_args, **args}.items()),
                    tasks=objects[task],
                    task_manager=manager,
                    samples=samples[task],
                    gen_kwargs=spec.gen_kwargs,
                    bootstrap_iters=spec.bootstrap_iters,
                    log_samples=True,
                    evaluation_tracker=tracker,
                )
                logged = results.pop("samples")
                tracker.save_results_aggregated(results=results, samples=logged)
                for name in results["configs"]:
                    tracker.save_results_samples(task_name=name, samples=logged[name])
                bar.update(1)
            record = {"entry": entry.name, "run": run, "model_args": args, "mask": mask.to_json(), "window": mask.window}
            (partial / RUN_FILE).write_text(json.dumps(record, indent=1) + "\n")
            (out / "runs").mkdir(exist_ok=True)
            os.replace(partial, out / "runs" / run)
            done.append(run)
        del lm
    bar.close()
    return done

