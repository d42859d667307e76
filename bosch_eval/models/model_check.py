"""Checks on the model a user names, done from its name and config before any weight loads.

* :func:`resolve_model`: the one model resolver of every command (``toy`` / ``toy-l`` → the
  bundled model's directory, :data:`BUNDLED_MODELS`; ``smollm2`` or a ``.gguf`` file → its
  converted checkpoint in the cache, :mod:`bosch_eval.models.gguf_models`; anything else checked
  to exist).
* :func:`check_model_exists`: a local checkpoint directory, or a Hugging Face hub id that
  resolves (offline mode respected: with ``HF_HUB_OFFLINE=1`` only the local cache is
  searched). Without it a typo surfaced as a missing ``--window`` or a transformers
  traceback about repo ids.
* :func:`max_positions` / :func:`check_length`: a prompt longer than the model's
  ``max_position_embeddings`` is scored after left truncation or past the positions the
  model was trained on, and silently scores ~0. Such a length is an error naming the
  length, the model and its maximum, unless the user says the config understates the
  context (rope scaling): ``--ignore-max-positions`` / ``ignore_max_positions``.
* :func:`check_causal_decoder`: an encoder (BERT, RoBERTa, ...) or encoder-decoder is refused
  for what it is, before its weights load; transformers would otherwise load BERT as a
  ``BertLMHeadModel`` and the hybrid attention would fail on its attention modules.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path
from typing import Any

from bosch_eval.models.gguf_models import PACKAGED_GGUF, is_gguf_path, resolve_gguf
from bosch_eval.runtime.errors import ModelError

IGNORE_FLAG = "--ignore-max-positions"
IGNORE_METADATA = "ignore_max_positions"

TOY_DIR = Path(__file__).resolve().parents[1] / "toy"  # bosch_eval/toy/, beside this models/ folder

# The bundled toy models (bosch_eval/toy/, trained by bosch_eval.toy.train): alias -> checkpoint
# directory. "toy" has 4 layers x 4 KV groups (16 head-selection variables, small enough to
# enumerate); "toy-l" has 8 x 8 (64 variables), where the search space is too large to guess.
BUNDLED_MODELS: dict[str, Path] = {"toy": TOY_DIR / "model", "toy-l": TOY_DIR / "model_l"}


def model_path(name: str = "toy") -> Path:
    """Directory of a bundled checkpoint (``"toy"`` or ``"toy-l"``), loadable with ``from_pretrained``.

    Raises:
        KeyError: ``name`` is not a bundled model.
        FileNotFoundError: when the package was installed without its weights.
    """
    if name not in BUNDLED_MODELS:
        raise KeyError(f"{name!r} is not a bundled model; expected one of {sorted(BUNDLED_MODELS)}")
    directory = BUNDLED_MODELS[name]
    if not (directory / "model.safetensors").is_file():
        raise FileNotFoundError(f"{directory}: the bundled model {name!r}'s weights (model.safetensors) are missing")
    return directory


def model_aliases() -> list[str]:
    """Every short model name a command accepts: the bundled toys and the packaged GGUFs."""
    return sorted([*BUNDLED_MODELS, *PACKAGED_GGUF])


def names_a_local_model(name: str) -> bool:
    """Whether :func:`resolve_model` turns ``name`` into another directory (an alias or a
    ``.gguf`` file), rather than passing it on."""
    return name in model_aliases() or is_gguf_path(name)


def resolve_model(name: str, check: bool = True) -> str:
    """The one model resolver of every command: ``"toy"`` or ``"toy-l"`` (short for
    ``pretrained=$(bosch-eval toy-model --path [--name toy-l])``) → the bundled model's
    directory; ``"smollm2"`` or a ``.gguf`` file → its checkpoint converted once into the
    cache (:func:`bosch_eval.models.gguf_models.resolve_gguf`); any other id or path is returned
    unchanged, after checking (``check``) that it is a checkpoint directory or a hub id that
    resolves.

    Raises:
        ModelError: the model does not exist (or the bundled weights are missing, or the
            package that ships a GGUF is not installed).
    """
    if name in BUNDLED_MODELS:
        try:
            return str(model_path(name))
        except FileNotFoundError as err:
            raise ModelError(f"model {name!r}: {err}") from None
    if not names_a_local_model(name):
        return check_model_exists(name) if check else name
    return str(resolve_gguf(name))


def _looks_like_a_path(name: str) -> bool:
    # Hub ids are "name" or "org/name"; anything else can only be a (missing) local path.
    return name.startswith(("/", "./", "../", "~")) or name.count("/") > 1 or (os.sep != "/" and os.sep in name)


@functools.cache
def check_model_exists(name: str) -> str:
    """``name`` if it is a checkpoint directory or a reachable hub id (cached per name).

    Raises:
        ModelError: naming the model and what was looked for.
    """
    path = Path(name).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise ModelError(
                f"model {name!r}: the directory has no config.json; expected a Hugging Face checkpoint directory"
            )
        return name
    if path.exists():
        raise ModelError(f"model {name!r}: is a file; expected a checkpoint directory or a Hugging Face hub id")
    if _looks_like_a_path(name):
        raise ModelError(f"model {name!r}: no such directory (and not a Hugging Face hub id)")
    from huggingface_hub import constants
    from transformers.utils import cached_file

    offline = constants.HF_HUB_OFFLINE
    try:
        cached_file(name, "config.json", local_files_only=offline)
    except (OSError, ValueError) as err:
        where = "the local Hugging Face cache (HF_HUB_OFFLINE=1)" if offline else "the Hugging Face hub"
        first_line = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise ModelError(
            f"model {name!r}: not a local directory, and no config.json for it in {where} ({first_line})"
        ) from None
    return name


@functools.cache
def model_config(name: str, trust_remote_code: bool = False) -> Any:
    """The transformers config of an existing model (no weights), cached per name.

    ``trust_remote_code``: as for ``from_pretrained`` (a model whose config class ships
    with the checkpoint).
    """
    from transformers import AutoConfig

    check_model_exists(name)
    try:
        return AutoConfig.from_pretrained(name, trust_remote_code=trust_remote_code)
    except (OSError, ValueError, KeyError) as err:
        raise ModelError(f"model {name!r}: cannot read its config ({err})") from None


def max_positions(config: Any) -> int | None:
    """The longest sequence the config declares (``max_position_embeddings``; GPT-2's
    ``n_positions`` maps onto it), or None when it declares none."""
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    value = getattr(text, "max_position_embeddings", None)
    return int(value) if isinstance(value, int) and value > 0 else None


def check_length(length: int, model: str, config: Any, what: str, how_to_override: str) -> None:
    """Raise a ModelError if ``length`` tokens exceed what ``model`` declares it can hold.

    Args:
        length: the sequence length asked for.
        model: the model's name as the user gave it (for the message).
        config: its transformers config.
        what: what asked for the length (e.g. ``--calib-len``).
        how_to_override: the flag or key that skips this check, named in the message.
    """
    limit = max_positions(config)
    if limit is not None and length > limit:
        raise ModelError(
            f"{what} {length}: longer than model {model!r} can hold (max_position_embeddings = {limit}); "
            f"use a length <= {limit}, or pass {how_to_override} if its config understates its context "
            "(e.g. rope scaling)"
        )


def check_causal_decoder(config: Any, model: str) -> None:
    """Raise a ModelError unless ``config`` describes a causal decoder-only model.

    An encoder-decoder says so in its config (``is_encoder_decoder``). An encoder is a model
    type with a masked-LM head in transformers' registry whose config does not set
    ``is_decoder`` (BERT and its kin also register a ``*ForCausalLM`` class, but without
    ``is_decoder`` it attends both ways).
    """
    from transformers.models.auto.modeling_auto import MODEL_FOR_MASKED_LM_MAPPING_NAMES

    model_type = getattr(config, "model_type", None)
    if getattr(config, "is_encoder_decoder", False):
        kind = "an encoder-decoder model"
    elif model_type in MODEL_FOR_MASKED_LM_MAPPING_NAMES and not getattr(config, "is_decoder", False):
        kind = "an encoder (bidirectional attention, trained to fill in masked tokens)"
    else:
        return
    raise ModelError(
        f"model {model!r}: model_type {model_type!r} is {kind}, not a causal decoder; the hybrid attention "
        "turns heads of a decoder-only causal LM (Llama, Qwen, Mistral, GPT-2, ...) into sliding-window attention"
    )


def truthy(value: Any, name: str) -> bool:
    """A boolean setting that may arrive as a bool or as a string ('true'/'false')."""
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.lower() in ("true", "false"):
        return value.lower() == "true"
    raise ModelError(f"{name}: expected true or false, got {value!r}")
