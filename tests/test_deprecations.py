"""Our calls into transformers raise no deprecation warning.

pyproject's ``filterwarnings`` turns deprecation warnings attributed to ``bosch_eval`` code
into errors. transformers attributes a deprecated keyword of a model's ``forward`` to torch's
``Module.__call__`` (``stacklevel=2`` from its wrapper), so for the cache argument these
tests run our call sites with such warnings recorded, and a source scan keeps the old name
out of the package.
"""

from __future__ import annotations

import ast
import warnings
from pathlib import Path

import pytest
import torch

from bosch_eval.attention.hybrid_attention import hybridize
from bosch_eval.bench.runner import measure
from bosch_eval.caches.hybrid_cache import HybridCache
from bosch_eval.masks.head_mask import HeadMask
from bosch_eval.model_adapters.compressed_scoring import continuation_logits_through_cache
from bosch_eval.models.random_model import random_model
from bosch_eval.models.transformers_compat import cache_argument

ROOT = Path(__file__).resolve().parent.parent
PACKAGE_DIRS = ("bosch_eval", "model_adapters", "search", "tasks")
OLD_NAMES = {"past_key_values", "cache_params"}
DEPRECATIONS = (DeprecationWarning, PendingDeprecationWarning, FutureWarning)


def deprecations(record: list[warnings.WarningMessage]) -> list[str]:
    return [
        f"{w.category.__name__}: {w.message} ({w.filename}:{w.lineno})"
        for w in record
        if issubclass(w.category, DEPRECATIONS)
    ]


@pytest.fixture
def hybrid_model():
    model = random_model("qwen3", num_layers=2)
    hybridize(model, HeadMask.from_rows([[0, 1, 0, 1], [1, 1, 0, 0]], 8, window=4))
    return model


class TestCacheArgument:
    def test_installed_transformers_takes_the_name_chosen(self, hybrid_model):
        """The oracle: the chosen name is silent, the other one warns (on 5.24+)."""
        ids = torch.randint(0, 300, (1, 6))
        name = cache_argument(hybrid_model)
        with warnings.catch_warnings(record=True) as record:
            warnings.simplefilter("always")
            hybrid_model(input_ids=ids, use_cache=True, **{name: HybridCache.for_model(hybrid_model)})
        assert deprecations(record) == []
        if name == "cache":
            with pytest.warns(FutureWarning, match="past_key_values"):
                hybrid_model(input_ids=ids, use_cache=True, past_key_values=HybridCache.for_model(hybrid_model))

    def test_class_without_cache_parameter_gets_the_old_name(self):
        class OldModel:
            def forward(self, input_ids, past_key_values=None, use_cache=False):
                return input_ids

        assert cache_argument(OldModel()) == "past_key_values"


class TestCallSites:
    def test_bench_prefill_and_decode(self, hybrid_model):
        with warnings.catch_warnings(record=True) as record:
            warnings.simplefilter("always")
            measure(hybrid_model, torch.randint(0, 300, (1, 12)), 2, 5, HybridCache.for_model(hybrid_model))
        assert deprecations(record) == []

    def test_compressed_scoring(self, hybrid_model):
        with warnings.catch_warnings(record=True) as record:
            warnings.simplefilter("always")
            continuation_logits_through_cache(
                hybrid_model, lambda: HybridCache.for_model(hybrid_model), list(range(3, 15)), 3, torch.device("cpu")
            )
        assert deprecations(record) == []

    def test_generate_with_the_adapter_cache_name(self, hybrid_model):
        """What the bosch adapter hands HFLM's generate: the cache under cache_argument."""
        cache = {cache_argument(hybrid_model): HybridCache.for_model(hybrid_model)}
        with warnings.catch_warnings(record=True) as record:
            warnings.simplefilter("always")
            hybrid_model.generate(
                torch.randint(3, 300, (1, 6)), max_new_tokens=3, do_sample=False, pad_token_id=0, **cache
            )
        assert [w for w in deprecations(record) if "past_key_values" in w or "cache_params" in w] == []


def test_package_never_names_the_old_cache_argument():
    """No call keyword or string key ``past_key_values``/``cache_params`` in the package: every
    cache is passed under :func:`cache_argument`'s name."""
    found = []
    for directory in PACKAGE_DIRS:
        for path in sorted((ROOT / directory).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                named = (isinstance(node, ast.keyword) and node.arg in OLD_NAMES) or (
                    isinstance(node, ast.Constant) and node.value in OLD_NAMES and path.name != "transformers_compat.py"
                )
                if named:
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno}" if hasattr(node, "lineno") else str(path))
    assert found == [], f"pass the cache as **{{cache_argument(model): cache}}: {found}"


@pytest.mark.parametrize(
    ("module", "raises"),
    [
        ("bosch_eval.bench.runner", True),
        ("bosch_eval.model_adapters.bosch", True),
        ("lm_eval.models.huggingface", False),
    ],
)
def test_pyproject_makes_our_deprecations_errors(module, raises):
    """The configured filter: a deprecation attributed to our module fails, a third party's warns."""

    def emit():
        warnings.warn_explicit("old API", FutureWarning, f"{module.replace('.', '/')}.py", 1, module=module)

    if raises:
        with pytest.raises(FutureWarning, match="old API"):
            emit()
    else:
        with pytest.warns(FutureWarning, match="old API"):
            emit()
