"""The leaderboard: per entry, score per task and group, SWA ratio, KV bytes, mean ± sd over
seeds (and each seed's own scores), paired 95% CI of the difference to the reference, in-sample and
truncated flags; written as md/csv/json plus a Pareto plot (headline score vs KV bytes)."""

from __future__ import annotations

import csv
import json
import math
import statistics
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from bosch_eval.compare.kv_bytes import entry_kv_bytes
from bosch_eval.compare.paired_ci import PairedDifference, paired_bootstrap_ci
from bosch_eval.compare.results import RunResults, doc_values, main_score, read_run
from bosch_eval.compare.run_archive import RUN_FILE, readable_runs
from bosch_eval.masks.head_mask import HeadMask, HeadRanking
from bosch_eval.runtime.errors import EntryError
from bosch_eval.tasks.niah.eval_suite import value_format

CI_METHOD = "paired percentile bootstrap over the same documents (stratified by length), 10000 resamples, seed 0"
TRUNCATED_LEGEND = (
    "*truncated*: some of the task's documents were longer than the model's max_length and were scored after "
    "lm-eval's left truncation (allow_truncation=true; counts in the run's results, config.bosch_truncated): "
    "not the task's score."
)


@dataclass
class Cell:
    """One entry's score on one task or group."""

    metric: str
    mean: float
    sd: float | None = None  # over seeds
    ci: tuple[float, float, float] | None = None  # (difference, low, high) vs the reference
    n_docs: int | None = None
    in_sample: bool = False
    truncated: bool = False  # some documents were scored after left truncation (allow_truncation)


@dataclass
class Row:
    entry: str
    runs: int
    swa_ratio: float | None
    kv_bytes: float | None
    cells: dict[str, Cell] = field(default_factory=dict)
    headline_ci: tuple[float, float, float] | None = None  # (difference, low, high) of the headline vs the reference
    # An entry with several runs (seeds): each run's own score per column, by run name; the
    # mean ± sd alone would hide a seed that does much better or worse than the others.
    per_run: dict[str, dict[str, float]] = field(default_factory=dict)


@dataclass
class EntryRuns:
    """What the leaderboard needs of one entry: its runs' results, model_args and mask."""

    name: str
    runs: list[RunResults]
    model_args: dict[str, str]
    mask: HeadMask | None
    run_names: list[str] = field(default_factory=list)  # one per run (its folder, e.g. ``rand-r0.5@seed=1``)


def calibration_tasks(mask: HeadMask | None) -> set[str]:
    """Tasks a mask was searched on, from its provenance (``calibration.tasks``)."""
    if mask is None:
        return set()
    calib = mask.provenance.get("calibration") if isinstance(mask.provenance, dict) else None
    return set(calib.get("tasks", [])) if isinstance(calib, dict) else set()


def ranking_calibration_tasks(model_args: dict[str, str]) -> set[str]:
    """Tasks the entry's ranking file (``ranking=``) was computed on: in-sample for that entry
    as for a search on them (paper B.4 computes the rankings on the search's calibration set)."""
    path = model_args.get("ranking")
    if not path or not Path(path).is_file():
        return set()
    return HeadRanking.load(path).calibration_tasks


def _members(name: str, groups: dict[str, list[str]]) -> set[str]:
    found = {name}
    for child in groups.get(name, []):
        found |= _members(child, groups)
    return found


def from_compare_dir(out: Path, entries_order: list[str]) -> list[EntryRuns]:
    """The finished runs of ``out`` (``runs/`` or its ``runs.tar.xz``), grouped by entry (in ``entries_order``)."""
    by_entry: dict[str, EntryRuns] = {}
    with readable_runs(out) as runs:
        for run_dir in sorted(runs.iterdir()):
            record = json.loads((run_dir / RUN_FILE).read_text())
            mask = HeadMask.from_json(record["mask"], f"{out}/runs/{run_dir.name}/{RUN_FILE}")
            args = {k: v for k, v in record["model_args"].items() if k != "seed"}
            item = by_entry.setdefault(record["entry"], EntryRuns(record["entry"], [], args, mask))
            item.runs.append(read_run(run_dir))
            item.run_names.append(run_dir.name)
    return [by_entry[name] for name in entries_order if name in by_entry]


