"""Head masks and rankings: geometry, ranking → mask, JSON round trips and every bad input."""

from __future__ import annotations

import json

import pytest

from bosch_eval.attention.local_window import LocalWindow
from bosch_eval.masks.head_mask import HeadMask, HeadRanking, ModelShape, ceil_count, check_ratio, uniform_bit
from bosch_eval.masks.layer_heuristics import LAYER_HEURISTICS, layer_heuristic_mask
from bosch_eval.runtime.errors import MaskError

SHAPE = ModelShape(num_layers=3, num_heads=8, num_kv_heads=4)


def write(tmp_path, data, name="mask.json"):
    path = tmp_path / name
    path.write_text(json.dumps(data))
    return path


def mask_json(**changes):
    data = HeadMask.from_rows([[1, 0, 1, 1], [0, 0, 1, 0], [1, 1, 1, 1]], 8, window=32, model="tiny").to_json()
    data.update(changes)
    return data


class TestModelShape:
    def test_head_dim_of_a_config_with_and_without_head_dim(self):
        from transformers import LlamaConfig

        assert ModelShape.head_dim_of(LlamaConfig(hidden_size=64, num_attention_heads=4, head_dim=32)) == 32
        config = LlamaConfig(hidden_size=64, num_attention_heads=4)
        del config.head_dim  # configs that omit it: hidden_size // num_attention_heads
        assert ModelShape.head_dim_of(config) == 16


class TestHeadMask:
    def test_ratio_and_query_head_expansion(self):
        mask = HeadMask.from_rows([[1, 0], [0, 0]], num_heads=4)
        assert mask.swa_ratio == 0.75
        assert mask.query_head_bits() == [[1, 1, 0, 0], [0, 0, 0, 0]]

    def test_json_round_trip(self, tmp_path):
        mask = HeadMask.from_rows([[1, 0, 1, 1], [0, 0, 1, 0], [1, 1, 1, 1]], 8, window=32, method="bosch")
        mask.save(tmp_path / "m.json")
        loaded = HeadMask.load(tmp_path / "m.json")
        assert loaded == mask
        assert json.loads((tmp_path / "m.json").read_text())["swa_ratio"] == pytest.approx(4 / 12)

    def test_sinks_are_optional_in_the_file(self, tmp_path):
        plain = HeadMask.from_rows([[1, 0]], 4, window=32)
        assert "sinks" not in plain.to_json() and plain.sinks == 0  # files without sinks read and write as before
        with_sinks = plain.with_meta(sinks=4)
        with_sinks.save(tmp_path / "m.json")
        loaded = HeadMask.load(tmp_path / "m.json")
        assert loaded == with_sinks and loaded.local == LocalWindow(32, 4) and loaded != plain
        data = with_sinks.to_json() | {"sinks": -1}
        with pytest.raises(MaskError, match=r"m.json: field 'sinks': expected an integer >= 0"):
            HeadMask.from_json(data, "m.json")

    def test_a_rankings_sinks_go_to_its_masks(self):
        ranking = HeadRanking(((0.1, 0.9),), "higher", "fisher", 2, window=8, sinks=2)
        assert HeadRanking.from_json(ranking.to_json()).to_mask(0.5).local == LocalWindow(8, 2)

    def test_save_creates_the_folder(self, tmp_path):
        mask = HeadMask.from_rows([[1, 0]], 2, window=4)
        mask.save(tmp_path / "new" / "dir" / "m.json")
        assert HeadMask.load(tmp_path / "new" / "dir" / "m.json") == mask

    @pytest.mark.parametrize(
        ("changes", "message"),
        [
            ({"format": "bosch-mask/2"}, r"field 'format' is 'bosch-mask/2', expected 'bosch-mask/1'"),
            ({"mask": [[1, 0, 1, 1], [0, 2, 1, 0], [1, 1, 1, 1]]}, r"entry \[1\]\[1\] is 2, expected 0 \(SWA\) or 1"),
            ({"mask": [[1, 0, 1, 1], [0, 0.5, 1, 0], [1, 1, 1, 1]]}, r"entry \[1\]\[1\] is 0.5"),
            ({"mask": [[1, 0, 1, 1], [0, True, 1, 0], [1, 1, 1, 1]]}, r"entry \[1\]\[1\] is True"),
            ({"mask": [[1, 0, 1, 1], [0, 0, 1], [1, 1, 1, 1]]}, r"row 1 has 3 entries, expected num_kv_heads=4"),
            ({"num_layers": 4}, r"field 'mask' has 3 rows, expected num_layers=4"),
            ({"num_heads": 6}, r"num_heads=6 is not a multiple of num_kv_heads=4"),
            ({"window": 0}, r"field 'window'.*expected a positive integer"),
            ({"swa_ratio": 0.5}, r"field 'swa_ratio' is 0.5, but the mask has 4 SWA groups"),
        ],
    )
    def test_bad_files_name_file_field_and_expectation(self, tmp_path, changes, message):
        path = write(tmp_path, mask_json(**changes))
        with pytest.raises(MaskError, match=message) as info:
            HeadMask.load(path)
        assert str(path) in str(info.value)

    def test_missing_field_and_missing_file(self, tmp_path):
        data = mask_json()
        del data["num_kv_heads"]
        with pytest.raises(MaskError, match=r"mask.json: missing field 'num_kv_heads'"):
            HeadMask.load(write(tmp_path, data))
        with pytest.raises(MaskError, match=r"nope.json: no such file"):
            HeadMask.load(tmp_path / "nope.json")
        (tmp_path / "bad.json").write_text("{")
        with pytest.raises(MaskError, match=r"bad.json: not valid JSON"):
            HeadMask.load(tmp_path / "bad.json")

    def test_mask_made_for_another_model(self):
        mask = HeadMask.from_json(mask_json())
        with pytest.raises(
            MaskError, match=r"m.json: field 'num_kv_heads' is 4, but the model \(other\) has num_kv_heads=2"
        ):
            mask.check_fits(ModelShape(3, 8, 2), source="m.json", model="other")


