"""Leaderboard entries: a name plus ``--model bosch`` model_args, from the CLI or a YAML file.

An entry's model_args split in two:

* the mask source (``mask``, ``ranking``, ``layers``, ``ratio``, ``seed``, ``window``): swapped
  in place on a loaded model (:meth:`BoschLM.set_mask`), never reloaded;
* everything else (``dtype``, ``kv_cache``, ``attn_backend``, ``kv_quant``, ...): passed
  through to the adapter unchanged. Entries that differ here need a model of their own; the
  runner loads one per distinct set, so nothing an entry asks for is silently dropped.

No mask source at all (or ``mask=full``, the adapter's spelling) is the original model
(every KV group full). Entries are read by the adapter's own model_args parser
(:mod:`bosch_eval.model_adapters.loader_args`), the one ``lm_eval --model bosch`` and
``search --model-args`` use: the same keys, the same message for a typo.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from bosch_eval.model_adapters import loader_args
from bosch_eval.model_adapters.settings import AdapterSettings
from bosch_eval.runtime.checks import is_int
from bosch_eval.runtime.errors import EntryError, SettingsError

SOURCE_KEYS = AdapterSettings.mask_source_names()
NAME_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.+-]*$")  # used as a directory name
SEED_SEPARATOR = "/"  # seeds=0/1/2: a comma would end the model_arg


@dataclass(frozen=True)
class Entry:
    """One leaderboard row: ``name`` and its model_args (strings, as lm-eval passes them).

    ``seeds`` (for ``layers=rand``) expands the entry into one run per seed; the leaderboard
    reports mean ± sd over them.
    """

    name: str
    model_args: dict[str, str] = field(default_factory=dict)
    seeds: tuple[int, ...] = ()

    @property
    def source_args(self) -> dict[str, str]:
        """The mask-source model_args (swapped in place)."""
        return {k: v for k, v in self.model_args.items() if k in SOURCE_KEYS}

    @property
    def load_args(self) -> dict[str, str]:
        """The model_args that shape the loaded model (passed through to the adapter)."""
        return {k: v for k, v in self.model_args.items() if k not in SOURCE_KEYS}

    @property
    def is_original(self) -> bool:
        return self.model_args.get("mask") == "full" or not any(
            k in self.model_args for k in ("mask", "ranking", "layers")
        )

    def runs(self) -> list[tuple[str, dict[str, str]]]:
        """``(run name, model_args)`` per seed (``NAME@seed=S``), or the entry itself."""
        if not self.seeds:
            return [(self.name, dict(self.model_args))]
        return [(f"{self.name}@seed={s}", {**self.model_args, "seed": str(s)}) for s in self.seeds]


def parse_model_args(text: str, where: str) -> dict[str, str]:
    """``k=v,k=v`` as lm-eval's ``--model_args`` (:func:`loader_args.split_model_args`); an item
    without ``=`` or a key given twice is an error naming ``where``."""
    try:
        return loader_args.split_model_args(text, where)
    except SettingsError as err:
        raise EntryError(str(err)) from None


def check_keys(args: dict[str, str], where: str, sources: bool = True) -> None:
    """Refuse a key the ``bosch`` adapter does not take (``kv_bit=4``, ``foo=1``) before
    anything loads, with the adapter's own check (:func:`loader_args.check_keys`: the key,
    the nearest valid one and the list), so a key added to the adapter is accepted here
    without a second list. ``sources=False`` (the leaderboard's ``model_args``): the
    mask-source keys are each entry's, not shared.

    Raises:
        EntryError: naming ``where``, the key and the keys expected.
    """
    for key in args:
        if key == "pretrained":
            raise EntryError(f"{where}: model_arg 'pretrained' belongs to the leaderboard ('model'), not here")
        if not sources and key in SOURCE_KEYS:
            raise EntryError(
                f"{where}: model_arg {key!r} chooses a mask, so it goes in an entry, not in every entry's model_args"
            )
    try:
        loader_args.check_keys(args, where)
    except SettingsError as err:
        raise EntryError(str(err)) from None


def _parse_seeds(value: Any, where: str) -> tuple[int, ...]:
    items = value.split(SEED_SEPARATOR) if isinstance(value, str) else value
    if is_int(items):
        items = [items]
    if not isinstance(items, (list, tuple)) or not items:
        raise EntryError(f"{where}: field 'seeds' must be a list of integers (or 0/1/2), got {value!r}")
    seeds = []
    for item in items:
        try:
            seeds.append(int(item))
        except (TypeError, ValueError):
            raise EntryError(f"{where}: field 'seeds' must hold integers, got {item!r}") from None
    if len(set(seeds)) != len(seeds):
        raise EntryError(f"{where}: field 'seeds' repeats a seed: {seeds}")
    return tuple(seeds)


def make_entry(name: str, model_args: str | dict[str, Any], seeds: Any = None, where: str = "entry") -> Entry:
    """Validate one entry. ``seeds=0/1/2`` inside model_args is the CLI spelling of ``seeds``."""
    where = f"{where} {name!r}"
    if not isinstance(name, str) or not NAME_PATTERN.match(name):
        raise EntryError(f"{where}: field 'name' must match {NAME_PATTERN.pattern} (it names a directory)")
    if isinstance(model_args, str):
        args = parse_model_args(model_args, where)
    elif isinstance(model_args, dict):
        args = {str(k): str(v) for k, v in model_args.items()}
    else:
        raise EntryError(
            f"{where}: field 'args' must be a k=v,k=v string or a mapping, got {type(model_args).__name__}"
        )
    if "seeds" in args:
        if seeds is not None:
            raise EntryError(f"{where}: seeds given both in 'args' and as 'seeds'")
        seeds = args.pop("seeds")
    check_keys(args, where)
    parsed_seeds = _parse_seeds(seeds, where) if seeds is not None else ()
    if parsed_seeds and "seed" in args:
        raise EntryError(f"{where}: give 'seed' or 'seeds', not both")
    if parsed_seeds and args.get("layers") != "rand":
        raise EntryError(f"{where}: field 'seeds' goes with layers=rand only (the only random source)")
    sources = [k for k in ("mask", "ranking", "layers") if k in args]
    if args.get("mask") == "full" and ("ratio" in args or "seed" in args):
        raise EntryError(f"{where}: mask=full keeps every group full; 'ratio' and 'seed' go with ranking= or layers=")
    if len(sources) > 1:
        raise EntryError(f"{where}: expected one mask source (mask=, ranking= or layers=), got {sources}")
    if "ratio" in args and not sources:
        raise EntryError(f"{where}: model_arg 'ratio' needs ranking= or layers=")
    return Entry(name, args, parsed_seeds)


def parse_entry(text: str) -> Entry:
    """``NAME=ARGS`` from ``--entry`` (``ARGS`` empty: the original model)."""
    name, sep, args = text.partition("=")
    if not sep:
        raise EntryError(f"--entry {text!r}: expected NAME=ARGS, e.g. bosch=mask=mask.json or original=")
    return make_entry(name.strip(), args, where="--entry")


def check_unique(entries: list[Entry], where: str) -> None:
    """Two entries with one name would write into one directory."""
    seen: set[str] = set()
    for entry in entries:
        if entry.name in seen:
            raise EntryError(f"{where}: two entries are named {entry.name!r}")
        seen.add(entry.name)


def default_seeds(entries: list[Entry], seeds: tuple[int, ...]) -> list[Entry]:
    """The leaderboard's ``seeds`` for every ``layers=rand`` entry that names none."""
    if not seeds:
        return entries
    return [
        Entry(e.name, e.model_args, seeds)
        if e.model_args.get("layers") == "rand" and not e.seeds and "seed" not in e.model_args
        else e
        for e in entries
    ]
