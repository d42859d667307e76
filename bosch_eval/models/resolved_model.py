"""A model as the user named it, resolved once: where it lies, its config, its defaults and
what a hybrid checkpoint saved (mask, KV quantization).

Every entry point (the adapter, the search, calib-check, export, bench, compare) used to
resolve the name, read the config, then read it again for the saved mask, again for the KV
quantization, again for the defaults. They take one :class:`ResolvedModel` instead, made
before any weight loads, so a missing model, a bad ``bosch_defaults.json`` or a bad saved
mask fails first, once, named.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from bosch_eval.caches.kv_quant.config import KVQuantConfig
from bosch_eval.masks.head_mask import HeadMask, ModelShape
from bosch_eval.models.checkpoint import saved_kv_quant, saved_mask
from bosch_eval.models.model_check import check_causal_decoder, model_config, resolve_model
from bosch_eval.models.model_defaults import ModelDefaults, model_defaults


@dataclass(frozen=True)
class ResolvedModel:
    """One model, resolved.

    Attributes:
        name: as the user gave it (a Hugging Face id, a directory, or an alias: ``toy``,
            ``smollm2``); None for a preloaded model that names no source.
        path: what ``from_pretrained`` loads (the alias's directory; the id itself otherwise).
        config: its ``transformers`` config.
        defaults: its ``bosch_defaults.json`` (none for hub ids and plain checkpoints).
        saved_mask: the head mask a hybrid checkpoint saved in its config, else None.
        saved_kv_quant: the KV quantization a hybrid checkpoint saved, else None.
        shape: L×H×G, the shape every mask of this model has.
        head_dim: the width of one attention head (what KV quantization groups).
    """

    name: str | None
    path: str | None
    config: Any
    defaults: ModelDefaults
    saved_mask: HeadMask | None
    saved_kv_quant: KVQuantConfig | None
    shape: ModelShape
    head_dim: int

    @classmethod
    def named(cls, name: str, trust_remote_code: bool = False) -> ResolvedModel:
        """The model ``name`` stands for, from its files alone (no weights are read): a causal
        decoder, the only kind whose heads every command here turns into SWA.

        Raises:
            ModelError: no such model, or not a causal decoder; MaskError / SettingsError: a
                bad saved mask or defaults file.
        """
        path = resolve_model(name)
        config = model_config(path, trust_remote_code=trust_remote_code)
        check_causal_decoder(config, path)
        return cls.of_config(name, path, config)

    @classmethod
    def loaded(cls, model: Any) -> ResolvedModel:
        """A model already in memory: its own config (and the defaults of the directory it was
        loaded from, where that is a directory)."""
        path = getattr(model.config, "_name_or_path", None) or None
        return cls.of_config(path, path, model.config)

    @classmethod
    def of_config(cls, name: str | None, path: str | None, config: Any) -> ResolvedModel:
        source = f"{path}/config.json"
        defaults = model_defaults(path) if path else ModelDefaults()
        saved = saved_mask(config, source), saved_kv_quant(config, source)
        return cls(name, path, config, defaults, *saved, ModelShape.from_config(config), ModelShape.head_dim_of(config))

    @property
    def config_file(self) -> str:
        """Where the config was read, for messages."""
        return f"{self.path}/config.json"
