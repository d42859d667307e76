"""Importers of published head patterns: real on-disk formats, direction, GQA, bad files."""

from __future__ import annotations

import argparse
import csv
import json
from pathlib import Path

import pytest

from bosch_eval.masks.head_mask import HeadMask, HeadRanking, ModelShape, ceil_count
from bosch_eval.masks.mask_sources import MaskRequest, resolve_mask
from bosch_eval.runtime.errors import MaskError, ModelError
from bosch_eval.search.cli.importing import add_import_parser, import_main
from bosch_eval.search.importers import import_pattern, model_shape
from bosch_eval.search.importers.duo import import_duo
from bosch_eval.search.importers.prulong import import_prulong
from bosch_eval.search.importers.retrieval_json import import_retrieval_json

# L=3 layers, H=8 query heads, G=4 KV groups (group size 2).
SHAPE = ModelShape(num_layers=3, num_heads=8, num_kv_heads=4)
# A DuoAttention-like gate grid: real files hold small negatives and exact 1s.
GATES = [
    [0.60546875, -1.4e-3, 0.96875, 0.68359375],
    [0.99609375, 0.0, 0.8125, 1.0],
    [0.0004310607910156, 0.9921875, 0.2275390625, 0.5],
]


def write_duo(path: Path, rows) -> Path:
    """Write like DuoAttention's ``np.savetxt(..., delimiter="\\t")`` (default fmt %.18e)."""
    path.write_text("".join("\t".join(f"{value:.18e}" for value in row) + "\n" for row in rows))
    return path


def write_prulong(path: Path, rows) -> Path:
    """Write like PruLong's ``csv.writer(f, delimiter="\\t").writerows(mask.tolist() ...)``."""
    with open(path, "w", newline="") as f:
        csv.writer(f, delimiter="\t").writerows([[float(v) for v in row] for row in rows])
    return path


def write_head_scores(path: Path, grid) -> Path:
    """Write like Retrieval_Head's ``json.dump(head_counter, f)``: {"l-h": [scores]}."""
    data = {f"{layer}-{head}": scores for layer, row in enumerate(grid) for head, scores in enumerate(row)}
    path.write_text(json.dumps(data))
    return path


def tiny_config_dir(tmp_path: Path) -> Path:
    from transformers import AutoConfig

    config = AutoConfig.for_model(
        "qwen3", num_hidden_layers=3, num_attention_heads=8, num_key_value_heads=4, head_dim=16, hidden_size=64,
        intermediate_size=96, vocab_size=300,
    )  # fmt: skip
    out = tmp_path / "tiny-model"
    config.save_pretrained(out)
    return out


def swa_cells(mask: HeadMask) -> set[tuple[int, int]]:
    return {(layer, g) for layer, row in enumerate(mask.bits) for g, bit in enumerate(row) if bit == 0}


