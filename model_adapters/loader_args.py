"""``--model-args`` of ``bosch-eval search`` and ``rank``: more arguments for the model loader,
written and parsed like ``lm_eval --model_args`` (``revision=abc,trust_remote_code=True,parallelize=True``).

They go to the ``bosch`` adapter (lm-eval's ``HFLM`` underneath; ``rank`` loads with ``HFLM``
itself, since its rankers read plain attention), so a model that needs
several GPUs per replica (``parallelize=True``), a revision, remote code or a PEFT adapter
can be searched. Arguments that the command sets itself are refused, naming the flag to use
instead: one setting, one place.
"""

from __future__ import annotations

import inspect
from typing import Any

from bosch_eval.errors import SettingsError

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
# from_pretrained arguments HFLM forwards through **kwargs that make sense for a search.
FROM_PRETRAINED = ("device_map", "low_cpu_mem_usage", "quantization_config")


def loader_parameters(adapter: bool = True) -> set[str]:
    """Every argument name the ``bosch`` adapter's loader takes (``adapter=False``: HFLM's alone)."""
    from lm_eval.models.huggingface import HFLM

    from bosch_eval.model_adapters.bosch import BoschLM  # lazy: torch and lm-eval load only when asked

    names = set()
    for cls in (BoschLM, HFLM) if adapter else (HFLM,):
        names |= {p.name for p in inspect.signature(cls.__init__).parameters.values() if p.kind is p.POSITIONAL_OR_KEYWORD}
    return (names | set(FROM_PRETRAINED)) - {"self"}


def parse_model_args(text: str | None, flag: str = "--model-args", adapter: bool = True) -> dict[str, Any]:
    """``k=v,...`` → keyword arguments for the adapter (``adapter=False``: for lm-eval's HFLM),
    values typed as lm-eval types them.

    Raises:
        SettingsError: a key the loader does not take, or one the command sets itself.
    """
    if not text:
        return {}
    from lm_eval.utils import simple_parse_args_string

    try:
        args = simple_parse_args_string(text)
    except ValueError as err:
        raise SettingsError(f"{flag}: expected k=v,k=v (as lm_eval --model_args), got {text!r} ({err})") from None
    known = loader_parameters(adapter)
    for key in args:
        if key in RESERVED:
            raise SettingsError(f"{flag}: {key!r} is set by {RESERVED[key]}, not here")
        if key == "attn_implementation":
            raise SettingsError(f"{flag}: 'attn_implementation' is the hybrid attention's; choose its kernel with attn_backend=")
        if key not in known:
            raise SettingsError(f"{flag}: the model loader takes no argument {key!r}; expected some of {sorted(known - set(RESERVED))}")
    return args