class TestRatios:
    @pytest.mark.parametrize("ratio", [-0.1, 1.5, "0.5", True, float("nan")])
    def test_ratio_outside_unit_interval(self, ratio):
        with pytest.raises(MaskError, match="expected an SWA ratio in"):
            check_ratio(ratio)

    def test_ceil_count_ignores_float_noise(self):
        assert ceil_count(0.1, 30) == 3  # 0.1 * 30 == 3.0000000000000004
        assert ceil_count(0.75, 12) == 9
        assert ceil_count(0.76, 12) == 10

    def test_only_ratios_0_and_1_leave_one_mask(self):
        # The bit of the one mask there is; every ratio in between leaves a choice, even one
        # whose ⌈ρ·n⌉ is 0 or n for a small n.
        assert (uniform_bit(0), uniform_bit(0.0), uniform_bit(1), uniform_bit(1.0)) == (1, 1, 0, 0)
        assert [uniform_bit(r) for r in (1e-9, 0.5, 1 - 1e-9)] == [None, None, None]
        with pytest.raises(MaskError, match="expected an SWA ratio"):
            uniform_bit(1.5)


class TestHeadRanking:
    def ranking(self, more_local="higher"):
        scores = [[0.9, 0.1, 0.5, 0.5], [0.2, 0.8, 0.3, 0.7], [0.0, 0.6, 0.4, 1.0]]
        return HeadRanking.from_json(
            {"format": "bosch-ranking/1", "method": "dcam", "more_local": more_local, "num_heads": 8, "scores": scores}
        )

    def test_most_local_groups_become_swa(self):
        mask = self.ranking("higher").to_mask(0.25, window=16)  # ⌈0.25·12⌉ = 3 groups
        assert mask.bits == ((0, 1, 1, 1), (1, 0, 1, 1), (1, 1, 1, 0))
        assert mask.window == 16
        low = self.ranking("lower").to_mask(0.25)
        assert low.bits == ((1, 0, 1, 1), (0, 1, 1, 1), (0, 1, 1, 1))

    def test_ties_break_by_layer_then_group(self):
        mask = self.ranking("higher").to_mask(4 / 12 + 1 / 12)  # 5 groups; 0.5 ties at [0][2], [0][3]
        assert mask.num_swa_groups == 5
        assert mask.bits[0] == (0, 1, 1, 1)

    @pytest.mark.parametrize(
        ("changes", "message"),
        [
            ({"format": "bosch-mask/1"}, r"field 'format' is 'bosch-mask/1', expected 'bosch-ranking/1'"),
            ({"more_local": "up"}, r"field 'more_local' is 'up', expected 'higher' or 'lower'"),
            ({"scores": [[0.1, "x"]]}, r"field 'scores' entry \[0\]\[1\] is 'x', expected a number"),
            ({"scores": [[0.1, float("nan")]]}, r"entry \[0\]\[1\] is nan, expected a finite number"),
            ({"num_layers": 5}, r"field 'num_layers' is 5, but 'scores' has 1"),
        ],
    )
    def test_bad_rankings(self, tmp_path, changes, message):
        data = {
            "format": "bosch-ranking/1",
            "method": "dcam",
            "more_local": "higher",
            "num_heads": 4,
            "scores": [[0.1, 0.2]],
        }
        data.update(changes)
        with pytest.raises(MaskError, match=message):
            HeadRanking.load(write(tmp_path, data, "ranking.json"))


class TestLayerHeuristics:
    @pytest.mark.parametrize("name", sorted(LAYER_HEURISTICS))
    @pytest.mark.parametrize("ratio", [0.0, 0.25, 0.5, 0.75, 0.875, 1.0])
    def test_exactly_ceil_ratio_layers_are_swa(self, name, ratio):
        shape = ModelShape(28, 16, 8)
        mask = layer_heuristic_mask(name, shape, ratio, seed=0)
        swa_layers = [i for i, row in enumerate(mask.bits) if not any(row)]
        assert len(swa_layers) == ceil_count(ratio, 28)
        assert all(set(row) in ({0}, {1}) for row in mask.bits)

    def test_placements(self):
        shape = ModelShape(8, 4, 2)
        full_layers = {
            name: [i for i, row in enumerate(layer_heuristic_mask(name, shape, 0.5, seed=0).bits) if row[0]]
            for name in ("intr", "bme")
        }
        assert full_layers == {"intr": [1, 3, 5, 7], "bme": [0, 1, 4, 7]}

    def test_rand_depends_on_seed_only(self):
        shape = ModelShape(28, 16, 8)
        assert layer_heuristic_mask("rand", shape, 0.5, 1) == layer_heuristic_mask("rand", shape, 0.5, 1)
        assert layer_heuristic_mask("rand", shape, 0.5, 1) != layer_heuristic_mask("rand", shape, 0.5, 2)

    def test_unknown_heuristic(self):
        with pytest.raises(
            MaskError, match=r"layers: unknown layer heuristic 'middle', expected one of \['bme', 'intr', 'rand'\]"
        ):
            layer_heuristic_mask("middle", SHAPE, 0.5, 0)
        with pytest.raises(MaskError, match=r"unknown layer heuristic 'inter', .* \(did you mean 'intr'\?\)$"):
            layer_heuristic_mask("inter", SHAPE, 0.5, 0)