def from_results_dir(directory: str | Path) -> EntryRuns:
    """A finished lm-eval output directory (any model) as an entry named after the directory.

    Raises:
        EntryError: no such directory, or no readable lm-eval results below it.
    """
    directory = Path(directory)
    if not directory.is_dir():
        raise EntryError(
            f"--from-results {directory}: no such directory; expected a finished lm-eval --output_path directory"
        )
    try:
        run = read_run(directory)
    except (FileNotFoundError, ValueError) as err:
        raise EntryError(f"--from-results {directory}: {err}") from None
    bits = run.config.get("bosch_mask")
    mask = None
    if bits is not None:
        # H is not recorded; SWA ratio and relative KV bytes depend on the groups only.
        args = run.config.get("model_args")
        source = dict(item.split("=", 1) for item in args.split(",") if "=" in item) if isinstance(args, str) else {}
        provenance = {}
        if "mask" in source and Path(source["mask"]).is_file():
            provenance = HeadMask.load(source["mask"]).provenance  # its calibration task: in-sample flag
        mask = HeadMask.from_rows(bits, len(bits[0]), window=run.config.get("bosch_window"), provenance=provenance)
    return EntryRuns(directory.name, [run], {}, mask)


def column_order(entries: list[EntryRuns]) -> list[str]:
    """Every task and group any entry has a result for, in the order first seen."""
    return list(dict.fromkeys(name for e in entries for run in e.runs for name in run.results))


def build_rows(
    entries: list[EntryRuns],
    reference: str,
    kv_length: int | None,
    head_dim: int | None = None,
    tasks: list[str] | None = None,
) -> list[Row]:
    """One row per entry; the CIs pair each entry's documents with the reference's.

    ``head_dim`` (of the compared model) sizes the packed cache of ``kv_quant`` entries;
    ``tasks`` (those asked for) decide the headline columns, whose mean gets a CI too.
    """
    ref = next((e for e in entries if e.name == reference), None)
    rows = []
    for entry in entries:
        mask = entry.mask
        kv = None
        if kv_length is not None:
            kv = 1.0 if mask is None else entry_kv_bytes(entry.model_args, mask, mask.window or 1, kv_length, head_dim)
        row = Row(entry.name, len(entry.runs), 0.0 if mask is None else mask.swa_ratio, kv)
        calib = calibration_tasks(mask) | ranking_calibration_tasks(entry.model_args)
        groups = _group_subtasks(entry)
        truncated = {task for run in entry.runs for task in run.truncated}
        for name in entry.runs[0].results:
            scores = [main_score(run.results.get(name, {})) for run in entry.runs]
            if any(s is None for s in scores):
                continue
            values = [s[1] for s in scores]
            cell = Cell(scores[0][0], statistics.fmean(values), statistics.stdev(values) if len(values) > 1 else None)
            cell.in_sample = bool(_members(name, groups) & calib)
            cell.truncated = bool(_members(name, groups) & truncated)
            if (
                ref is not None
                and entry is not ref
                and (paired := paired_difference(entry, ref, [name], cell.mean)) is not None
            ):
                cell.ci, cell.n_docs = paired[:3], paired.n
            row.cells[name] = cell
            if len(entry.runs) > 1:
                for label, value in zip(run_labels(entry), values):
                    row.per_run.setdefault(label, {})[name] = value
        rows.append(row)
    held = headline_columns(rows, column_order(entries), tasks or [])
    for entry, row in zip(entries, rows):
        if held and ref is not None and entry is not ref and all(n in row.cells and row.cells[n].ci for n in held):
            paired = paired_difference(entry, ref, held, headline(row, held))
            row.headline_ci = None if paired is None else paired[:3]
    return rows


def run_labels(entry: EntryRuns) -> list[str]:
    """A name per run: its folder's where known, else the entry's name and the run's place."""
    if len(entry.run_names) == len(entry.runs):
        return entry.run_names
    return [f"{entry.name} run {i + 1}" for i in range(len(entry.runs))]


def _mean_docs(runs: list[RunResults], task: str, metric: str) -> dict[Any, float]:
    per_run = [doc_values(run.samples[task], metric) for run in runs]
    return {key: math.fsum(v[key] for v in per_run) / len(per_run) for key in per_run[0]}


