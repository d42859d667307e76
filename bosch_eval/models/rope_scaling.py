"""RoPE context extension (YaRN) set on a model config the way transformers defines it.

Transformers 5 reads ``config.rope_parameters`` (``rope_type``, ``rope_theta``, ``factor``,
``original_max_position_embeddings``, ...; ``modeling_rope_utils._compute_yarn_parameters``)
when it *builds* a model's rotary embedding, so the scaling must be on the config before
the model is constructed: :func:`scaled_config` loads a checkpoint's config and returns it
scaled, to pass as ``from_pretrained(..., config=...)``.

YaRN with factor F keeps the model's frequencies where a dimension rotates fast enough
(``beta_fast``/``beta_slow`` defaults), interpolates the slow ones by F and scales
attention by ``0.1·ln F + 1``; F = 1 is exactly the unscaled model. The config's
``max_position_embeddings`` becomes ``original × F`` (the extended context), as in
Qwen's and Llama's published YaRN configs.
"""

from __future__ import annotations

from typing import Any

from bosch_eval.runtime.errors import ModelError, SettingsError

ROPE_SCALINGS = ("yarn",)


def check_rope_args(
    scaling: str | None, factor: Any, original_max_positions: Any, names: tuple[str, str, str]
) -> tuple[str | None, float | None, int | None]:
    """Validate the (scaling, factor, original length) triple a user gave.

    ``names`` are how the three arguments are spelled where they came from (CLI flags or
    model_args), for the messages.

    Raises:
        SettingsError: a factor or length without a scaling, an unknown scaling, a factor
            below 1 or a non-positive length.
    """
    scaling_name, factor_name, original_name = names
    if scaling is None:
        given = [
            name
            for name, value in ((factor_name, factor), (original_name, original_max_positions))
            if value is not None
        ]
        if given:
            raise SettingsError(f"{', '.join(given)}: only used with {scaling_name}=yarn, which was not given")
        return None, None, None
    if scaling not in ROPE_SCALINGS:
        raise SettingsError(f"{scaling_name}: expected one of {list(ROPE_SCALINGS)}, got {scaling!r}")
    if factor is None:
        raise SettingsError(f"{factor_name}: {scaling_name}={scaling} needs a factor F >= 1 (context grows F times)")
    try:
        factor = float(factor)
    except (TypeError, ValueError):
        raise SettingsError(f"{factor_name}: expected a number >= 1, got {factor!r}") from None
    if not factor >= 1.0:
        raise SettingsError(f"{factor_name}: expected a number >= 1, got {factor!r}")
    if original_max_positions is not None:
        try:
            original_max_positions = int(original_max_positions)
        except (TypeError, ValueError):
            raise SettingsError(
                f"{original_name}: expected a positive integer, got {original_max_positions!r}"
            ) from None
        if original_max_positions < 1:
            raise SettingsError(f"{original_name}: expected a positive integer, got {original_max_positions!r}")
    return scaling, factor, original_max_positions


def apply_yarn(config: Any, factor: float, original_max_positions: int | None = None, source: str = "config") -> None:
    """Set YaRN with ``factor`` on ``config`` in place (before the model is built).

    Args:
        config: a transformers config with flat ``rope_parameters`` (Qwen2/3, Llama, Mistral...).
        factor: F >= 1; the extended context is ``original_max_positions × F``.
        original_max_positions: the context the model was trained for; default the config's
            ``original_max_position_embeddings`` if it has one, else ``max_position_embeddings``.
        source: how to name the config in messages.

    Raises:
        ModelError: the config has no RoPE parameters, per-layer-type ones, or is already scaled.
    """
    config.standardize_rope_params()  # moves a legacy rope_theta / rope_scaling into rope_parameters
    rope = getattr(config, "rope_parameters", None)
    if not rope or "rope_theta" not in rope:
        raise ModelError(f"{source}: field 'rope_parameters' has no 'rope_theta'; this model does not use RoPE")
    if config.nested_rope_parameter_keys(rope):
        raise ModelError(
            f"{source}: field 'rope_parameters' is set per layer type ({sorted(rope)}); YaRN here supports one flat RoPE"
        )
    if rope.get("rope_type", "default") != "default":
        raise ModelError(
            f"{source}: field 'rope_parameters' already has rope_type={rope['rope_type']!r} "
            f"(factor {rope.get('factor')}); expected 'default' (an unscaled model) to apply YaRN to"
        )
    original = original_max_positions or rope.get("original_max_position_embeddings") or config.max_position_embeddings
    keep = {key: rope[key] for key in ("rope_theta", "partial_rotary_factor") if key in rope}
    config.rope_parameters = {
        **keep,
        "rope_type": "yarn",
        "factor": float(factor),
        "original_max_position_embeddings": int(original),
    }
    config.max_position_embeddings = int(round(original * factor))
    config.validate_rope()


def scaled_config(
    pretrained: str, factor: float, original_max_positions: int | None = None, **from_pretrained: Any
) -> Any:
    """The config of checkpoint ``pretrained`` with YaRN applied (see :func:`apply_yarn`)."""
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(pretrained, **from_pretrained)
    apply_yarn(config, factor, original_max_positions, source=f"{pretrained}/config.json")
    return config


def yarn_loader_config(
    pretrained: Any, factor: float, original_max_positions: int | None, loader_args: dict[str, Any]
) -> Any:
    """The YaRN-scaled config to hand ``from_pretrained`` (the rotary embedding is built from the
    config as the model is constructed), for a model named by ``pretrained`` and loaded with
    ``loader_args`` (its revision, trust_remote_code).

    Raises:
        SettingsError: a model already loaded (its rotary embedding is built), or an explicit config=.
    """
    if not isinstance(pretrained, str):
        raise SettingsError(
            "rope_scaling: needs pretrained= as a name or path (a loaded model's rotary embedding is already built)"
        )
    if "config" in loader_args:
        raise SettingsError("rope_scaling: cannot be combined with an explicit config=")
    return scaled_config(
        pretrained,
        factor,
        original_max_positions,
        revision=loader_args.get("revision", "main"),
        trust_remote_code=bool(loader_args.get("trust_remote_code", False)),
    )
