"""A comparison as data: model, tasks, task settings and entries (CLI flags or a YAML file).

YAML (paths relative to the working directory, as on lm-eval's command line)::

    model: toy                       # HF id or path; toy = the bundled model
    model_args: device=cpu,batch_size=8   # passed to every entry's adapter
    tasks: [niah_single_1, bosch_niah]
    metadata: {max_seq_lengths: [512, 1024], num_samples: 20}
    limit: 10                        # per context length for RULER-style tasks
    gen_kwargs: null
    seeds: [0, 1, 2]                 # for layers=rand entries that name none
    reference: original              # the CIs are differences to this entry
    claimant: bosch                  # optional: claims.md, this entry against every other (Holm)
    kv_length: 1024                  # T of the KV-bytes column (default: longest task length)
    entries:
      - original=
      - bosch=mask=results/toy_search/bosch-r0.75/mask.json
      - {name: rand, args: "layers=rand,ratio=0.75"}
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from bosch_eval.compare.entries import (
    Entry,
    check_keys,
    check_unique,
    default_seeds,
    make_entry,
    parse_entry,
    parse_model_args,
)
from bosch_eval.models.model_identity import portable_name
from bosch_eval.runtime.checks import check_int, is_number
from bosch_eval.runtime.errors import EntryError

FIELDS = ("model", "model_args", "tasks", "metadata", "limit", "gen_kwargs", "seeds", "doc_seed", "reference", "claimant", "kv_length",
          "entries", "include_path", "bootstrap_iters")  # fmt: skip


@dataclass
class CompareSpec:
    """Everything a comparison run needs; ``settings()`` is what a resume must match."""

    model: str
    tasks: list[str]
    entries: list[Entry]
    model_args: dict[str, str] = field(default_factory=dict)
    metadata: dict[str, Any] = field(default_factory=dict)
    limit: int | float | None = None
    gen_kwargs: str | None = None
    reference: str = "original"
    # The entry whose claims against every other are tested (claims.md); None: no claims. A
    # report setting, not part of settings(): naming it later needs no new runs.
    claimant: str | None = None
    kv_length: int | None = None
    include_path: str | None = None
    bootstrap_iters: int = 0
    # Seeds the documents the synthetic tasks build (RULER's needles, bosch_niah's eval_seed):
    # a fresh test draw. None: the tasks' own default documents.
    doc_seed: int | None = None

    def __post_init__(self) -> None:
        if not self.tasks:
            raise EntryError("tasks: expected at least one lm-eval task or group")
        if not self.entries:
            raise EntryError("entries: expected at least one entry (--entry NAME=ARGS or 'entries:' in the YAML)")
        check_unique(self.entries, "entries")
        if self.limit is not None and (not is_number(self.limit) or self.limit <= 0):
            raise EntryError(f"limit: expected a positive number, got {self.limit!r}")
        if self.doc_seed is not None:
            check_int(
                self.doc_seed,
                "doc_seed",
                minimum=0,
                expected="an integer >= 0 (the seed of the tasks' documents)",
                error=EntryError,
            )
        if self.doc_seed is not None and "eval_seed" in self.metadata and self.metadata["eval_seed"] != self.doc_seed:
            raise EntryError(
                f"doc_seed: {self.doc_seed} and metadata's eval_seed {self.metadata['eval_seed']!r} both seed bosch_niah's "
                "documents; give one of them"
            )

    def settings(self) -> dict[str, Any]:
        """The task-side settings every run of one output directory shares."""
        keys = ("tasks", "model_args", "metadata", "limit", "gen_kwargs", "include_path", "bootstrap_iters")
        settings = {"model": portable_name(self.model)} | {
            k: asdict(self)[k] if k != "model_args" else self.model_args for k in keys
        }
        if self.doc_seed is not None:  # absent otherwise, as in the settings written before it existed
            settings["doc_seed"] = self.doc_seed
        return json.loads(json.dumps(settings))

    def task_metadata(self) -> dict[str, Any]:
        """The metadata the tasks get: the given one, and ``eval_seed`` from ``doc_seed``."""
        return self.metadata | ({"eval_seed": self.doc_seed} if self.doc_seed is not None else {})

    def default_kv_length(self) -> int | None:
        """The longest length the tasks are run at (``max_seq_lengths``/``seq_len``), if stated."""
        lengths = list(self.metadata.get("max_seq_lengths", []) or [])
        if "seq_len" in self.metadata:
            lengths.append(self.metadata["seq_len"])
        return self.kv_length if self.kv_length is not None else (max(map(int, lengths)) if lengths else None)


def _entries_from_yaml(items: Any, where: str) -> list[Entry]:
    if not isinstance(items, list):
        raise EntryError(
            f"{where}: field 'entries' must be a list of NAME=ARGS strings or {{name, args, seeds}} mappings"
        )
    entries = []
    for index, item in enumerate(items):
        if isinstance(item, str):
            name, sep, args = item.partition("=")
            if not sep:
                raise EntryError(f"{where}: entries[{index}] {item!r} is not NAME=ARGS")
            entries.append(make_entry(name.strip(), args, where=f"{where}: entries[{index}]"))
        elif isinstance(item, dict):
            unknown = set(item) - {"name", "args", "seeds"}
            if unknown or "name" not in item:
                raise EntryError(
                    f"{where}: entries[{index}] needs 'name' and takes 'args', 'seeds'; got {sorted(item)}"
                )
            entries.append(
                make_entry(item["name"], item.get("args") or "", item.get("seeds"), where=f"{where}: entries[{index}]")
            )
        else:
            raise EntryError(f"{where}: entries[{index}] must be a string or a mapping, got {type(item).__name__}")
    return entries


def load_spec(
    path: str | Path, overrides: dict[str, Any] | None = None, extra_entries: list[str] | None = None
) -> CompareSpec:
    """Read a leaderboard YAML; ``overrides`` (CLI flags that were given) win over its fields."""
    import yaml

    try:
        data = yaml.safe_load(Path(path).read_text()) or {}
    except (OSError, yaml.YAMLError) as err:
        raise EntryError(f"{path}: cannot read the leaderboard file ({err})") from err
    if not isinstance(data, dict):
        raise EntryError(f"{path}: expected a mapping with 'model', 'tasks' and 'entries'")
    unknown = set(data) - set(FIELDS)
    if unknown:
        raise EntryError(f"{path}: unknown fields {sorted(unknown)}; expected some of {list(FIELDS)}")
    data.update({k: v for k, v in (overrides or {}).items() if v is not None})
    entries = _entries_from_yaml(data.get("entries", []), str(path)) + [parse_entry(e) for e in extra_entries or []]
    return build_spec(data, entries, str(path))


def build_spec(data: dict[str, Any], entries: list[Entry], where: str) -> CompareSpec:
    """A spec from plain fields (YAML or CLI)."""
    if not data.get("model"):
        raise EntryError(f"{where}: field 'model' is required (HF id, path, or toy)")
    model_args = data.get("model_args") or {}
    model_args = (
        parse_model_args(model_args, f"{where}: model_args")
        if isinstance(model_args, str)
        else {k: str(v) for k, v in model_args.items()}
    )
    check_keys(model_args, f"{where}: model_args", sources=False)
    tasks = data.get("tasks") or []
    tasks = [tasks] if isinstance(tasks, str) else list(tasks)
    seeds = tuple(int(s) for s in data.get("seeds") or ())
    gen_kwargs = data.get("gen_kwargs")
    if isinstance(gen_kwargs, dict):
        gen_kwargs = ",".join(f"{k}={v}" for k, v in gen_kwargs.items())
    return CompareSpec(
        model=str(data["model"]),
        tasks=tasks,
        entries=default_seeds(entries, seeds),
        model_args=model_args,
        metadata=dict(data.get("metadata") or {}),
        limit=data.get("limit"),
        gen_kwargs=gen_kwargs,
        reference=data.get("reference") or "original",
        claimant=data.get("claimant"),
        kv_length=data.get("kv_length"),
        include_path=data.get("include_path"),
        bootstrap_iters=int(data.get("bootstrap_iters") or 0),
        doc_seed=data.get("doc_seed"),
    )
