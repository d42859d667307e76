"""The latency/memory benchmark: structure, KV bytes against the formula, the CLI end to end."""

from __future__ import annotations

import json
import time

import pytest
import torch
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

import bosch_eval.bench as bench
from bosch_eval.bench import balanced_mask, peak_memory, ratio_table, run_bench
from bosch_eval.cli import main
from bosch_eval.masks import ModelShape
from bosch_eval.random_model import random_model


def test_balanced_mask_spreads_swa_groups_over_layers():
    mask = balanced_mask(ModelShape(4, 8, 4), 0.75, window=8)
    assert mask.num_swa_groups == 12 and all(row.count(0) == 3 for row in mask.bits)


def test_rows_and_kv_bytes_match_the_formula():
    model = random_model("qwen3", num_layers=4)
    rows = run_bench(model, [("r", 0.75)], lengths=[64], decode_tokens=2, repeats=1)
    original, hybrid = rows
    assert (original.label, hybrid.label, hybrid.window) == ("original", "r", 2)  # W = T/32
    per_token = 2 * model.config.head_dim * 4  # K and V, fp32
    assert original.kv_cache_bytes == 4 * 4 * 64 * per_token
    assert hybrid.kv_cache_bytes == 4 * (1 * 64 + 3 * min(64, 2 - 1)) * per_token
    assert "| r | 0.75 | 2 | 64 |" in ratio_table(rows)
    assert 0 < hybrid.attention_share < 1 and 0 < original.attention_share < 1


def test_attention_timer_restores_the_registry():
    model = random_model("qwen3", num_layers=2)
    registered = ALL_ATTENTION_FUNCTIONS["sdpa"]
    with bench.attention_seconds(model) as seconds:
        assert ALL_ATTENTION_FUNCTIONS["sdpa"] is not registered
        with torch.no_grad():
            model(input_ids=torch.arange(16)[None])
        assert seconds() > 0
    assert ALL_ATTENTION_FUNCTIONS["sdpa"] is registered


def test_cli_writes_table_json_and_plots(tmp_path, capsys):
    assert main(["bench", "--model", "random:attn-heavy", "--lengths", "64", "--decode-tokens", "2", "--repeats", "1",
                 "--windows", "4", "8", "--out", str(tmp_path)]) == 0  # fmt: skip
    report = json.loads((tmp_path / "bench.json").read_text())
    assert report["environment"]["torch"] and len(report["rows"]) == 2
    assert [row["window"] for row in report["window_sweep"]] == [None, 4, 8]
    assert (tmp_path / "bench.png").stat().st_size > 0 and (tmp_path / "bench_windows.png").stat().st_size > 0
    assert "prefill time ratio" in capsys.readouterr().out



@pytest.mark.parametrize("reset_works", [True, False], ids=["linux-peak-rss", "sampled-rss"])
def test_peak_memory_sees_a_transient_allocation(monkeypatch, reset_works):
    if not reset_works:
        monkeypatch.setattr(bench, "_reset_peak_rss", lambda: False)
    elif not bench._reset_peak_rss():
        pytest.skip("no /proc/self/clear_refs here")
    size = 256 * 2**20
    with peak_memory(torch.device("cpu")) as peak:
        buffer = torch.ones(size // 4)  # written, so every page is resident
        time.sleep(0.02)  # the sampler looks every millisecond
        del buffer
    assert 0.95 * size <= peak() <= size + 64 * 2**20


def test_tensor_memory_peak_counts_live_tensors_only():
    before = torch.ones(4_000_000)  # allocated before the block: not counted
    with bench.tensor_memory_peak() as peak:
        kept = torch.ones(1_000_000)  # 4 MB, still live at the end
        temporary = kept * 2  # +4 MB
        del temporary
        joined = torch.cat([kept, kept])  # +8 MB on top of the 4 kept: the peak
        del joined
    assert 12_000_000 <= peak() <= 12_000_000 + 64  # + the few bytes of a scalar operand
    with bench.tensor_memory_peak(since="late") as late:
        big = torch.ones(2_000_000)  # 8 MB, freed before the label
        del big
        held = torch.ones(1_000_000)
        with torch.profiler.record_function("late"):
            extra = held + 1  # 4 MB on top of the 4 held
    assert 8_000_000 <= late() <= 8_000_000 + 64
    del before, kept, held, extra


def test_decode_peak_holds_the_cache_and_sees_quantization_shrink_it():
    from bosch_eval.kv_quant.config import KVQuantConfig

    model = random_model("qwen3", num_layers=4)
    ids = torch.randint(0, model.config.vocab_size, (1, 512), generator=torch.Generator().manual_seed(0))
    original = bench.decode_peak(model, ids, None, bench._set_up(model, None, 16))
    quantized = bench.decode_peak(model, ids, None, bench._set_up(model, None, 16, KVQuantConfig("kivi", bits=2, window=16, group_size=model.config.head_dim)))
    held = 4 * model.config.num_key_value_heads * 2 * model.config.head_dim * 4  # bytes per token over all layers, fp32
    assert original >= 512 * held  # the cache itself
    assert quantized < original