class TestDuo:
    def test_reads_gates_per_kv_group_as_ranking(self, tmp_path):
        ranking = import_duo(write_duo(tmp_path / "full_attention_heads.tsv", GATES), SHAPE, model="tiny")
        assert ranking.scores == tuple(tuple(row) for row in GATES)  # raw values: no clipping
        assert ranking.more_local == "lower" and ranking.method == "duoattention" and ranking.model == "tiny"
        assert ranking.provenance["imported_from"] == "duo"
        assert ranking.provenance["group_score"] == "per KV group in the file"

    def test_high_gate_is_least_local(self, tmp_path):
        ranking = import_duo(write_duo(tmp_path / "f.tsv", GATES), SHAPE)
        total = SHAPE.num_layers * SHAPE.num_kv_heads
        # One SWA group: the lowest gate (-1.4e-3 at layer 0, group 1), not the 0.0 tie.
        assert swa_cells(ranking.to_mask(1 / total)) == {(0, 1)}
        # All but one SWA: the one kept full has the highest gate (first 1.0 in order).
        assert swa_cells(ranking.to_mask((total - 1) / total)) == {
            (layer, g) for layer in range(3) for g in range(4)
        } - {(1, 3)}

    def test_per_query_head_file_is_averaged_per_group(self, tmp_path):
        per_head = [[v for value in row for v in (value, value + 0.5)] for row in GATES]  # L×H
        ranking = import_duo(write_duo(tmp_path / "f.tsv", per_head), SHAPE)
        assert ranking.scores == tuple(tuple(pytest.approx(v + 0.25) for v in row) for row in GATES)
        assert ranking.provenance["group_score"] == "mean over query heads"

    def test_sidecar_run_config_lands_in_provenance(self, tmp_path):
        run_args = {"sink_size": 128, "recent_size": 256, "lr": 0.02, "seed": 42}
        (tmp_path / "config.json").write_text(json.dumps(run_args))
        ranking = import_duo(write_duo(tmp_path / "full_attention_heads.tsv", GATES), SHAPE)
        sidecar = ranking.provenance["sidecar_config"]
        assert (sidecar["sink_size"], sidecar["recent_size"], sidecar["lr"]) == (128, 256, 0.02)
        assert "seed" not in sidecar
        # Its streaming heads (sink_size first + recent_size last tokens) are our window with sinks.
        assert (ranking.window, ranking.sinks) == (256, 128)
        assert (
            import_duo(tmp_path / "full_attention_heads.tsv", SHAPE, window=64).window == 64
        )  # an explicit window wins
        (tmp_path / "config.json").unlink()
        bare = import_duo(tmp_path / "full_attention_heads.tsv", SHAPE)
        assert (bare.window, bare.sinks) == (None, 0)  # no sidecar: nothing guessed

    @pytest.mark.parametrize(
        "rows, expected",
        [
            (GATES[:2], r"\.tsv: 2 lines, one per layer, but the model \(tiny\) has num_layers=3"),
            (
                [row + [0.5] for row in GATES],
                r"\.tsv: 5 gate values per line, but the model \(tiny\) needs num_kv_heads=4 .* or num_heads=8",
            ),
        ],
        ids=["layers", "heads"],
    )
    def test_wrong_shape_names_file_and_field(self, tmp_path, rows, expected):
        path = write_duo(tmp_path / "full_attention_heads.tsv", rows)
        with pytest.raises(MaskError, match=expected) as err:
            import_duo(path, SHAPE, model="tiny")
        assert str(path) in str(err.value)

    @pytest.mark.parametrize(
        "text, expected",
        [
            ("0.5\t0.5\t0.5\t0.5\n0.5\tnan\t0.5\t0.5\n", r"line 2, column 2 is nan, expected a finite"),
            ("0.5\t0.5\t0.5\tinf\n", r"line 1, column 4 is inf, expected a finite"),
            ("0.5\t0.5\tfull\t0.5\n", r"line 1, column 3 is 'full', expected a number"),
            ("0.5 0.5 0.5 0.5\n", r"line 1, column 1 is '0.5 0.5 0.5 0.5', expected a number \(tab-separated"),
            ("0.5\t0.5\t0.5\t0.5\n0.5\t0.5\t0.5\n", r"line 2 has 3 tab-separated values, but line 1 has 4"),
            ("0.5\t0.5\t0.5\t0.5\n\n0.5\t0.5\t0.5\t0.5\n", r"line 2 has 1 tab-separated values"),
            ("\n\n", r"empty file"),
        ],
        ids=["nan", "inf", "word", "spaces", "ragged", "blank-line", "empty"],
    )
    def test_malformed_cells_name_line_and_column(self, tmp_path, text, expected):
        path = tmp_path / "full_attention_heads.tsv"
        path.write_text(text)
        with pytest.raises(MaskError, match=expected) as err:
            import_duo(path, SHAPE)
        assert str(path) in str(err.value)

    def test_missing_file(self, tmp_path):
        with pytest.raises(MaskError, match="no such file"):
            import_duo(tmp_path / "absent.tsv", SHAPE)


class TestPruLong:
    BITS = [[1, 0, 0, 1], [0, 0, 0, 0], [1, 1, 0, 1]]

    def test_binary_masks_import_as_mask(self, tmp_path):
        path = write_prulong(tmp_path / "masks_sp0.5.tsv", self.BITS)
        assert path.read_text().splitlines()[0] == "1.0\t0.0\t0.0\t1.0"  # the upstream cell format
        mask = import_prulong(path, SHAPE, model="tiny", window=64)
        assert mask.bits == tuple(tuple(row) for row in self.BITS)  # 1 = full in both conventions
        assert mask.method == "prulong" and mask.window == 64 and mask.swa_ratio == pytest.approx(7 / 12)

    def test_per_query_head_masks_must_agree_within_group(self, tmp_path):
        per_head = [[b for bit in row for b in (bit, bit)] for row in self.BITS]
        assert import_prulong(write_prulong(tmp_path / "a.tsv", per_head), SHAPE).bits == tuple(map(tuple, self.BITS))
        per_head[2][0] = 0  # layer 2, group 0: heads 0 and 1 now disagree
        with pytest.raises(MaskError, match=r"line 3, KV group 0: its 2 query heads disagree"):
            import_prulong(write_prulong(tmp_path / "b.tsv", per_head), SHAPE)

    def test_soft_values_are_rejected(self, tmp_path):
        path = write_duo(tmp_path / "masks.tsv", GATES)
        expected = r"masks.tsv: line 1, column 1 is 0.60546875, expected 0 or 1.*--format duo"
        with pytest.raises(MaskError, match=expected):
            import_prulong(path, SHAPE)

    def test_wrong_layer_count(self, tmp_path):
        path = write_prulong(tmp_path / "masks.tsv", self.BITS + [[1, 1, 1, 1]])
        with pytest.raises(MaskError, match=r"masks.tsv: 4 lines, one per layer, but the model has num_layers=3"):
            import_prulong(path, SHAPE)

    def test_sidecar_checkpoint_config(self, tmp_path):
        checkpoint_config = {"local_window_size": 1024, "sink_size": 128, "hidden_size": 8}
        (tmp_path / "config.json").write_text(json.dumps(checkpoint_config))
        mask = import_prulong(write_prulong(tmp_path / "masks.tsv", self.BITS), SHAPE)
        assert mask.provenance["sidecar_config"]["local_window_size"] == 1024
        assert "hidden_size" not in mask.provenance["sidecar_config"]
        assert (mask.window, mask.sinks) == (1024, 128)