def _group_subtasks(entry: EntryRuns) -> dict[str, list[str]]:
    return {k: v for run in entry.runs for k, v in run.group_subtasks.items()}


def _leaves(name: str, groups: dict[str, list[str]], weight: float = 1.0) -> list[tuple[str, float]]:
    """The tasks under ``name`` with their weights in its score: a group is the unweighted mean
    of its children (this package's groups; checked against the group's score in :func:`_ci`)."""
    children = groups.get(name)
    if not children:
        return [(name, weight)]
    return [leaf for child in children for leaf in _leaves(child, groups, weight / len(children))]


def paired_difference(
    entry: EntryRuns, ref: EntryRuns, tasks: list[str], score: float | None
) -> PairedDifference | None:
    """``entry − ref`` on the unweighted mean over ``tasks`` (one task: its score), paired by
    document, a group's documents those of its tasks, each task's lengths weighted as its score
    weighs them. None where a task has no samples or another metric than the reference's, or
    where those weights do not give a group's ``score`` (one that lm-eval weighs by size)."""
    groups = _group_subtasks(entry)
    entry_docs: dict[tuple[Any, int], float] = {}
    ref_docs: dict[tuple[Any, int], float] = {}
    weights: dict[Any, float] = {}
    for task, weight in (leaf for name in tasks for leaf in _leaves(name, groups, 1 / len(tasks))):
        metric = main_score(entry.runs[0].results.get(task, {}))
        ref_metric = main_score(ref.runs[0].results.get(task, {}))
        if metric is None or ref_metric is None or ref_metric[0] != metric[0]:
            return None
        if not all(task in run.samples for run in entry.runs + ref.runs):
            return None
        mine, theirs = _mean_docs(entry.runs, task, metric[0]), _mean_docs(ref.runs, task, metric[0])
        strata = {key[0] for key in mine}
        for stratum in strata:
            weights[(task, stratum)] = weight / len(strata)
        entry_docs |= {((task, key[0]), key[1]): value for key, value in mine.items()}
        ref_docs |= {((task, key[0]), key[1]): value for key, value in theirs.items()}
    if any(name in groups for name in tasks):
        weighted = math.fsum(
            w * statistics.fmean(v for k, v in entry_docs.items() if k[0] == stratum) for stratum, w in weights.items()
        )
        if score is None or not math.isclose(weighted, score, abs_tol=1e-9):
            return None
    return paired_bootstrap_ci(entry_docs, ref_docs, weights=weights)


def headline(row: Row, names: list[str]) -> float | None:
    """Unweighted mean over ``names`` (the held-out columns)."""
    values = [row.cells[n].mean for n in names if n in row.cells]
    return statistics.fmean(values) if values and len(values) == len(names) else None


def held_out_columns(rows: list[Row], order: list[str]) -> list[str]:
    """Columns no entry scored in-sample."""
    return [n for n in order if not any(r.cells.get(n) and r.cells[n].in_sample for r in rows)]


def headline_columns(rows: list[Row], order: list[str], tasks: list[str]) -> list[str]:
    """The headline's columns: the main ones (:func:`main_columns`) no entry scored in-sample."""
    return held_out_columns(rows, main_columns(order, tasks))


def _fmt(cell: Cell | None) -> str:
    if cell is None:
        return "–"
    text = f"{cell.mean:.3f}" + (f" ± {cell.sd:.3f}" if cell.sd is not None else "")
    if cell.ci is not None:
        text += f" ({cell.ci[0]:+.3f} [{cell.ci[1]:+.3f}, {cell.ci[2]:+.3f}])"
    return text + (" *in-sample*" if cell.in_sample else "") + (" *truncated*" if cell.truncated else "")


def headline_truncated(row: Row, names: list[str]) -> bool:
    """Whether any of the headline's columns is a truncated cell of ``row``."""
    return any(row.cells[n].truncated for n in names if n in row.cells)


