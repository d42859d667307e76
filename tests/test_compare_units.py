"""bosch-eval compare, without a model run: entries, YAML, KV bytes, paired CI, per-length
limit, the in-sample flag and the leaderboard rows."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from bosch_eval.attention.hybrid_attention import hybridize
from bosch_eval.caches.hybrid_cache import HybridCache, kv_cache_bytes
from bosch_eval.caches.kv_quant.config import parse_kv_quant
from bosch_eval.caches.kv_quant.formula import KVLayout, kv_cache_bytes_formula
from bosch_eval.models.resolved_model import ResolvedModel
from bosch_eval.compare.entries import parse_entry
from bosch_eval.compare.kv_bytes import entry_kv_bytes, relative_kv_bytes
from bosch_eval.compare.leaderboard import EntryRuns, build_rows
from bosch_eval.compare.paired_ci import paired_bootstrap_ci
from bosch_eval.compare.results import RunResults, main_score
from bosch_eval.compare.spec import CompareSpec, load_spec
from bosch_eval.masks.head_mask import CALIBRATION_INPUTS, HeadMask, HeadRanking
from bosch_eval.models.model_check import resolve_model
from bosch_eval.models.random_model import random_model
from bosch_eval.runtime.doc_selection import limited_indices, per_length_indices
from bosch_eval.runtime.errors import EntryError


class TestEntries:
    def test_parse(self):
        entry = parse_entry("bosch=mask=m.json,window=16,kv_quant=logquant2")
        assert entry.name == "bosch"
        assert entry.source_args == {"mask": "m.json", "window": "16"}
        assert entry.load_args == {"kv_quant": "logquant2"}  # passed through to the adapter
        assert parse_entry("original=").is_original

    def test_seeds_expand_into_runs(self):
        entry = parse_entry("rand=layers=rand,ratio=0.5,seeds=0/1/2")
        assert [run for run, _ in entry.runs()] == ["rand@seed=0", "rand@seed=1", "rand@seed=2"]
        assert entry.runs()[2][1] == {"layers": "rand", "ratio": "0.5", "seed": "2"}

    @pytest.mark.parametrize(
        ("text", "message"),
        [
            ("bosch", "expected NAME=ARGS"),
            ("bad name=mask=m.json", "field 'name'"),
            ("x=mask", "model_arg 'mask' is not key=value"),
            ("x=mask=a,mask=b", "given twice"),
            ("x=mask=a,ranking=b", "one mask source"),
            ("x=ratio=0.5", "needs ranking= or layers="),
            ("x=layers=intr,ratio=0.5,seeds=0/1", "layers=rand only"),
            ("x=layers=rand,ratio=0.5,seeds=0/a", "integers"),
        ],
    )
    def test_bad_entries_name_the_entry_and_field(self, text, message):
        with pytest.raises(EntryError, match=message):
            parse_entry(text)

    def test_yaml(self, tmp_path):
        path = tmp_path / "lb.yaml"
        path.write_text(
            "model: toy\ntasks: [bosch_niah]\nmetadata: {max_seq_lengths: [512, 1024]}\nlimit: 5\nseeds: [0, 1]\n"
            "entries:\n  - original=\n  - {name: rand, args: 'layers=rand,ratio=0.75'}\n  - bosch=mask=m.json\n"
        )
        spec = load_spec(path)
        assert [e.name for e in spec.entries] == ["original", "rand", "bosch"]
        assert spec.entries[1].seeds == (0, 1)  # the leaderboard's seeds for a rand entry
        assert spec.default_kv_length() == 1024

    def test_yaml_duplicate_names_and_unknown_fields(self, tmp_path):
        path = tmp_path / "lb.yaml"
        path.write_text("model: toy\ntasks: [t]\nentries: [a=, a=mask=m.json]\n")
        with pytest.raises(EntryError, match="two entries are named 'a'"):
            load_spec(path)
        path.write_text("model: toy\ntasks: [t]\nentrys: [a=]\n")
        with pytest.raises(EntryError, match="unknown fields \\['entrys'\\]"):
            load_spec(path)


class TestKVBytes:
    @pytest.mark.parametrize("length", [5, 7, 40])
    def test_closed_form_equals_the_hybrid_cache(self, length):
        rows, window = [[1, 0, 0, 1], [0, 0, 0, 0], [1, 1, 1, 1]], 8
        model = random_model("qwen3", num_layers=3, seed=1)
        mask = HeadMask.from_rows(rows, model.config.num_attention_heads, window=window)
        hybridize(model, mask)
        cache = HybridCache.for_model(model)
        with torch.no_grad():
            model(input_ids=torch.randint(0, 300, (2, length)), past_key_values=cache, use_cache=True)
        expected = kv_cache_bytes_formula(
            mask.bits, KVLayout(3, 4, model.config.head_dim), length, window=window, dtype_bytes=4, batch=2
        )
        assert kv_cache_bytes(cache) == expected
        original = 2 * 3 * 4 * length * model.config.head_dim * 4 * 2
        assert relative_kv_bytes(mask, window, length) == pytest.approx(kv_cache_bytes(cache) / original)

    def test_entry_bytes(self):
        mask = HeadMask.from_rows([[0, 1]], 2, window=4)
        assert entry_kv_bytes({}, mask, 4, 100) == pytest.approx((100 + 3) / 200)
        assert entry_kv_bytes({"kv_cache": "dynamic"}, mask, 4, 100) == 1.0
        with pytest.raises(ValueError, match="head_dim"):
            entry_kv_bytes({"kv_quant": "logquant", "kv_window": "8"}, mask, 4, 100)

    def test_kv_quant_entry_bytes_are_the_formula_over_the_16_bit_original(self):
        mask = HeadMask.from_rows([[0, 1]], 2, window=4)
        args = {"kv_quant": "logquant", "kv_bits": "2", "kv_window": "8", "kv_group_size": "16"}
        quant = parse_kv_quant("logquant", "2", "8", "16", head_dim=32)
        expected = kv_cache_bytes_formula(
            [[0, 1]], KVLayout(1, 2, 32), 100, window=4, kv_quant=quant
        ) / kv_cache_bytes_formula(None, KVLayout(1, 2, 32), 100)
        assert entry_kv_bytes(args, mask, 4, 100, head_dim=32) == pytest.approx(expected)
        assert entry_kv_bytes(args, mask, 4, 100, head_dim=32) < entry_kv_bytes({}, mask, 4, 100)
        assert entry_kv_bytes({"kv_quant": "none"}, mask, 4, 100) == entry_kv_bytes({}, mask, 4, 100)


class TestPairedCI:
    def test_constant_difference_has_a_zero_width_interval(self):
        # Per-document scores vary a lot, the difference does not: paired, the CI is a point
        # (an unpaired interval would be wide).
        rng = np.random.default_rng(1)
        ref = {(None, i): float(v) for i, v in enumerate(rng.random(50))}
        entry = {k: v + 0.1 for k, v in ref.items()}
        diff, low, high, n, _ = paired_bootstrap_ci(entry, ref)
        assert (n, diff) == (50, pytest.approx(0.1))
        assert low == pytest.approx(0.1) and high == pytest.approx(0.1)

    def test_interval_matches_the_normal_approximation(self):
        # 400 documents, the entry loses 100 of them (diff -1), keeps the rest: mean -0.25,
        # sd sqrt(0.25·0.75), so the 95% interval is -0.25 ± 1.96·0.433/20 ≈ ±0.042.
        ref = {(None, i): 1.0 for i in range(400)}
        entry = {(None, i): 0.0 if i < 100 else 1.0 for i in range(400)}
        diff, low, high, _, p_value = paired_bootstrap_ci(entry, ref)
        half = 1.96 * math.sqrt(0.25 * 0.75) / 20
        assert diff == -0.25
        assert low == pytest.approx(-0.25 - half, abs=0.006) and high == pytest.approx(-0.25 + half, abs=0.006)
        assert p_value == 0.0  # no replicate reaches zero, 5.8 standard errors away

    def test_strata_are_averaged_as_the_score_is(self):
        # length 512: 2 docs, diff -1 each; length 1024: 8 docs, diff 0: score diff = mean of
        # the per-length means = -0.5 (not the document mean -0.2).
        ref = {(512, i): 1.0 for i in range(2)} | {(1024, i): 1.0 for i in range(2, 10)}
        entry = {(512, i): 0.0 for i in range(2)} | {(1024, i): 1.0 for i in range(2, 10)}
        diff, low, high, *_ = paired_bootstrap_ci(entry, ref)
        assert (diff, low, high) == (-0.5, -0.5, -0.5)

    def test_other_documents_are_an_error(self):
        with pytest.raises(ValueError, match="different documents"):
            paired_bootstrap_ci({(None, 0): 1.0}, {(None, 1): 1.0})


def test_limit_applies_per_length():
    docs = [{"max_length": 512}] * 4 + [{"max_length": 1024}] * 4
    assert limited_indices(docs, 2) == [0, 1, 4, 5]  # lm-eval's limit would keep [0, 1]
    assert limited_indices(docs, 0.5) == [0, 1, 4, 5]
    assert limited_indices([{"q": 1}] * 5, 2) == [0, 1]
    assert per_length_indices([512] * 3 + [1024] * 3, 1) == [0, 3]  # benchmarks/ give the lengths directly


def _run(scores, docs=None):
    samples = {"t": [{"doc_id": i, "acc": v} for i, v in enumerate(docs)]} if docs is not None else {}
    return RunResults(results={"t": {"acc,none": scores}}, samples=samples)


def test_leaderboard_rows_flag_in_sample_and_average_seeds():
    calib = {"calibration": {"tasks": ["t"]}}
    searched = HeadMask.from_rows([[0, 1]], 2, window=4, provenance=calib)
    heuristic = HeadMask.from_rows([[1, 0]], 2, window=4)
    entries = [
        EntryRuns("original", [_run(1.0, [1, 1])], {}, HeadMask.from_rows([[1, 1]], 2, window=4)),
        EntryRuns("bosch", [_run(0.5, [1, 0])], {}, searched),
        EntryRuns("rand", [_run(0.5, [1, 0]), _run(1.0, [1, 1])], {}, heuristic),
    ]
    rows = {r.entry: r for r in build_rows(entries, "original", 4)}
    assert rows["bosch"].cells["t"].in_sample and not rows["rand"].cells["t"].in_sample
    assert rows["rand"].cells["t"].mean == 0.75 and rows["rand"].cells["t"].sd == pytest.approx(math.sqrt(0.125))
    assert rows["bosch"].cells["t"].ci[0] == -0.5
    assert rows["rand"].cells["t"].ci[0] == -0.25  # seed-averaged documents
    assert rows["bosch"].kv_bytes == pytest.approx((4 + 3) / 8)
    assert rows["rand"].per_run == {"rand run 1": {"t": 0.5}, "rand run 2": {"t": 1.0}} and not rows["bosch"].per_run


def test_each_seed_of_an_entry_is_reported(tmp_path):
    # Issue 53: RAND's seeds each reported, not only their mean ± sd.
    from bosch_eval.compare.leaderboard import write_leaderboard

    mask = HeadMask.from_rows([[1, 0]], 2, window=4)
    seeds = EntryRuns(
        "rand", [_run(0.25, [1, 0]), _run(0.75, [1, 1])], {}, mask, run_names=["rand@seed=0", "rand@seed=1"]
    )
    rows = build_rows([EntryRuns("original", [_run(1.0, [1, 1])], {}, mask), seeds], "original", 4, tasks=["t"])
    header = {"command": "bosch-eval compare ...", "versions": {}, "reference": "original", "kv_length": 4}
    write_leaderboard(rows, ["t"], tmp_path, header, ["t"])
    table = (tmp_path / "leaderboard.md").read_text().split("Each run of the entries run with several seeds:")[1]
    assert "| run | headline | t |" in table
    assert "| rand@seed=0 | 0.250 | 0.250 |" in table and "| rand@seed=1 | 0.750 | 0.750 |" in table
    assert "original" not in table  # one run: its row above says it all
    assert json.loads((tmp_path / "leaderboard.json").read_text())["rows"][1]["per_run"]["rand@seed=1"] == {"t": 0.75}


def test_a_seeds_score_on_its_calibration_task_is_marked_in_sample(tmp_path):
    from bosch_eval.compare.leaderboard import write_leaderboard

    searched = HeadMask.from_rows([[0, 1]], 2, window=4, provenance={"calibration": {"tasks": ["t"]}})
    seeds = EntryRuns(
        "bosch", [_run(0.25, [1, 0]), _run(0.75, [1, 1])], {}, searched, run_names=["bosch@seed=0", "bosch@seed=1"]
    )
    rows = build_rows([seeds], "original", 4, tasks=["t"])
    write_leaderboard(
        rows, ["t"], tmp_path, {"command": "c", "versions": {}, "reference": "original", "kv_length": 4}, ["t"]
    )
    table = (tmp_path / "leaderboard.md").read_text().split("Each run of the entries run with several seeds:")[1]
    assert "| bosch@seed=0 | 0.250 *in-sample* |" in table


def test_a_ranking_computed_on_a_task_is_in_sample_there(tmp_path):
    # Paper B.4 computes the static rankings on the search's calibration set: a held-out
    # headline must not count that task for them either. Razor reads random tokens, not the task.
    def ranking(name, inputs):
        provenance = {"calib_task": "t", "inputs": inputs}
        HeadRanking(((0.0, 1.0),), "higher", name, 2, window=4, provenance=provenance).save(tmp_path / f"{name}.json")
        return {"ranking": str(tmp_path / f"{name}.json"), "ratio": "0.5"}

    mask = HeadMask.from_rows([[1, 0]], 2, window=4)
    entries = [
        EntryRuns("original", [_run(1.0, [1, 1])], {}, HeadMask.from_rows([[1, 1]], 2, window=4)),
        EntryRuns("apl", [_run(0.5, [1, 0])], ranking("apl", CALIBRATION_INPUTS), mask),
        EntryRuns("razor", [_run(0.5, [1, 0])], ranking("razor", "random block of K tokens repeated 4 times"), mask),
    ]
    rows = {r.entry: r for r in build_rows(entries, "original", 4)}
    assert rows["apl"].cells["t"].in_sample and not rows["razor"].cells["t"].in_sample


def test_a_group_and_the_headline_over_it_get_paired_cis():
    # bosch_niah_single is a group (the unweighted mean of its tasks): its column and a headline
    # over it once had no CI, since a group has no samples of its own.
    def run(a, b, c):
        results = {"g": {"acc,none": (sum(a) / len(a) + sum(b) / len(b)) / 2}, "x": {"acc,none": sum(c) / len(c)}}
        results |= {name: {"acc,none": sum(v) / len(v)} for name, v in (("a", a), ("b", b))}
        samples = {
            name: [{"doc_id": i, "acc": v} for i, v in enumerate(values)]
            for name, values in (("a", a), ("b", b), ("x", c))
        }
        return RunResults(results=results, samples=samples, group_subtasks={"g": ["a", "b"]})

    mask = HeadMask.from_rows([[1, 1]], 2, window=4)
    entries = [EntryRuns("original", [run([1, 1], [1, 1, 1, 1], [1, 1])], {}, mask),
               EntryRuns("hybrid", [run([1, 0], [0, 0, 0, 0], [1, 0])], {}, mask)]  # fmt: skip
    row = build_rows(entries, "original", None, tasks=["g", "x"])[1]
    assert row.cells["g"].ci[0] == pytest.approx(-0.75)  # (-0.5 + -1.0) / 2: each task weighs half, whatever its size
    assert row.headline_ci[0] == pytest.approx((-0.75 - 0.5) / 2)


def test_main_score_of_ruler_lengths_ignores_missing_lengths():
    assert main_score({"512,none": 0.5, "1024,none": 1.0, "4096,none": -1}) == ("mean over lengths", 0.75)
    assert main_score({"score,none": 0.3, "512,none": 0.2}) == ("score", 0.3)


def test_headline_counts_each_asked_task_once(tmp_path):
    # bosch_niah is a group of two subtasks: its headline weight must be one, not three.
    from bosch_eval.compare.leaderboard import Cell, Row, write_leaderboard

    cells = {"niah_single_1": Cell("acc", 1.0), "bosch_niah": Cell("score", 0.5), "bosch_niah_single": Cell("score", 0.9),
             "bosch_niah_multikey": Cell("score", 0.1), "bosch_niah_calib": Cell("acc", 0.8, in_sample=True)}  # fmt: skip
    rows = [Row("bosch", 1, 0.5, 0.5, cells)]
    header = {"command": "bosch-eval compare ...", "versions": {}, "reference": "original", "kv_length": 1024}
    write_leaderboard(rows, list(cells), tmp_path, header, ["niah_single_1", "bosch_niah", "bosch_niah_calib"])
    main, sub = (tmp_path / "leaderboard.md").read_text().split("Subtasks and subgroups:")
    assert "| bosch | 0.500 | 0.5000 | 0.750 | 1.000 | 0.500 | 0.800 *in-sample* |" in main
    assert "bosch_niah_single" not in main and "| 0.900 | 0.100 |" in sub
    assert json.loads((tmp_path / "leaderboard.json").read_text())["headline_columns"] == [
        "niah_single_1",
        "bosch_niah",
    ]


def test_niah_columns_say_which_value_format_they_ask(tmp_path):
    # Issue 67: the held-out gap was one format (UUIDs in prose); the header says which column is which.
    from bosch_eval.compare.leaderboard import Cell, Row, write_leaderboard

    names = ["niah_single_1", "bosch_niah_single", "bosch_niah_single_1", "bosch_niah_single_2", "bosch_niah_single_3"]
    rows = [Row("bosch", 1, 0.5, 0.5, {name: Cell("score", 0.5) for name in names})]
    header = {"command": "bosch-eval compare ...", "versions": {}, "reference": "original", "kv_length": 1024}
    write_leaderboard(rows, names, tmp_path, header, ["niah_single_1", "bosch_niah_single"])
    main, sub = (tmp_path / "leaderboard.md").read_text().split("Subtasks and subgroups:")
    assert "| niah_single_1 (numbers in noise) | bosch_niah_single |" in main
    assert (
        "| bosch_niah_single_1 (numbers in noise) | bosch_niah_single_2 (numbers in prose) | bosch_niah_single_3 (UUIDs in prose) |"
        in sub
    )
    formats = json.loads((tmp_path / "leaderboard.json").read_text())["formats"]
    assert formats == {"niah_single_1": "numbers in noise", "bosch_niah_single_1": "numbers in noise",
                       "bosch_niah_single_2": "numbers in prose", "bosch_niah_single_3": "UUIDs in prose"}  # fmt: skip


@pytest.mark.slow  # builds lm-eval's RULER task twice (~17 s CPU)
def test_ruler_documents_do_not_depend_on_the_global_random_state():
    # Upstream RULER draws its needles from Python's global `random` while building documents:
    # unseeded, a comparison resumed in another process scored other documents than its first part.
    import random

    from bosch_eval.models.model_check import resolve_model
    from bosch_eval.runtime.lm_eval_session import load_task, task_manager

    path = resolve_model("toy")
    manager = task_manager(["niah_single_1"], None, {"pretrained": path, "tokenizer": path, "max_seq_lengths": [512]})
    documents = []
    for seed in (1, 2):
        random.seed(seed)
        task = load_task(manager, "niah_single_1")["tasks"]["niah_single_1"]
        documents.append([doc["input"] for doc in task.eval_docs])
        assert random.random() == random.Random(seed).random()  # the caller's generator is left as it was
    assert documents[0] == documents[1]


@pytest.mark.slow
def test_a_doc_seed_draws_other_documents_and_the_same_ones_again():
    """compare's doc_seed reaches the documents the tasks build before the evaluation:
    RULER's needles (Python's global random) and bosch_niah's eval_seed."""
    from bosch_eval.compare.runner import _build_tasks

    def documents(doc_seed):
        spec = CompareSpec(model="toy", tasks=["niah_single_1", "bosch_niah_single_1"], entries=[parse_entry("original=")],
                           metadata={"max_seq_lengths": [256], "num_samples": 3}, doc_seed=doc_seed)  # fmt: skip
        _, _, leaves = _build_tasks(spec, resolve_model("toy"))
        return {
            name: [doc["input"] for task in tasks.values() for doc in task.eval_docs] for name, tasks in leaves.items()
        }

    default, five, again = documents(None), documents(5), documents(5)
    assert five == again
    assert all(five[name] != default[name] for name in default)


