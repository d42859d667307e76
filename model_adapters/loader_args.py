"""The one parser of ``--model bosch`` model_args: ``lm_eval --model_args``, ``bosch-eval compare``
entries and ``bosch-eval search``/``rank --model-args`` all go through it.

A key is valid when the adapter takes it (a field of :class:`AdapterSettings`) or lm-eval's
``HFLM`` does (a parameter of its ``__init__``, read from the installed lm-eval, or one of the
few ``from_pretrained`` arguments HFLM forwards through ``**kwargs``). Anything else is
refused before a model loads, naming the key, the nearest valid key and the valid ones:
HFLM would pass it on to ``from_pretrained``, and transformers fails inside the model's
constructor after the weights were read.

``search`` and ``rank`` add one rule (:func:`parse_model_args`): arguments that the command
sets itself are refused, naming the flag to use instead: one setting, one place.
"""

from __future__ import annotations

import difflib
import functools
import inspect
from collections.abc import Mapping
from typing import Any

from bosch_eval.model_adapters.settings import AdapterSettings
from bosch_eval.runtime.errors import SettingsError

# Set by the search from its own flags, or by the search itself (a mask per call).
RESERVED = {
    "pretrained": "--model",
    "device": "--device",
    "batch_size": "--batch-size",
    "dtype": "--dtype",
    "window": "--window",
    "max_length": "--calib-len with --ignore-max-positions",
    "mask": "the search (it sets a mask per call)",
    "ranking": "the search (it sets a mask per call)",
    "layers": "the search (it sets a mask per call)",
    "ratio": "--ratio",
    "seed": "--seed",
    "memoize_tokens": "the search (always on)",
    "progress_bars": "the search (always off)",
    "kv_cache": "the search (scores prefill only)",
    "kv_quant": "a comparison entry (the search scores unquantized attention)",
    "tp_plan": "nothing: tensor parallelism is not supported (use parallelize=True)",
    "prefix_cache_mb": "--prefix-cache-mb",
}
# from_pretrained arguments HFLM forwards through **kwargs that make sense with the adapter.
FROM_PRETRAINED = ("device_map", "low_cpu_mem_usage", "quantization_config")
# Keys HFLM or from_pretrained would take that the adapter cannot honour, and why.
REFUSED = {
    "attn_implementation": "'attn_implementation' is the hybrid attention's; choose its kernel with attn_backend="
}


@functools.cache
def hflm_parameters() -> frozenset[str]:
    """The keyword parameters of the installed lm-eval's ``HFLM.__init__``, plus
    :data:`FROM_PRETRAINED` (read once per process; the adapter's module reads them at import)."""
    from lm_eval.models.huggingface import HFLM  # lazy: lm-eval and torch load only when asked

    parameters = inspect.signature(HFLM.__init__).parameters.values()
    return frozenset({p.name for p in parameters if p.kind is p.POSITIONAL_OR_KEYWORD} - {"self"}) | set(
        FROM_PRETRAINED
    )


def loader_parameters(adapter: bool = True) -> set[str]:
    """Every argument name the ``bosch`` adapter's loader takes (``adapter=False``: HFLM's alone)."""
    return set(hflm_parameters()) | (set(AdapterSettings.names()) if adapter else set())


def check_keys(keys: Any, where: str, adapter: bool = True) -> None:
    """Refuse any key the loader does not take.

    Raises:
        SettingsError: ``where: model_arg 'windw' is not one the bosch adapter takes; did you
            mean 'window'? It takes: a, b, ...`` (``adapter=False``: lm-eval's HFLM): the nearest
            key first, then the keys it could have meant (none the adapter refuses).
    """
    known = loader_parameters(adapter)
    for key in keys:
        if key in REFUSED:
            raise SettingsError(f"{where}: {REFUSED[key]}")
        if key not in known:
            taker = "the bosch adapter" if adapter else "lm-eval's HFLM"
            offered = sorted(
                known - set(REFUSED) - ({"tp_plan"} if adapter else set())
            )  # tp_plan: adapter_settings refuses it
            nearest = difflib.get_close_matches(key, offered, n=1)
            hint = f"; did you mean {nearest[0]!r}?" if nearest else ";"
            raise SettingsError(
                f"{where}: model_arg {key!r} is not one {taker} takes{hint} It takes: {', '.join(offered)}"
            )


def split_model_args(text: str, where: str) -> dict[str, str]:
    """``k=v,k=v`` as lm-eval's ``--model_args`` writes it, values left as strings.

    Raises:
        SettingsError: an item without ``=``, or a key given twice (lm-eval would keep the
            last one silently).
    """
    args: dict[str, str] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise SettingsError(f"{where}: model_arg {item!r} is not key=value")
        key = key.strip()
        if key in args:
            raise SettingsError(f"{where}: model_arg {key!r} is given twice")
        args[key] = value.strip()
    return args


def typed_model_args(args: str | Mapping[str, Any], where: str, adapter: bool = True) -> dict[str, Any]:
    """Keys checked, string values typed as lm-eval's CLI types them (``'8'`` → 8, ``'True'`` →
    True, ``'none'`` → None); the adapter's own values are converted again, explicitly, by
    :class:`AdapterSettings`."""
    from lm_eval.utils import handle_arg_string

    args = split_model_args(args, where) if isinstance(args, str) else dict(args)
    check_keys(args, where, adapter)
    return {key: handle_arg_string(value) if isinstance(value, str) else value for key, value in args.items()}


def adapter_settings(
    model_args: Mapping[str, Any], where: str = "model_args"
) -> tuple[AdapterSettings, dict[str, Any]]:
    """Split ``--model bosch`` keyword arguments into the adapter's settings and HFLM's arguments.

    Raises:
        SettingsError (or MaskError for a ratio, window or sink): an unknown key (named with
            the nearest valid one) or a value that cannot be converted, before anything loads.
    """
    check_keys(model_args, where)
    tp_plan = model_args.get("tp_plan")
    if tp_plan is not None:
        # Under tensor parallelism each rank's attention holds a shard of the heads, but the
        # hybrid attention picks KV groups by their global index: slices past the shard would
        # be silently empty. Refused rather than run wrong.
        raise SettingsError(
            f"tp_plan={tp_plan!r}: tensor parallelism is not supported by --model bosch (the hybrid "
            "attention selects KV groups by global index; a tensor-parallel rank holds only its shard of the "
            "heads); use parallelize=True to spread the layers over GPUs, or several processes for data parallelism"
        )
    ours = set(AdapterSettings.names())
    settings = AdapterSettings(**{key: value for key, value in model_args.items() if key in ours})
    return settings, {key: value for key, value in model_args.items() if key not in ours}


def parse_model_args(text: str | None, flag: str = "--model-args", adapter: bool = True) -> dict[str, Any]:
    """``search``/``rank --model-args``: ``k=v,...`` → keyword arguments for the adapter
    (``adapter=False``: for lm-eval's HFLM), values typed as lm-eval types them.

    Raises:
        SettingsError: a key the loader does not take, or one the command sets itself.
    """
    if not text:
        return {}
    args = split_model_args(text, flag)
    for key in args:
        if key in RESERVED:
            raise SettingsError(f"{flag}: {key!r} is set by {RESERVED[key]}, not here")
    return typed_model_args(args, flag, adapter)