class TestRetrievalJson:
    # Per query head (L×H), lists of per-trial scores as in head_score/*.json.
    TRIALS = [[[0.0, 0.0], [0.1, 0.3], [0.0], [0.0], [0.9, 0.7], [1.0], [0.0], [0.04]] for _ in range(3)]

    def test_per_query_head_lists_become_group_means(self, tmp_path):
        ranking = import_retrieval_json(write_head_scores(tmp_path / "m.json", self.TRIALS), SHAPE)
        # Head means: 0, 0.2, 0, 0, 0.8, 1.0, 0, 0.04 → group means: 0.1, 0, 0.9, 0.02.
        for row in ranking.scores:
            assert row == pytest.approx((0.1, 0.0, 0.9, 0.02))
        assert ranking.more_local == "lower" and ranking.method == "retrieval-head"
        assert ranking.provenance["group_score"] == "mean over query heads"

    def test_retrieval_heads_stay_full(self, tmp_path):
        grid = [[[0.0], [0.5], [0.1], [0.0]], [[0.2], [0.0], [0.0], [0.95]], [[0.0], [0.3], [0.0], [0.0]]]
        ranking = import_retrieval_json(write_head_scores(tmp_path / "kv.json", grid), SHAPE)
        assert ranking.provenance["group_score"] == "per KV group in the file"
        kept_full = {(layer, g) for layer in range(3) for g in range(4)} - swa_cells(ranking.to_mask(0.75))
        assert kept_full == {(1, 3), (0, 1), (2, 1)}  # the three highest retrieval scores

    def test_bare_numbers_are_scores(self, tmp_path):
        path = tmp_path / "razor.json"
        path.write_text(json.dumps({f"{layer}-{h}": layer + h / 10 for layer in range(3) for h in range(4)}))
        assert import_retrieval_json(path, SHAPE).scores[2] == pytest.approx((2.0, 2.1, 2.2, 2.3))

    @pytest.mark.parametrize(
        "change, expected",
        [
            (lambda d: d.pop("1-5"), r"key '1-5' is missing, expected one key per layer and head \(3×8 = 24 keys"),
            (lambda d: d.update({"3-0": [0.0]}), r"keys for 4 layers \(indices 0…3\), but .* num_layers=3"),
            (
                lambda d: d.update({"0-8": [0.0]}),
                r"keys for 9 heads per layer \(indices 0…8\), but the model needs num_kv_heads=4 .* or num_heads=8",
            ),
            (lambda d: d.update({"0-0": [0.1, float("nan")]}), r"key '0-0' holds nan, expected finite scores"),
            (lambda d: d.update({"0-1": ["high"]}), r"key '0-1' holds 'high', expected a number"),
            (lambda d: d.update({"0-2": []}), r"key '0-2' is an empty list"),
            (lambda d: d.update({"layer0-head0": [0.0]}), r"key 'layer0-head0' is not of the form"),
        ],
        ids=["missing-key", "layers", "heads", "nan", "non-numeric", "empty-list", "bad-key"],
    )
    def test_malformed_files_name_file_and_key(self, tmp_path, change, expected):
        data = {f"{layer}-{h}": [0.5] for layer in range(3) for h in range(8)}
        change(data)
        path = tmp_path / "head_score.json"
        path.write_text(json.dumps(data))  # json.dumps writes NaN, json.loads reads it back
        with pytest.raises(MaskError, match=expected) as err:
            import_retrieval_json(path, SHAPE)
        assert str(path) in str(err.value)

    def test_not_an_object(self, tmp_path):
        path = tmp_path / "list.json"
        path.write_text("[1, 2]")
        with pytest.raises(MaskError, match=r"list.json: expected a non-empty JSON object"):
            import_retrieval_json(path, SHAPE)