def test_doc_seed_is_checked_and_pinned_with_the_settings():
    spec = CompareSpec(model="toy", tasks=["x"], entries=[parse_entry("original=")], doc_seed=5)
    assert spec.settings()["doc_seed"] == 5 and spec.task_metadata()["eval_seed"] == 5
    assert "doc_seed" not in CompareSpec(model="toy", tasks=["x"], entries=[parse_entry("original=")]).settings()
    for bad in (-1, True, "5"):
        with pytest.raises(EntryError, match="doc_seed: expected an integer >= 0"):
            CompareSpec(model="toy", tasks=["x"], entries=[parse_entry("original=")], doc_seed=bad)
    with pytest.raises(EntryError, match="doc_seed: 5 and metadata's eval_seed 0 both seed"):
        CompareSpec(model="toy", tasks=["x"], entries=[parse_entry("original=")], doc_seed=5, metadata={"eval_seed": 0})


class TestEntryKeys:
    """One set of keys: the adapter's own (bosch_eval.model_adapters.loader_args.loader_parameters)."""

    @pytest.mark.parametrize(("text", "key"), [("x=mask=m.json,kv_bit=4", "kv_bit"), ("x=foo=1", "foo")])
    def test_a_key_the_adapter_does_not_take_is_refused(self, text, key):
        with pytest.raises(
            EntryError, match=rf"entry 'x': model_arg '{key}' is not one the bosch adapter takes.* It takes: .*kv_bits"
        ):
            parse_entry(text)

    def test_every_adapter_key_is_accepted(self):
        from bosch_eval.model_adapters.loader_args import loader_parameters

        for key in sorted(loader_parameters() - {"pretrained", "mask", "ranking", "layers", "ratio", "seed"}):
            assert parse_entry(f"x={key}=1").load_args.keys() <= {key}

    def test_a_key_added_to_the_adapter_is_accepted_without_a_second_list(self, monkeypatch):
        from dataclasses import field, make_dataclass

        from bosch_eval.model_adapters import loader_args, settings

        # A made-up key (issue 30 adds sink= this way), added to the adapter's settings only.
        with pytest.raises(EntryError, match="'new_knob'"):
            parse_entry("x=mask=m.json,new_knob=4")
        knob = field(
            default=0, metadata={settings.CONVERT: lambda name, value: int(value), settings.MASK_SOURCE: False}
        )
        widened = make_dataclass("Widened", [("new_knob", int, knob)], bases=(settings.AdapterSettings,), frozen=True)
        monkeypatch.setattr(loader_args, "AdapterSettings", widened)
        assert parse_entry("x=mask=m.json,new_knob=4").load_args == {"new_knob": "4"}

    def test_mask_full_is_the_original(self):
        from bosch_eval.compare.runner import resolve_entry_mask
        from bosch_eval.masks.head_mask import ModelShape

        entry = parse_entry("q=mask=full,kv_quant=logquant")
        assert entry.is_original and entry.load_args == {"kv_quant": "logquant"}
        mask = resolve_entry_mask(entry.model_args, ModelShape(2, 4, 2), 8, "toy")
        assert mask.bits == ((1, 1), (1, 1)) and mask.window == 8
        with pytest.raises(EntryError, match="mask=full keeps every group full"):
            parse_entry("q=mask=full,ratio=0.5")

    def test_shared_model_args_take_the_same_keys_but_no_mask_source(self):
        from bosch_eval.compare.spec import build_spec

        entries = [parse_entry("original=")]
        assert build_spec(
            {"model": "toy", "tasks": ["t"], "model_args": "device=cpu,dtype=float32"}, entries, "cli"
        ).model_args
        with pytest.raises(EntryError, match="cli: model_args: model_arg 'kv_bit' is not one the bosch adapter takes"):
            build_spec({"model": "toy", "tasks": ["t"], "model_args": "kv_bit=4"}, entries, "cli")
        with pytest.raises(EntryError, match="model_arg 'mask' chooses a mask, so it goes in an entry"):
            build_spec({"model": "toy", "tasks": ["t"], "model_args": {"mask": "m.json"}}, entries, "cli")


