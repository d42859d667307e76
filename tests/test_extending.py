"""docs/extending.md: each family's example, dropped as a new file into its package, is found by
its registry and runs where users name it; the file goes again afterwards. (The ranker's
example is tests/test_rankers.py's ``test_a_new_ranker_is_one_new_file``.)"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest
import torch
from transformers import AutoTokenizer

from bosch_eval.attention import kernels
from bosch_eval.attention.hybrid_attention import hybridize
from bosch_eval.attention.hybrid_spec import backend_names
from bosch_eval.attention.kernels import BACKENDS
from bosch_eval.attention.kernels.reference import masked_swa_attention
from bosch_eval.attention.local_window import LocalWindow
from bosch_eval.bench.cli import add_bench_parser
from bosch_eval.caches.kv_quant import methods
from bosch_eval.caches.kv_quant.config import KVQuantConfig
from bosch_eval.caches.kv_quant.methods import KV_QUANT_METHODS
from bosch_eval.caches.kv_quant.selection import Selector
from bosch_eval.masks import layer_heuristics
from bosch_eval.masks.head_mask import HeadMask, HeadRanking, ModelShape
from bosch_eval.masks.layer_heuristics import LAYER_HEURISTICS, layer_heuristic_mask
from bosch_eval.masks.mask_sources import MaskRequest, resolve_mask
from bosch_eval.model_adapters.bosch import BoschLM
from bosch_eval.models.random_model import random_model
from bosch_eval.runtime.errors import MaskError
from bosch_eval.runtime.registry import Registry
from bosch_eval.search import importers, variants
from bosch_eval.search.cli.importing import add_import_parser
from bosch_eval.search.guard.incumbents import incumbent_masks
from bosch_eval.search.importers import IMPORTERS, import_pattern
from bosch_eval.search.run.pipeline import VARIANTS, SearchSettings, run_search
from bosch_eval.search.stages import optimizers
from bosch_eval.search.stages.subproblems import expected_evaluations
from bosch_eval.search.stages.optimizers import OPTIMIZERS, SubProblem, choose_method, minimize, optimizer_methods
from bosch_eval.search.guard.incumbent_rankings import ranking_sources
from bosch_eval.search.objective.loading import CalibrationSettings, LoadSettings, build_objective
from bosch_eval.search.rankers import RANKERS
from bosch_eval.models.model_check import resolve_model
from bosch_eval.tasks.niah.calibration_sets import calibration_examples, calibration_sets
from tests.helpers import doc_example, requests

SHAPE = ModelShape(num_layers=4, num_heads=4, num_kv_heads=2)


@pytest.fixture
def drop_in(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator:
    """``drop_in(heading, package, registry)``: the example under ``heading`` written as a new module
    of ``package`` (in a second folder of its ``__path__``), its registrations kept apart; it and
    its registrations are gone after the test."""
    added: list[str] = []

    def write(heading: str, package: ModuleType, registry: Registry) -> str:
        filename, source = doc_example(heading)
        folder = tmp_path / package.__name__
        folder.mkdir()
        (folder / filename).write_text(source)
        module = f"{package.__name__}.{Path(filename).stem}"
        assert module not in sys.modules
        registry.names()  # the built-in members registered first, where they stay after the test
        monkeypatch.setattr(package, "__path__", [*package.__path__, str(folder)])
        monkeypatch.setattr(registry, "members", dict(registry.members))
        added.append(module)
        return module

    yield write
    for module in added:
        sys.modules.pop(module, None)


def test_a_new_calibration_set_is_one_new_file(tmp_path: Path) -> None:
    """The doc's YAML, alone in a folder of one's own: found as a calibration set, its documents
    read by the rankers as its task builds them, sized by the search's settings, and scored as S()."""
    filename, source = doc_example("Add a calibration set", "yaml")
    folder = tmp_path / "my_tasks"
    folder.mkdir()
    (folder / filename).write_text(source)
    assert "bosch_niah_calib_words" not in calibration_sets()
    found = calibration_sets([folder])["bosch_niah_calib_words"]
    assert found.metadata["calib_values"] == "words"
    path = resolve_model("toy")
    docs = calibration_examples("bosch_niah_calib_words", AutoTokenizer.from_pretrained(path), 256, 4, 0, [folder])
    assert all(re.fullmatch(r"[a-z]+-[a-z]+", doc["target"]) for doc in docs)
    assert ranking_sources(None, ["bosch_niah_calib_words"], [str(folder)])[0] == list(RANKERS.names())
    objective = build_objective(
        "toy",
        CalibrationSettings(tasks=("bosch_niah_calib_words",), include_path=str(folder), examples=4, length=256),
        LoadSettings(window=32),
    )
    score = objective(HeadMask.uniform(objective.shape, full=True))
    assert 0.0 <= score <= 1.0 and objective.metadata["num_examples"] == 4


