"""sink=S from the user to the model: the adapter's model_arg, mask sources, the KV-bytes
column of a comparison entry."""

from __future__ import annotations

import pytest

from bosch_eval.attention.local_window import SINK_RULE, LocalWindow
from bosch_eval.compare.kv_bytes import entry_kv_bytes
from bosch_eval.masks.head_mask import HeadMask, ModelShape
from bosch_eval.masks.mask_sources import MaskRequest, resolve_mask
from bosch_eval.model_adapters.bosch import BoschLM
from bosch_eval.runtime.errors import MaskError

SHAPE = ModelShape(2, 4, 2)


def test_sink_overrides_the_masks_own_and_survives_mask_swaps(tiny_model_dir, tmp_path):
    HeadMask.from_rows([[1, 0, 1, 0], [0, 0, 0, 0], [1, 1, 1, 0]], 8, window=6, sinks=2).save(tmp_path / "mask.json")
    from_file = BoschLM(pretrained=str(tiny_model_dir), device="cpu", mask=str(tmp_path / "mask.json"))
    assert from_file.hybrid.local == LocalWindow(6, 2)
    lm = BoschLM(pretrained=str(tiny_model_dir), device="cpu", mask=str(tmp_path / "mask.json"), sink=5)
    info = lm.get_model_info()
    assert lm.hybrid.local == LocalWindow(6, 5) and info["bosch_sinks"] == 5 and info["bosch_sink_rule"] == SINK_RULE
    lm.set_mask(
        HeadMask.from_rows([[0, 0, 0, 0], [0, 1, 1, 1], [1, 1, 1, 1]], 8, window=6)
    )  # sink= from construction still wins
    assert lm.hybrid.local == LocalWindow(6, 5)


def test_bad_sink_names_the_argument():
    with pytest.raises(MaskError, match="sink: expected an integer >= 0"):
        resolve_mask(SHAPE, MaskRequest(layers="intr", ratio=0.5, window=4, sinks=-2))
    mask, _ = resolve_mask(SHAPE, MaskRequest(layers="intr", ratio=0.5, window=4, sinks=3))
    assert mask.local == LocalWindow(4, 3)


def test_an_entrys_sink_counts_in_its_kv_bytes():
    mask = HeadMask.from_rows([[0, 0], [0, 0]], 4, window=9)  # every group SWA: 8 positions each
    assert entry_kv_bytes({}, mask, 9, 100) == pytest.approx(8 / 100)
    assert entry_kv_bytes({"sink": "4"}, mask, 9, 100) == pytest.approx(12 / 100)
    assert entry_kv_bytes({}, mask.with_meta(sinks=4), 9, 100) == pytest.approx(12 / 100)


def test_a_comparisons_sink_is_in_every_runs_mask_and_kv_bytes(tiny_model_dir, tmp_path):
    """sink= for the whole comparison (its model_args) or one entry: the adapter runs every SWA
    group with it, so the run's recorded mask, and the KV bytes read from it, carry it too."""
    from bosch_eval.compare.runner import plan_runs
    from bosch_eval.compare.spec import load_spec

    config = tmp_path / "compare.yaml"
    config.write_text(
        f"model: {tiny_model_dir}\nmodel_args: device=cpu,sink=4\ntasks: [bosch_niah_calib]\n"
        "entries:\n  - original=\n  - intr=layers=intr,ratio=0.5,window=8\n  - own=layers=intr,ratio=0.5,window=8,sink=1\n"
    )
    plan = {item.entry.name: item.mask for item in plan_runs(load_spec(config))}
    assert plan["intr"].sinks == 4 and plan["own"].sinks == 1
    swa = plan["intr"].swa_ratio
    assert entry_kv_bytes({}, plan["intr"], 9, 100) == pytest.approx(
        swa * 12 / 100 + (1 - swa)
    )  # 8 + 4 cached positions of 100


@pytest.mark.slow
def test_stock_lm_eval_answers_do_not_depend_on_the_batch_size_with_sinks():
    """lm-eval's generation batches are left-padded: with sinks, batch 1 and batch 8 give
    every document the same answer (fp32, the bundled toy model, rows of two lengths, tasks
    found as the stock CLI finds them)."""
    import lm_eval

    answers = {}
    metadata = {"max_seq_lengths": [256, 512], "num_samples": 4}  # lm-eval adds the model_args (the tokenizer)
    for batch_size in (1, 8):
        out = lm_eval.simple_evaluate(
            model="bosch", model_args="pretrained=toy,dtype=float32,layers=intr,ratio=0.75,window=32,sink=4", device="cpu",
            batch_size=batch_size, tasks=["bosch_niah_single_1"], metadata=metadata, log_samples=True,
            bootstrap_iters=0, gen_kwargs={"max_gen_toks": 24},
        )  # fmt: skip
        answers[batch_size] = {sample["doc_id"]: sample["resps"] for sample in out["samples"]["bosch_niah_single_1"]}
        assert out["config"]["bosch_sink_rule"] == SINK_RULE
    assert len(answers[1]) == 8 and answers[1] == answers[8]
    assert len({str(resps) for resps in answers[1].values()}) > 1  # real answers, not one empty string