class TestRunInputs:
    """What a run pins (item: a mask file changed under the same path kept a stale row)."""

    def test_a_model_directory_is_its_files_but_not_its_card(self, tmp_path):
        import hashlib

        from bosch_eval.compare.inputs import changed, run_inputs
        from bosch_eval.models.model_identity import model_identity

        (tmp_path / "config.json").write_text("{}")
        (tmp_path / "model.safetensors").write_bytes(b"weights")
        (tmp_path / "README.md").write_text("card")
        (tmp_path / ".cache").mkdir()
        (tmp_path / ".cache" / "x").write_text("download state")
        identity = model_identity(str(tmp_path))
        config = hashlib.sha256(b"{}").hexdigest()
        assert identity == {"files": {"config.json": config, "model.safetensors": hashlib.sha256(b"weights").hexdigest()},
                            "unstamped": {"config.json": config}}  # fmt: skip
        mask = HeadMask.from_rows([[0, 1]], 2, window=4)
        before = run_inputs({}, mask, identity)
        (tmp_path / "README.md").write_text("another card")
        assert changed(before, run_inputs({}, mask, model_identity(str(tmp_path)))) == []
        (tmp_path / "model.safetensors").write_bytes(b"retrained")
        assert changed(before, run_inputs({}, mask, model_identity(str(tmp_path)))) == [
            "the model changed (files model.safetensors)"
        ]

    def test_mask_and_ranking_files_are_pinned_by_content(self, tmp_path):
        from bosch_eval.compare.inputs import changed, run_inputs

        path = tmp_path / "mask.json"
        mask = HeadMask.from_rows([[0, 1]], 2, window=4)
        mask.save(path)
        before = run_inputs({"mask": str(path)}, mask, {})
        assert changed(before, run_inputs({"mask": str(path)}, mask, {})) == []
        other = HeadMask.from_rows([[0, 0]], 2, window=4)
        other.save(path)
        (reason,) = changed(before, run_inputs({"mask": str(path)}, other, {}))
        assert reason.startswith(f"mask file {path} changed (sha256 {before['mask']['sha256'][:12]} → ")
        assert changed(None, before) == ["its run.json pins no inputs (made by an older bosch-eval)"]
        # layers= heuristics read no file: the bits they resolve to are pinned.
        assert changed(run_inputs({}, mask, {}), run_inputs({}, other, {})) == [
            "the mask resolves differently now (window 4 → 4, or other bits)"
        ]