class TestRoundTripAndUse:
    def test_ranking_round_trip(self, tmp_path):
        ranking = import_duo(write_duo(tmp_path / "f.tsv", GATES), SHAPE, model="tiny", window=32)
        ranking.save(tmp_path / "ranking.json")
        assert json.loads((tmp_path / "ranking.json").read_text())["format"] == "bosch-ranking/1"
        loaded = HeadRanking.load(tmp_path / "ranking.json")
        assert loaded == ranking and loaded.provenance == ranking.provenance

    def test_mask_round_trip(self, tmp_path):
        mask = import_prulong(write_prulong(tmp_path / "masks.tsv", TestPruLong.BITS), SHAPE, window=16)
        mask.save(tmp_path / "mask.json")
        assert HeadMask.load(tmp_path / "mask.json") == mask

    def test_unknown_format(self, tmp_path):
        with pytest.raises(
            MaskError,
            match=r"format: unknown pattern format 'csv', expected one of \['duo', 'prulong', 'retrieval-json'\]",
        ):
            import_pattern("csv", tmp_path / "x", SHAPE)

    @pytest.mark.parametrize("ratio", [0.25, 0.5, 0.75, 0.875])
    def test_imported_ranking_resolves_through_adapter_path(self, tmp_path, ratio):
        config_dir = tiny_config_dir(tmp_path)
        shape = model_shape(str(config_dir))
        assert shape == SHAPE
        out = tmp_path / "ranking.json"
        parser = argparse.ArgumentParser()
        add_import_parser(parser.add_subparsers(dest="command"))
        pattern = write_duo(tmp_path / "f.tsv", GATES)
        argv = ["import", "--format", "duo", str(pattern), "--model", str(config_dir), "--out", str(out)]
        args = parser.parse_args(argv)
        args.run(args)
        mask, source = resolve_mask(
            shape, MaskRequest(ranking=str(out), ratio=ratio, window=8), model_name=str(config_dir)
        )
        assert source == str(out)
        mask.check_fits(shape)
        assert mask.num_swa_groups == ceil_count(ratio, 12) and mask.window == 8
        # DuoAttention's least-gated groups go SWA first.
        by_gate = sorted((GATES[layer][g], (layer, g)) for layer in range(3) for g in range(4))
        assert swa_cells(mask) == {cell for _, cell in by_gate[: ceil_count(ratio, 12)]}


class TestCli:
    def run(self, argv):
        parser = argparse.ArgumentParser()
        add_import_parser(parser.add_subparsers(dest="command"))
        args = parser.parse_args(argv)
        assert args.run is import_main
        return args.run(args)

    def test_prulong_writes_a_mask(self, tmp_path, capsys):
        config_dir = tiny_config_dir(tmp_path)
        path = write_prulong(tmp_path / "masks.tsv", TestPruLong.BITS)
        out = tmp_path / "mask.json"
        argv = ["import", "--format", "prulong", str(path), "--model", str(config_dir), "--out", str(out)]
        self.run([*argv, "--window", "32"])
        mask = HeadMask.load(out)
        assert mask.window == 32 and mask.model == str(config_dir)
        assert "bosch-mask/1" in capsys.readouterr().out

    def test_retrieval_json_with_wrong_model_shape(self, tmp_path):
        config_dir = tiny_config_dir(tmp_path)
        grid = [[[0.1]] * 4 for _ in range(5)]  # five layers: not the tiny model's three
        path = write_head_scores(tmp_path / "scores.json", grid)
        argv = ["import", "--format", "retrieval-json", str(path), "--model", str(config_dir), "--out", "o.json"]
        expected = r"scores.json: keys for 5 layers \(indices 0…4\), but the model \(.*tiny-model\) has num_layers=3"
        with pytest.raises(MaskError, match=expected):
            self.run(argv)

    def test_unreadable_model(self, tmp_path):
        with pytest.raises(ModelError, match=r"no-model-here': no such directory"):
            model_shape(str(tmp_path / "no-model-here"))
        (tmp_path / "broken").mkdir()
        (tmp_path / "broken" / "config.json").write_text("{not json")
        with pytest.raises(ModelError, match=r"broken': cannot read its config"):
            model_shape(str(tmp_path / "broken"))