def test_a_new_layer_heuristic_is_one_new_file(drop_in) -> None:
    drop_in("Add a layer heuristic", layer_heuristics, LAYER_HEURISTICS)
    assert LAYER_HEURISTICS.names() == ("intr", "bme", "rand", "last")  # the paper's first, in their order
    mask, _ = resolve_mask(SHAPE, MaskRequest(layers="last", ratio=0.5), default_window=8)
    assert [all(row) for row in mask.bits] == [False, False, True, True]
    assert mask == layer_heuristic_mask("last", SHAPE, 0.5).with_meta(window=8)
    assert list(incumbent_masks(SHAPE, 0.5, (), seed=0)) == ["intr", "bme", "rand:0", "last"]


def test_a_new_optimizer_is_one_new_file(drop_in) -> None:
    drop_in("Add an optimizer", optimizers, OPTIMIZERS)
    assert optimizer_methods() == ("auto", "exhaustive", "nomad", "oneplusone", "random")
    problem = SubProblem(n=8, k=3, budget=20, seed=0)
    result = minimize(lambda point: float(point.index(1)), problem, "random")  # best: the first one as late as can be
    assert (result.method, result.evaluations) == ("random", 20) and sum(result.best) == 3
    assert choose_method(SubProblem(n=80, k=40, budget=20, seed=0)) == "oneplusone"  # auto never picks it
    assert SearchSettings(ratio=0.5, optimizer="random").optimizer == "random"
    # A whole search with it: Stage 3 runs it, and the cost model bounds it by its budget.
    shape = ModelShape(num_layers=4, num_heads=8, num_kv_heads=4)
    settings = SearchSettings(ratio=0.5, optimizer="random", variant="bosch", budget_per_layer=3, seed=0)
    result = run_search(
        lambda mask: sum(layer * sum(row) for layer, row in enumerate(mask.bits)) / 100, shape, settings, progress=False
    )
    assert {sub.method for sub in result.subproblems if sub.stage == "stage3"} == {"random"}
    assert expected_evaluations(((4, 2),), 3, "random") == 3


def test_a_new_search_variant_is_one_new_file(drop_in) -> None:
    drop_in("Add a search variant", variants, VARIANTS)
    assert VARIANTS.names()[-1] == "best-heuristic"

    def score(mask: HeadMask) -> float:  # full attention is worth more in later layers
        return sum(layer * sum(row) for layer, row in enumerate(mask.bits)) / 100

    result = run_search(score, SHAPE, SearchSettings(ratio=0.5, variant="best-heuristic"), progress=False)
    heuristics = [layer_heuristic_mask(name, SHAPE, 0.5).bits for name in LAYER_HEURISTICS]
    assert result.mask.method == "bosch-best-heuristic"
    assert result.mask.bits == max(heuristics, key=lambda bits: score(HeadMask(bits, SHAPE.num_heads)))
    assert result.evaluations == 2 + len(set(heuristics))  # the anchors and each distinct heuristic mask, once