class TestHeadline:
    """The headline's CI, and the leaderboard without a held-out task."""

    @staticmethod
    def _entries():
        def run(a, b):  # t1 is length-wise (512, 1024), t2 is not
            samples = {"t1": [{"doc_id": i, "doc": {"max_length": 512 * (1 + i % 2)}, str(512 * (1 + i % 2)): v} for i, v in enumerate(a)],
                       "t2": [{"doc_id": i, "acc": v} for i, v in enumerate(b)]}  # fmt: skip
            t1 = {"512,none": float(np.mean(a[0::2])), "1024,none": float(np.mean(a[1::2]))}
            return RunResults(results={"t1": t1, "t2": {"acc,none": float(np.mean(b))}}, samples=samples)

        rng = np.random.default_rng(0)
        ref_a, ref_b = rng.integers(0, 2, 40).astype(float), rng.integers(0, 2, 30).astype(float)
        ent_a, ent_b = rng.integers(0, 2, 40).astype(float), rng.integers(0, 2, 30).astype(float)
        mask = HeadMask.from_rows([[1, 1]], 2, window=4)
        return [EntryRuns("original", [run(ref_a, ref_b)], {}, mask), EntryRuns("bosch", [run(ent_a, ent_b)], {}, mask)]

    def test_one_task_headline_ci_is_its_cell_ci(self):
        rows = build_rows(self._entries(), "original", 4, tasks=["t1"])
        assert rows[1].headline_ci == rows[1].cells["t1"].ci and rows[0].headline_ci is None

    def test_two_task_headline_ci_against_a_direct_bootstrap(self):
        # Oracle: resample each (task, length) stratum directly, headline difference = the mean
        # over tasks of each task's score difference (t1: mean over its two lengths).
        entries = self._entries()
        rows = build_rows(entries, "original", 4, tasks=["t1", "t2"])
        ref, ent = entries[0].runs[0].samples, entries[1].runs[0].samples
        d512 = np.array([e["512"] - r["512"] for e, r in zip(ent["t1"], ref["t1"]) if e["doc"]["max_length"] == 512])
        d1024 = np.array(
            [e["1024"] - r["1024"] for e, r in zip(ent["t1"], ref["t1"]) if e["doc"]["max_length"] == 1024]
        )
        d2 = np.array([e["acc"] - r["acc"] for e, r in zip(ent["t2"], ref["t2"])])
        diff, low, high = rows[1].headline_ci
        assert diff == pytest.approx((d512.mean() + d1024.mean()) / 4 + d2.mean() / 2)
        score = lambda r: (np.mean(r["t1"]["512,none"] + r["t1"]["1024,none"]) / 2 + r["t2"]["acc,none"]) / 2  # noqa: E731
        assert diff == pytest.approx(score(entries[1].runs[0].results) - score(entries[0].runs[0].results))
        rng = np.random.default_rng(1)
        draw = lambda d: rng.choice(d, d.size).mean()  # noqa: E731
        boot = [(draw(d512) + draw(d1024)) / 4 + draw(d2) / 2 for _ in range(4000)]
        assert low == pytest.approx(np.percentile(boot, 2.5), abs=0.02) and high == pytest.approx(
            np.percentile(boot, 97.5), abs=0.02
        )

    def test_tied_points_share_one_label(self):
        from bosch_eval.compare.leaderboard import Cell, Row, pareto_labels

        rows = [Row(name, 1, 0.5, kv, {"t": Cell("acc", score)}) for name, kv, score in
                [("apl", 0.50004, 0.8441), ("fisher", 0.5, 0.844), ("intr", 0.5, 0.812)]]  # fmt: skip
        assert pareto_labels(rows, ["t"]) == {(0.5, 0.844): "apl\nfisher", (0.5, 0.812): "intr"}

    def test_without_a_held_out_task_there_is_no_headline_and_no_plot(self, tmp_path):
        from bosch_eval.compare.leaderboard import write_leaderboard

        rows = build_rows(self._entries(), "original", 4, tasks=["t1"])
        header = {"command": "bosch-eval compare ...", "versions": {}, "reference": "original", "kv_length": 4}
        write_leaderboard(rows, ["t1", "t2"], tmp_path, header, ["t1"])
        assert (tmp_path / "pareto.png").stat().st_size > 0
        row = f"| bosch | 0.000 | 1.0000 | {rows[1].cells['t1'].mean:.3f} ({rows[1].headline_ci[0]:+.3f} ["
        assert row in (tmp_path / "leaderboard.md").read_text()  # the headline with its CI
        rows[1].cells["t1"].in_sample = True  # t1 is bosch's calibration task
        write_leaderboard(rows, ["t1", "t2"], tmp_path, header, ["t1"])
        table = (tmp_path / "leaderboard.md").read_text()
        assert "no task is held out" in table and "mean over []" not in table and "headline |" not in table
        assert not (tmp_path / "pareto.png").exists()  # the earlier plot does not stay beside this table