def main_columns(order: list[str], tasks: list[str]) -> list[str]:
    """The columns of the main table: the tasks and groups asked for, in the order asked.

    A group's subtasks (and subgroups) go to the second table: counting them beside their
    group in the headline would weigh one task several times. Without any asked-for column
    (``--from-results`` alone), every column is a main one.
    """
    asked = [name for name in tasks if name in order]
    return asked or list(order)


def column_label(name: str) -> str:
    """A column's header: the task's name, with what it asks where it is a NIAH format
    (``bosch_niah_single_3 (UUIDs in prose)``), so a gap shows where it is (issue 67)."""
    asks = value_format(name)
    return name if asks is None else f"{name} ({asks})"


def _table(rows: list[Row], columns: list[str], with_headline: list[str] | None) -> list[str]:
    head = "| entry | SWA ratio | KV bytes | " + ("headline | " if with_headline is not None else "")
    lines = [
        head + " | ".join(map(column_label, columns)) + " |",
        "|---" * (3 + (with_headline is not None) + len(columns)) + "|",
    ]
    for row in rows:
        cells = f"| {row.entry} | {row.swa_ratio:.3f} | {'–' if row.kv_bytes is None else f'{row.kv_bytes:.4f}'} | "
        if with_headline is not None:
            score = headline(row, with_headline)
            if score is None:
                cells += "– | "
            else:
                ci = row.headline_ci
                cells += f"{score:.3f}" + (f" ({ci[0]:+.3f} [{ci[1]:+.3f}, {ci[2]:+.3f}])" if ci else "")
                cells += (" *truncated*" if headline_truncated(row, with_headline) else "") + " | "
        lines.append(cells + " | ".join(_fmt(row.cells.get(n)) for n in columns) + " |")
    return lines


def _per_run_table(rows: list[Row], columns: list[str], held: list[str] | None) -> list[str]:
    """One line per run of each entry with several runs: its own scores (no CI: the paired CIs
    above average each document over the runs)."""
    lines = [
        "| run | " + ("headline | " if held else "") + " | ".join(map(column_label, columns)) + " |",
        "|---" * (1 + bool(held) + len(columns)) + "|",
    ]
    for row in rows:
        for label, scores in row.per_run.items():
            cells = [
                f"{scores[n]:.3f}" + (" *in-sample*" if row.cells[n].in_sample else "") if n in scores else "–"
                for n in columns
            ]
            if held:
                cells.insert(
                    0, f"{statistics.fmean(scores[n] for n in held):.3f}" if all(n in scores for n in held) else "–"
                )
            lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return lines


def _kv_legend(kv_length: int | None) -> str:
    if kv_length is None:
        return (
            "KV bytes: not computed, no task length is known (pass --kv-length, or metadata max_seq_lengths / seq_len)."
        )
    return f"KV bytes: relative to the original at T = {kv_length}."


def write_leaderboard(rows: list[Row], order: list[str], out: Path, header: dict[str, Any], tasks: list[str]) -> None:
    """``leaderboard.md``, ``.csv``, ``.json`` and ``pareto.png`` under ``out``.

    ``tasks`` are the task and group names the comparison asked for: they make the main
    table and the headline (held-out ones only); subtasks follow in a second table.
    """
    main = main_columns(order, tasks)
    held = headline_columns(rows, order, tasks)
    rest = [name for name in order if name not in main]
    kv_t = header.get("kv_length")
    if held:
        headline_text = f"Headline: mean over {held} (with the paired CI of its difference)."
    else:
        headline_text = "No headline and no Pareto plot: every task asked for is some entry's calibration task (in-sample), so no task is held out."
    legend = [TRUNCATED_LEGEND, ""] if any(cell.truncated for row in rows for cell in row.cells.values()) else []
    lines = [f"$ {header['command']}", "", f"versions: {json.dumps(header['versions'])}", "",
             f"Cells: score ± sd over seeds (difference to `{header['reference']}` [95% CI], {CI_METHOD}). "
             f"*in-sample*: the entry's mask was searched, or its ranking computed, on this task. {_kv_legend(kv_t)} "
             f"{headline_text}", "", *legend, *_table(rows, main, held or None)]  # fmt: skip
    if rest:
        lines += ["", "Subtasks and subgroups:", "", *_table(rows, rest, None)]
    if any(row.per_run for row in rows):
        lines += [
            "",
            "Each run of the entries run with several seeds:",
            "",
            *_per_run_table(rows, main + rest, held or None),
        ]
    (out / "leaderboard.md").write_text("\n".join(lines) + "\n")
    _write_csv(rows, order, out / "leaderboard.csv")
    formats = {name: asks for name in order if (asks := value_format(name)) is not None}
    payload = {
        **header,
        "ci_method": CI_METHOD,
        "headline_columns": held,
        "formats": formats,
        "rows": [asdict(r) for r in rows],
    }
    (out / "leaderboard.json").write_text(json.dumps(payload, indent=1) + "\n")
    if held:
        plot_pareto(rows, held, out / "pareto.png", kv_t, header["reference"])
    else:
        (out / "pareto.png").unlink(missing_ok=True)  # an earlier run's plot would no longer match the table


