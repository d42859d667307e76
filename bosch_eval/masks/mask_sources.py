"""Turn the user's choice of mask source (``mask=``, ``ranking=``+``ratio=``,
``layers=``+``ratio=``) into one validated :class:`HeadMask` for a model."""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from bosch_eval.masks.head_mask import HeadMask, HeadRanking, ModelShape, check_ratio, check_sinks
from bosch_eval.masks.layer_heuristics import LAYER_HEURISTICS, layer_heuristic_mask
from bosch_eval.masks.window import resolve_window
from bosch_eval.runtime.errors import MaskError


@dataclass(frozen=True)
class MaskRequest:
    """The mask a user asked for, as given: one source (``mask``, ``ranking`` or ``layers``),
    ``ratio`` and ``seed`` where that source takes them, and overrides of the window (W) and
    the attention sinks (S). The values arrive from command lines and files as well as from
    :class:`~bosch_eval.model_adapters.settings.AdapterSettings`, so :func:`resolve_mask`
    checks them and their combination."""

    mask: str | Path | HeadMask | None = None
    ranking: str | Path | HeadRanking | None = None
    layers: str | None = None
    ratio: Any = None
    seed: Any = None
    window: Any = None
    sinks: Any = None


def resolve_mask(
    shape: ModelShape, request: MaskRequest, *, default_window: int | None = None, model_name: str | None = None
) -> tuple[HeadMask, str]:
    """Build the mask ``request`` asks for and check it fits ``shape``.

    Exactly one of ``mask``, ``ranking`` or ``layers`` must be given; ``ratio`` goes with
    ``ranking`` and ``layers`` only, ``seed`` with ``layers=rand`` only. ``window``
    overrides the window the mask or ranking carries, ``default_window`` (the model's
    ``bosch_defaults.json``) applies where neither names one (:func:`resolve_window`); ``sinks``
    overrides the mask's attention sinks (S).

    Returns:
        The mask (its ``window`` and ``sinks`` set to the effective W and S) and a name
        for it in messages.

    Raises:
        MaskError: naming the argument or file that is wrong and what was expected.
    """
    mask, ranking, layers, ratio, seed, sinks = (
        request.mask, request.ranking, request.layers, request.ratio, request.seed, request.sinks
    )  # fmt: skip
    given = {
        name: value for name, value in (("mask", mask), ("ranking", ranking), ("layers", layers)) if value is not None
    }
    if len(given) != 1:
        raise MaskError(
            "bosch: expected exactly one mask source — mask=FILE, ranking=FILE with ratio=R, or "
            f"layers={'|'.join(LAYER_HEURISTICS.names())} with ratio=R — got {sorted(given) or 'none'}"
        )
    if mask is not None and ratio is not None:
        raise MaskError("ratio: a mask file fixes its own SWA ratio; ratio= goes with ranking= or layers=")
    if seed is not None and layers != "rand":
        raise MaskError(f"seed: only layers=rand is random; seed={seed!r} would be ignored")
    if sinks is not None:
        sinks = check_sinks(sinks, "sink")

    if isinstance(mask, str) and mask == "full":  # no head mask: the original attention everywhere
        window = resolve_window(request.window, default=default_window, all_full=True, source="mask=full")
        source, result = "mask=full", HeadMask.uniform(shape, full=True, window=window, method="full")
    elif mask is not None:
        source = str(mask) if not isinstance(mask, HeadMask) else "mask"
        result = mask if isinstance(mask, HeadMask) else HeadMask.load(mask)
    else:
        if ratio is None:
            raise MaskError(f"ratio: {next(iter(given))}= needs ratio=R, the share of KV groups to turn into SWA")
        ratio = check_ratio(ratio, "ratio")
        if ranking is not None:
            source = str(ranking) if not isinstance(ranking, HeadRanking) else "ranking"
            loaded = ranking if isinstance(ranking, HeadRanking) else HeadRanking.load(ranking)
            loaded.shape.check_matches(shape, source, model_name)
            result = loaded.to_mask(ratio)
        else:
            source = f"layers={layers}"
            result = layer_heuristic_mask(str(layers), shape, ratio, seed=0 if seed is None else int(seed))
    result.check_fits(shape, source=source, model=model_name)
    effective_window = resolve_window(request.window, carried=result.window, default=default_window, source=source)
    return result.with_meta(window=effective_window, sinks=result.sinks if sinks is None else sinks), source


def mask_for_model(
    shape: ModelShape,
    request: MaskRequest,
    default_window: int | None,
    saved: HeadMask | None,
    model_name: str | None,
) -> tuple[HeadMask, str]:
    """:func:`resolve_mask` for a model that may have saved a mask in its config (a hybrid
    checkpoint): with no mask source asked for, the saved one; with one, it must equal it.

    Raises:
        MaskError: as :func:`resolve_mask`, or an asked mask that differs from the saved one.
    """
    if saved is not None and (request.mask, request.ranking, request.layers) == (None, None, None):
        request = replace(request, mask=saved)
    head_mask, source = resolve_mask(shape, request, default_window=default_window, model_name=model_name)
    if saved is not None and (head_mask.bits, head_mask.window) != (saved.bits, saved.window):
        raise MaskError(
            f"{source}: differs from the mask saved in {model_name}/config.json "
            f"(SWA ratio {head_mask.swa_ratio:.4g}, window {head_mask.window} vs saved "
            f"{saved.swa_ratio:.4g}, window {saved.window}); drop the explicit mask to use the saved one"
        )
    return head_mask, source