class TestKVLength:
    """Issue 40: a comparison on bosch_niah_calib alone printed "T = None" and "–" for KV bytes."""

    def spec(self, tasks: list[str], metadata: dict | None = None):  # noqa: ANN201
        from bosch_eval.compare.entries import parse_entry
        from bosch_eval.compare.spec import build_spec

        return build_spec(
            {"model": "toy", "tasks": tasks, "metadata": metadata or {}}, [parse_entry("original=")], "test"
        )

    def test_our_tasks_default_to_the_models_calibration_length(self) -> None:
        from bosch_eval.compare.cli import kv_length_of

        toy = ResolvedModel.named("toy")
        assert kv_length_of(self.spec(["bosch_niah_calib"]), toy) == 1024  # toy's bosch_defaults.json calib_len
        assert kv_length_of(self.spec(["bosch_niah_calib"], {"seq_len": 256}), toy) == 256

    def test_other_tasks_without_lengths_say_so_instead_of_none(self) -> None:
        from bosch_eval.compare.cli import kv_length_of
        from bosch_eval.compare.leaderboard import _kv_legend

        assert kv_length_of(self.spec(["niah_single_1"]), ResolvedModel.named("toy")) is None
        assert "None" not in _kv_legend(None) and "--kv-length" in _kv_legend(None)
        assert _kv_legend(512) == "KV bytes: relative to the original at T = 512."
