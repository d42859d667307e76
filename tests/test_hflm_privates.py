"""lm-eval internals the ``bosch`` adapter relies on: an upgrade that drops or renames one fails
here, naming it, instead of far away or silently (``lm._rank = r`` after a rename shards nothing).

The bosch adapter copies HFLM's loglikelihood loop (``model_adapters/scoring.py`` says why no hook will do),
so the lm-eval pieces that loop calls are listed too. All of them hold in lm-eval 0.4.13 and
0.5.0.dev1.
"""

from __future__ import annotations

import importlib
import inspect
from typing import Any

import lm_eval
import pytest
from lm_eval.models.huggingface import HFLM

# "module:attribute path" -> the parameters we pass or override with, by name.
CALLABLES = {
    "lm_eval.models.huggingface:HFLM._loglikelihood_tokens": ("requests", "disable_tqdm", "override_bs"),  # overridden
    "lm_eval.models.huggingface:HFLM._batch_scheduler": ("pos", "n_reordered_requests"),  # given to Collator
    "lm_eval.models.huggingface:HFLM._model_generate": (
        "context",
        "max_length",
        "stop",
    ),  # overridden: the hybrid cache
    "lm_eval.models.huggingface:HFLM.tok_encode": (
        "string",
        "add_special_tokens",
        "left_truncate_len",
    ),  # memoize_tokens
    "lm_eval.models.huggingface:HFLM._encode_pair": ("context", "continuation"),  # benchmarks/objective_overhead.py
    "lm_eval.models.utils:Collator": ("arr", "sort_fn", "group_fn", "group_by"),
    "lm_eval.models.utils:Collator.get_batched": ("n", "batch_fn"),
    "lm_eval.models.utils:Collator.get_cache": ("req_str", "cxt_toks", "cont_toks", "logits"),
    "lm_eval.models.utils:Collator.get_original": (),
    "lm_eval.models.utils:Collator.__len__": (),
    "lm_eval.models.utils:normalize_gen_kwargs": ("gen_kwargs", "default_max_gen_toks"),
    "lm_eval.models.utils_hf:pad_and_concat": ("max_length", "tensors", "padding_side"),
    "lm_eval.api.model:CacheHook.add_partial": ("attr", "req", "res"),
    # tasks/niah/calibration_sets.py reads the task YAMLs as lm-eval reads them
    "lm_eval.tasks._yaml_loader:load_yaml": ("path", "resolve_func"),
    "lm_eval.tasks._yaml_loader:_import_func_in_yml": ("qual", "base_dir"),
}
# Set by HFLM.__init__, read or written by the adapter (bosch_eval/runtime/launch.py writes _rank, _world_size).
ATTRIBUTES = (
    "_rank",
    "_world_size",
    "_max_length",
    "batch_sizes",
    "logits_cache",
    "softmax_dtype",
    "mixed_precision_dtype",
    "backend",
    "cache_hook",
)


def resolve(path: str) -> Any:
    module, _, names = path.partition(":")
    obj = importlib.import_module(module)
    for name in names.split("."):
        if not hasattr(obj, name):
            pytest.fail(
                f"lm-eval {lm_eval.__version__}: {path} is gone (no {name!r} on {obj!r}); the bosch adapter uses it"
            )
        obj = getattr(obj, name)
    return obj


@pytest.mark.parametrize(("path", "parameters"), CALLABLES.items(), ids=list(CALLABLES))
def test_callable_takes_our_arguments(path, parameters):
    taken = inspect.signature(resolve(path)).parameters
    missing = [name for name in parameters if name not in taken]
    assert not missing, (
        f"lm-eval {lm_eval.__version__}: {path} no longer takes {missing} (takes {list(taken)}); the bosch adapter passes them"
    )


def test_hflm_sets_the_attributes_we_use(tiny_model_dir):
    lm = HFLM(pretrained=str(tiny_model_dir), device="cpu", max_length=16)
    missing = [name for name in ATTRIBUTES if not hasattr(lm, name)]
    assert not missing, (
        f"lm-eval {lm_eval.__version__}: HFLM no longer sets {missing}; the bosch adapter reads or writes them"
    )
    assert lm._max_length == 16, (
        "HFLM no longer keeps max_length= in _max_length (BoschLM._check_fits names the limit's source)"
    )
    lm._rank, lm._world_size = 2, 3
    assert (lm.rank, lm.world_size) == (2, 3), (
        "HFLM.rank/world_size no longer read _rank/_world_size: bosch_eval.runtime.launch's sharding would do nothing"
    )