def test_a_new_importer_is_one_new_file(drop_in, tiny_model_dir: Path, tmp_path: Path) -> None:
    drop_in("Add an importer", importers, IMPORTERS)
    path = tmp_path / "scores.tsv"
    path.write_text("0.1\t0.9\n0.5\t0.2\n0.3\t0.3\n0.8\t0.4\n")
    ranking = import_pattern("scores-tsv", path, SHAPE, window=16)
    assert (ranking.method, ranking.more_local, ranking.window) == ("scores-tsv", "higher", 16)
    assert ranking.scores == ((0.1, 0.9), (0.5, 0.2), (0.3, 0.3), (0.8, 0.4))
    parser = argparse.ArgumentParser(prog="bosch-eval")
    command = add_import_parser(parser.add_subparsers(dest="command"))
    assert "scores-tsv: per-head scores, higher = more local (ranking)" in " ".join(command.format_help().split())
    out = tmp_path / "ranking.json"
    args = parser.parse_args(
        ["import", "--format", "scores-tsv", str(path), "--model", str(tiny_model_dir), "--out", str(out)]
    )
    with pytest.raises(MaskError, match="4 lines, one per layer, but the model"):  # the tiny model: L=3, G=4
        args.run(args)
    path.write_text("1\t2\t3\t4\n5\t6\t7\t8\n9\t10\t11\t12\n")
    args.run(args)
    assert HeadRanking.load(out).method == "scores-tsv"


def test_a_new_attention_backend_is_one_new_file(drop_in) -> None:
    drop_in("Add an attention backend", kernels, BACKENDS)
    assert backend_names() == ["auto", "sdpa", "blocked", "flex", "flash_attention_2", "sdpa-fp32"]
    model = random_model("qwen3", num_layers=2)
    rows = [
        [g % 2 for g in range(model.config.num_key_value_heads)],
        [1 - g % 2 for g in range(model.config.num_key_value_heads)],
    ]
    mask = HeadMask.from_rows(rows, model.config.num_attention_heads, window=3, sinks=1)
    ids = torch.randint(3, model.config.vocab_size, (2, 12), generator=torch.Generator().manual_seed(0))
    logits = {}
    for backend in ("sdpa-fp32", "sdpa"):
        with hybridize(model, mask, backend=backend), torch.no_grad():
            logits[backend] = model(ids, attention_mask=torch.tensor([[0, 0] + [1] * 10, [1] * 12])).logits
    assert torch.equal(logits["sdpa-fp32"], logits["sdpa"])  # a float32 model: the reference itself
    # bfloat16 inputs: the reference on their float32 values, rounded to bfloat16 once at the end
    generator = torch.Generator().manual_seed(1)
    query, key, value = (torch.randn(1, heads, 8, 16, generator=generator, dtype=torch.bfloat16) for heads in (4, 2, 2))
    attention, local = model.model.layers[0].self_attn, LocalWindow(3, 1)
    low = BACKENDS["sdpa-fp32"].swa(attention, query, key, value, None, local, scaling=0.25, dropout=0.0)
    exact = masked_swa_attention(
        attention, query.float(), key.float(), value.float(), None, local, scaling=0.25, dropout=0.0
    )
    assert low.dtype == torch.bfloat16 and torch.equal(low, exact.bfloat16())


def test_a_new_kv_quant_method_is_one_new_file(drop_in, tiny_model_dir: Path) -> None:
    drop_in("Add a KV-quantization method", methods, KV_QUANT_METHODS)
    assert KV_QUANT_METHODS.names() == ("logquant", "kivi", "kivi-sink")
    selector = Selector("kivi-sink", 4)
    selector.advance_to(11)
    assert selector.events == []  # full precision holds up to 3W − 1 = 11 positions
    selector.advance_to(19)  # events at 12 and 16 tokens: W = 4 positions each, never position 0
    assert [event.tolist() for event in selector.events] == [[1, 2, 3, 4], [5, 6, 7, 8]]
    assert selector.full_precision == [0, *range(9, 19)]
    assert not selector.rule.oldest_first
    parser = argparse.ArgumentParser(prog="bosch-eval")
    bench = add_bench_parser(parser.add_subparsers(dest="command"))
    assert "(logquant, kivi, kivi-sink)" in " ".join(bench.format_help().split())
    scores = {}
    for method in ("kivi-sink", "kivi"):
        lm = BoschLM.create_from_arg_string(
            f"pretrained={tiny_model_dir},mask=full,kv_quant={method},kv_window=1", {"device": "cpu", "batch_size": 2}
        )
        assert lm.kv_quant == KVQuantConfig(method, bits=2, window=1, group_size=16)  # the tiny model's head dim: 16
        scores[method] = [score for score, _ in lm.loglikelihood(requests())]
    assert scores["kivi-sink"] != scores["kivi"]  # scored through the cache, position 0 unquantized