def _write_csv(rows: list[Row], order: list[str], path: Path) -> None:
    """One line per entry and column: every cell with its CI, document count and flags."""
    with open(path, "w", newline="") as handle:
        writer = csv.writer(handle)
        writer.writerow(
            [
                "entry",
                "swa_ratio",
                "kv_bytes",
                "task",
                "metric",
                "mean",
                "sd",
                "diff",
                "ci_low",
                "ci_high",
                "n_docs",
                "in_sample",
                "truncated",
            ]
        )
        for row in rows:
            for name in order:
                c = row.cells.get(name)
                if c is not None:
                    ci = c.ci or (None, None, None)
                    writer.writerow(
                        [
                            row.entry,
                            row.swa_ratio,
                            row.kv_bytes,
                            name,
                            c.metric,
                            c.mean,
                            c.sd,
                            *ci,
                            c.n_docs,
                            c.in_sample,
                            c.truncated,
                        ]
                    )


def pareto_labels(rows: list[Row], held: list[str]) -> dict[tuple[float, float], str]:
    """One label per plotted position: rows tied as the table prints them (KV bytes to 4
    places, headline to 3) share a position, so their names go in one label, one a line,
    instead of being drawn over each other."""
    labels: dict[tuple[float, float], list[str]] = {}
    for row in rows:
        score = headline(row, held)
        if row.kv_bytes is not None and score is not None:
            name = row.entry + (" (truncated)" if headline_truncated(row, held) else "")
            labels.setdefault((round(row.kv_bytes, 4), round(score, 3)), []).append(name)
    return {position: "\n".join(names) for position, names in labels.items()}


def plot_pareto(rows: list[Row], held: list[str], path: Path, kv_length: int | None, reference: str) -> None:
    """Headline score vs KV bytes, each point with the 95% CI of its difference to the
    reference (drawn around its score); the Pareto front (no entry both smaller and better) joined."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    points = [
        (r.kv_bytes, headline(r, held), r.headline_ci)
        for r in rows
        if r.kv_bytes is not None and headline(r, held) is not None
    ]
    fig, ax = plt.subplots(figsize=(6, 4.5))
    ci_label: str | None = f"95% CI of the difference to {reference}, around the score"
    for x, y, ci in points:
        yerr = None if ci is None else [[ci[0] - ci[1]], [ci[2] - ci[0]]]
        label, ci_label = (ci_label, None) if ci is not None else (None, ci_label)  # one legend entry
        ax.errorbar(x, y, yerr=yerr, fmt="o", color="tab:blue", ecolor="tab:gray", elinewidth=1, capsize=3, label=label)
    for (x, y), label in pareto_labels(rows, held).items():
        ax.annotate(label, (x, y), textcoords="offset points", xytext=(5, 0), va="center", fontsize=8)
    front = sorted((x, y) for x, y, _ in points if not any(q[0] <= x and q[1] >= y and q[:2] != (x, y) for q in points))
    if front:
        ax.plot([p[0] for p in front], [p[1] for p in front], color="tab:red", lw=1, label="Pareto front")
    if ax.get_legend_handles_labels()[1]:  # no points, or none with a CI and no front: nothing to list
        ax.legend(fontsize=8)
    ax.set_xlabel(f"KV-cache bytes relative to the original (T = {kv_length})")
    ax.set_ylabel(f"headline score (mean over {len(held)} held-out task{'s' * (len(held) > 1)})")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
