"""What a model or a file *is*, pinned so that a journal or a comparison resumes from any clone.

A path names a place on one machine: a committed search that pinned
``/work/wt/search/bosch_eval/toy/model`` could not be resumed from another checkout. So the
search journal and ``compare``'s ``run.json`` pin identities instead:

* a local checkpoint directory: the SHA-256 of every file in it except Markdown (a model
  card does not change a score; weights, config, tokenizer and ``bosch_defaults.json``, which
  sets the default window, do), by file name, never by the directory's path; a bundled
  model is also named by its alias (``toy``), and so is a packaged GGUF's converted
  checkpoint (``smollm2``), whose record of the file it came from (a path on the machine
  that converted it) is not read at load either. ``config.json`` and
  ``generation_config.json`` carry the version of transformers that wrote them: a checkpoint
  converted again by another release differs there alone, so those files are also pinned
  without it (``unstamped``), and :func:`same_model` takes two pins that differ only in the
  stamp for the same model (a converted cache on a machine with a newer transformers refused
  every resume before);
* a hub id: the commit of the cached snapshot it loads (the cache stores one snapshot per
  commit; hashing a multi-GB download again on every start would cost more than the check
  is worth). A model not cached yet has no commit;
* a file (a mask, a ranking): its SHA-256.

:func:`portable_name` turns a path of a bundled model's directory, in this checkout or
in any other (``.../bosch_eval/toy/model``), or of a packaged GGUF's converted checkpoint in
any cache (``.../models/smollm2-<hash>``), into its alias: how journals written before this
pinning are read.
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path
from typing import Any

from bosch_eval.models.gguf_models import PACKAGED_GGUF, SOURCE_FILE, packaged_alias
from bosch_eval.models.model_check import BUNDLED_MODELS
from bosch_eval.runtime.digests import file_digest

NOT_READ_AT_LOAD = (".md",)  # model cards
VERSION_STAMPED = ("config.json", "generation_config.json")  # save_pretrained writes its transformers_version in
_STAMP = re.compile(rb'"transformers_version": "[^"]*"')
NOT_READ_AT_LOAD_NAMES = (SOURCE_FILE,)  # a converted GGUF's record of its source file
_PACKAGE_ROOT = Path(__file__).resolve().parents[2]  # the folder holding bosch_eval/ (this is bosch_eval/models/)


def portable_name(value: str) -> str:
    """The alias of a bundled model for its directory's path (this checkout's, or any path
    ending in the same ``bosch_eval/<...>`` folders), or of a packaged GGUF for its converted
    checkpoint's (:func:`bosch_eval.models.gguf_models.packaged_alias`); anything else unchanged."""
    for alias, directory in BUNDLED_MODELS.items():
        if value == str(directory):
            return alias
        try:
            tail = directory.relative_to(_PACKAGE_ROOT).parts  # ("bosch_eval", "toy", "model")
        except ValueError:  # a bundled model kept outside the package (a converted cache)
            continue
        parts = Path(value).parts
        if value.startswith("/") and len(parts) > len(tail) and parts[-len(tail) :] == tail:
            return alias
    if value.startswith("/") and (packaged := packaged_alias(value)) is not None:
        return packaged
    return value


def model_identity(path: str, revision: str | None = None) -> dict[str, Any]:
    """The identity of a resolved model (a checkpoint directory or a hub id), as described above."""
    directory = Path(path).expanduser()
    if directory.is_dir():
        files = sorted(
            p
            for p in directory.rglob("*")
            if p.is_file()
            and p.suffix not in NOT_READ_AT_LOAD
            and p.name not in NOT_READ_AT_LOAD_NAMES
            and not _hidden(p, directory)
        )
        identity: dict[str, Any] = {"files": {str(p.relative_to(directory)): file_digest(p) for p in files}}
        stamped = {
            name: _unstamped_digest(directory / name) for name in VERSION_STAMPED if (directory / name).is_file()
        }
        if stamped:
            identity["unstamped"] = stamped
        alias = portable_name(str(directory.resolve()))
        if alias in BUNDLED_MODELS or alias in PACKAGED_GGUF:
            identity = {"bundled": alias, **identity}
        return identity
    from huggingface_hub import try_to_load_from_cache

    # .../snapshots/<commit>/config.json; None when not cached yet (the load downloads it).
    cached = try_to_load_from_cache(path, "config.json", revision=revision)
    commit = Path(cached).parent.name if isinstance(cached, str) else None
    return {"hub": path, "revision": revision, "commit": commit}


def same_model(saved: dict[str, Any] | None, current: dict[str, Any]) -> bool:
    """Whether a pinned identity and today's name the same model: the same files (a bundled
    alias, absent from pins made before aliases were, adds nothing), where a version-stamped
    file may differ in its stamp alone when both pins have its unstamped digest; a hub model:
    the same snapshot."""
    saved = saved or {}
    if "files" not in saved or "files" not in current:
        return saved == current
    before, now = saved["files"], current["files"]
    if before.keys() != now.keys():
        return False
    unstamped_before, unstamped_now = saved.get("unstamped", {}), current.get("unstamped", {})
    return all(
        before[name] == now[name] or (name in unstamped_before and unstamped_before[name] == unstamped_now.get(name))
        for name in before
    )


def _unstamped_digest(path: Path) -> str:
    """The SHA-256 of a JSON file transformers wrote, with its ``transformers_version`` blanked."""
    return hashlib.sha256(_STAMP.sub(b'"transformers_version": ""', path.read_bytes())).hexdigest()


def _hidden(path: Path, root: Path) -> bool:
    """Dotfiles and dot-directories (``.cache``, lock files) are not part of a checkpoint."""
    return any(part.startswith(".") for part in path.relative_to(root).parts)
