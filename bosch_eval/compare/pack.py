"""Pack lm-eval outputs for committing under ``results/`` (results/README.md).

A packed folder keeps every number and the means to check it, not the bytes lm-eval repeats
in every file:

- ``samples_*.jsonl`` lose the prompt text (``doc.input`` and each ``arguments.*.arg_0``: the
  synthetic haystack, most of their bytes) and its hash ``prompt_hash``; ``target_hash`` (a hash
  of the ``target`` they keep); ``filtered_resps`` where the filter is ``none`` (then it is
  each response's first element). ``doc_hash`` keeps its first 16 hex digits: 64 bits still
  check a regenerated document, and the full 256 were half of a packed file's bytes.
- ``results_*.json`` keep every field, but the two that are the same in every file of a
  study, the machine's description (``pretty_env_info``) and each task's config
  (``configs[task]``), are stored once, in ``shared.json.gz`` at the packed folder's root, and
  the field names its entry: ``"see ../shared.json.gz#configs/<sha256[:12]>"`` (a path
  relative to the results file's folder).
- both are gzipped, which ``compare``, the leaderboard and
  :func:`bosch_eval.compare.results.read_run` read as they are;
- a comparison's finished runs then move into one ``runs.tar.xz``
  (:mod:`bosch_eval.compare.run_archive`), which stores them 7 times smaller again.

Packing a packed folder again changes nothing. ``keep_prompts`` keeps the prompts of
documents no task can regenerate. Runs in progress are left alone (a
comparison's ``.partial/``, and a ``runs/<run>/`` without its ``run.json``), so a comparison
may still be running.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import os
from pathlib import Path
from typing import Any

from bosch_eval.compare.run_archive import RUN_FILE, archive_runs
from bosch_eval.runtime.errors import BoschError

SHARED_FILE = "shared.json.gz"
DOC_HASH_DIGITS = 16
PACKED = "see "  # how a field moved into SHARED_FILE starts


def strip_sample(sample: dict[str, Any], keep_prompt: bool = False) -> dict[str, Any]:
    """One ``samples_*.jsonl`` record without the prompt (unless ``keep_prompt``) and what is
    derived from kept fields."""
    sample = dict(sample)
    arguments = sample.get("arguments")
    if not keep_prompt:
        sample["doc"] = {key: value for key, value in sample.get("doc", {}).items() if key != "input"}
    if isinstance(arguments, dict) and not keep_prompt:
        sample["arguments"] = {
            name: {key: value for key, value in args.items() if key != "arg_0"} if isinstance(args, dict) else args
            for name, args in arguments.items()
        }
    sample.pop("prompt_hash", None)
    sample.pop("target_hash", None)
    if isinstance(sample.get("doc_hash"), str):
        sample["doc_hash"] = sample["doc_hash"][:DOC_HASH_DIGITS]
    resps = sample.get("resps")
    # Under the "none" filter lm-eval's filtered_resps is each response list's first element.
    if (
        sample.get("filter") == "none"
        and isinstance(resps, list)
        and sample.get("filtered_resps") == [r[0] for r in resps]
    ):
        sample.pop("filtered_resps")
    return sample


class SharedStore:
    """``shared.json.gz`` of a packed folder: ``{"environments": {id: text}, "configs": {id: config}}``."""

    def __init__(self, root: Path) -> None:
        self.path = root / SHARED_FILE
        self.entries: dict[str, dict[str, Any]] = {"environments": {}, "configs": {}}
        if self.path.is_file():
            self.entries.update(_json(self.path, _text(self.path)))
        self.saved = json.dumps(self.entries, sort_keys=True)

    def reference(self, kind: str, value: Any, folder: Path) -> str:
        """Store ``value`` once under ``kind``; the text that names it from a file in ``folder``."""
        text = value if isinstance(value, str) else json.dumps(value, sort_keys=True, ensure_ascii=False)
        key = hashlib.sha256(text.encode()).hexdigest()[:12]
        self.entries[kind].setdefault(key, value)
        return f"{PACKED}{os.path.relpath(self.path, folder)}#{kind}/{key}"

    def resolve(self, reference: str, folder: Path) -> Any:
        """The value a field packed by :meth:`reference` names (``folder``: the naming file's)."""
        file, _, entry = reference[len(PACKED) :].partition("#")
        kind, _, key = entry.partition("/")
        if (folder / file).resolve() != self.path.resolve() or key not in self.entries.get(kind, {}):
            raise BoschError(f"{folder}: {reference!r} names no entry of {self.path}")
        return self.entries[kind][key]

    def save(self) -> bool:
        """Write the store if it changed; whether it did."""
        if json.dumps(self.entries, sort_keys=True) == self.saved:
            return False
        self.path.write_bytes(
            gzip.compress(json.dumps(self.entries, indent=1, sort_keys=True, ensure_ascii=False).encode(), mtime=0)
        )
        return True


def strip_results(results: dict[str, Any], store: SharedStore, folder: Path) -> dict[str, Any]:
    """A ``results_*.json`` of ``folder`` whose environment and task configs are in ``store``."""
    results = dict(results)
    environment = results.get("pretty_env_info")
    if isinstance(environment, str) and not environment.startswith(PACKED):
        results["pretty_env_info"] = store.reference("environments", environment, folder)
    configs = results.get("configs")
    if isinstance(configs, dict):
        results["configs"] = {
            task: config if isinstance(config, str) else store.reference("configs", config, folder)
            for task, config in configs.items()
        }
    return results


def pack(root: str | Path, keep_prompts: bool = False) -> int:
    """Pack every finished lm-eval output below ``root``, a comparison's runs into its archive; the number of
    files written (the archive counts once).

    ``keep_prompts``: for documents no task regenerates (made before it was seeded), whose
    prompt is the only record of what was asked.

    Raises:
        BoschError: ``root`` is not a directory, a file below it is not JSON, or a ``.gz`` is
            not gzip (naming it).
    """
    root = Path(root)
    if not root.is_dir():
        raise BoschError(f"{root}: not a directory (expected a comparison's --out or an lm_eval --output_path)")
    store = SharedStore(root)
    changed = 0
    for path in _finished(root, "samples_*.jsonl"):
        lines = [_json(path, line) for line in _text(path).splitlines() if line.strip()]
        changed += _write_packed(
            path, "".join(json.dumps(strip_sample(s, keep_prompts), ensure_ascii=False) + "\n" for s in lines)
        )
    for path in _finished(root, "results_*.json"):
        results = strip_results(_json(path, _text(path)), store, path.parent)
        # indent 2, as lm-eval writes them, so a packed file reads as the original
        changed += _write_packed(path, json.dumps(results, indent=2, ensure_ascii=False) + "\n")
    changed += store.save()
    changed += archive_runs(root)
    return changed


def _finished(root: Path, pattern: str) -> list[Path]:
    """Files named ``pattern`` (or ``pattern.gz``) below ``root``, but not in a run in progress."""
    found = []
    for path in sorted([*root.rglob(pattern), *root.rglob(pattern + ".gz")]):
        parts = path.relative_to(root).parts
        runs = [index for index, part in enumerate(parts[:-2]) if part == "runs"]
        if ".partial" not in parts and all((root.joinpath(*parts[: index + 2]) / RUN_FILE).is_file() for index in runs):
            found.append(path)
    return found


def _write_packed(path: Path, text: str) -> bool:
    """``text`` gzipped to ``path`` (``.gz`` added), the plain file removed; whether anything changed."""
    packed = path if path.suffix == ".gz" else path.with_name(path.name + ".gz")
    unchanged = packed.is_file() and _text(packed) == text
    if not unchanged:
        packed.write_bytes(gzip.compress(text.encode("utf-8"), mtime=0))  # mtime 0: the same text, the same bytes
    if packed != path:
        path.unlink()
    return not unchanged or packed != path


def _text(path: Path) -> str:
    if path.suffix != ".gz":
        return path.read_text(encoding="utf-8")
    try:
        return gzip.decompress(path.read_bytes()).decode("utf-8")
    except (OSError, EOFError) as err:
        raise BoschError(f"{path}: not a readable gzip file ({err})") from None


def _json(path: Path, text: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as err:
        raise BoschError(f"{path}: not valid JSON ({err})") from None
