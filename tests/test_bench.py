"""The latency/memory benchmark: structure, KV bytes against the formula, the CLI end to end."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from unittest import mock

import pytest
import torch
from transformers import DynamicCache
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

import bosch_eval.bench.memory as memory
import bosch_eval.bench.runner as bench
from bosch_eval.attention.hybrid_attention import hybridize
from bosch_eval.bench.memory import peak_memory
from bosch_eval.bench.report import ratio_table, speedups
from bosch_eval.bench.runner import BenchPlan, BenchRow, Measurement, balanced_mask, drawn_mask, run_bench, stopwatch
from bosch_eval.caches.hybrid_cache import HybridCache
from bosch_eval.cli import main
from bosch_eval.masks.head_mask import ModelShape
from bosch_eval.models.random_model import random_model
from bosch_eval.runtime.errors import SettingsError


def test_a_ratio_is_timed_on_a_mask_whose_layers_hold_different_swa_counts():
    """What a search or a ranking returns: bench must time the kernels' per-layer specialization."""
    mask = drawn_mask(ModelShape(28, 16, 8), 0.75, window=8)
    counts = {row.count(0) for row in mask.bits}
    assert mask.num_swa_groups == 168 and len(counts) >= 4
    assert drawn_mask(ModelShape(28, 16, 8), 0.75, window=8).bits == mask.bits  # seeded: the same mask every run


def test_balanced_mask_spreads_swa_groups_over_layers():
    mask = balanced_mask(ModelShape(4, 8, 4), 0.75, window=8)
    assert mask.num_swa_groups == 12 and all(row.count(0) == 3 for row in mask.bits)


def test_rows_and_kv_bytes_match_the_formula():
    model = random_model("qwen3", num_layers=4)
    rows = run_bench(model, [("r", 0.75)], BenchPlan([64], 2, repeats=1))
    original, hybrid = rows
    assert (original.label, hybrid.label, hybrid.window) == ("original", "r", 2)  # W = T/32
    per_token = 2 * model.config.head_dim * 4  # K and V, fp32
    assert original.kv_cache_bytes == 4 * 4 * 64 * per_token
    assert hybrid.kv_cache_bytes == 4 * (1 * 64 + 3 * min(64, 2 - 1)) * per_token
    assert "| r | 0.75 | 2 | 64 |" in ratio_table(rows)
    assert 0 < hybrid.attention_share < 1 and 0 < original.attention_share < 1
    # A CPU's prefill peak holds at least the KV cache the prefill writes (issue 68: the resident set read ~0).
    assert original.prefill_peak_bytes >= original.kv_cache_bytes and hybrid.prefill_peak_bytes >= hybrid.kv_cache_bytes


def test_bench_gives_the_model_back_as_it_was():
    """Each configuration is hybridized for its runs only (a with-block), as lm-eval's
    hf_steered applies its patch: afterwards the plain model, its attention and config."""
    model = random_model("qwen3", num_layers=4)
    ids = torch.randint(0, model.config.vocab_size, (1, 16), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        before = model(input_ids=ids).logits
    run_bench(model, [("r", 0.75)], BenchPlan([32], 1, repeats=1, warmup=0, profile=False))
    assert not hasattr(model, "bosch_hybrid") and "bosch_mask" not in vars(model.config)
    assert model.config._attn_implementation == "sdpa"
    with torch.no_grad():
        assert torch.equal(model(input_ids=ids).logits, before)
    hybridize(model, balanced_mask(ModelShape.from_config(model.config), 0.5, window=4))
    with pytest.raises(SettingsError, match="already hybridized"):
        run_bench(model, [("r", 0.75)], BenchPlan([32], 1, repeats=1, warmup=0, profile=False))


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
    assert [row["backend"] for row in report["rows"]] == [None, "blocked"]  # auto on a CPU
    assert (tmp_path / "bench.png").stat().st_size > 0 and (tmp_path / "bench_windows.png").stat().st_size > 0
    out = capsys.readouterr().out
    assert "prefill time ratio" in out and "decode ×8 time ratio" in out
    assert report["peak_memory"].startswith("CPU peaks: tensor bytes") and report["peak_memory"] in out
    assert all(row["prefill_peak_bytes"] > 0 for row in report["rows"])


def test_cli_backend_and_no_profile(tmp_path):
    assert main(["bench", "--model", "random:attn-heavy", "--lengths", "32", "64", "--decode-tokens", "1", "--repeats", "1",
                 "--backend", "sdpa", "--no-profile", "--decode-batch", "2", "--out", str(tmp_path)]) == 0  # fmt: skip
    report = json.loads((tmp_path / "bench.json").read_text())
    rows = report["rows"]
    assert [(r["length"], r["backend"], r["decode_batch"], r["attention_share"]) for r in rows] == [
        (32, None, 2, None), (32, "sdpa", 2, None), (64, None, 2, None), (64, "sdpa", 2, None)
    ]  # fmt: skip
    # A CPU's peaks come from the profiled run: without it, "-" and the reason under the table.
    assert all(r["prefill_peak_bytes"] is None and r["decode_peak_bytes"] is None for r in rows)
    assert report["peak_memory"].startswith("Peaks: - (not measured: --no-profile")
    assert report["peak_memory"] in (tmp_path / "bench.md").read_text()


def test_cli_prints_no_profiler_log_lines(tmp_path):
    """Issue 68: libkineto printed "USDT: ... profiler_start/stop" at every profiled run (two per
    configuration and length). A fresh process, since libkineto reads its log level once."""
    env = {key: value for key, value in os.environ.items() if key != "KINETO_LOG_LEVEL"}
    argv = ["bench", "--model", "random:attn-heavy", "--lengths", "32", "--decode-tokens", "1", "--decode-batch", "2",
            "--repeats", "1", "--warmup", "0", "--out", str(tmp_path)]  # fmt: skip
    done = subprocess.run(
        [sys.executable, "-c", f"from bosch_eval.cli import main; raise SystemExit(main({argv!r}))"],
        capture_output=True, text=True, env=env, timeout=300,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    rows = json.loads((tmp_path / "bench.json").read_text())["rows"]
    assert all(row["decode_peak_bytes"] > 0 for row in rows)  # the profiler ran
    assert "USDT" not in done.stdout + done.stderr and "profiler_st" not in done.stdout + done.stderr


def test_cli_refuses_bad_settings_before_loading_the_weights(tmp_path, capsys):
    with mock.patch("bosch_eval.bench.cli._bench_model", side_effect=AssertionError("loaded the weights")):
        assert main(["bench", "--model", "random:attn-heavy", "--backend", "fast", "--out", str(tmp_path)]) == 2
        assert "--backend: expected one of ['auto', 'sdpa', 'blocked', 'flex'" in capsys.readouterr().err
        assert (
            main(
                [
                    "bench",
                    "--model",
                    "random:attn-heavy",
                    "--backend",
                    "flash_attention_2",
                    "--device",
                    "cpu",
                    "--out",
                    str(tmp_path),
                ]
            )
            == 2
        )
        assert "needs a CUDA model" in capsys.readouterr().err
        for flag, value in (("--repeats", "0"), ("--warmup", "-1"), ("--decode-batch", "0")):
            with pytest.raises(SystemExit):
                main(["bench", "--model", "random:attn-heavy", flag, value, "--out", str(tmp_path)])
            assert f"argument {flag}: expected an integer >= " in capsys.readouterr().err


def _scripted_measure(script: dict[str, list[float]]):
    """A fake :func:`bench.measure` returning, per kind of cache (original or hybrid), the next
    seconds of its script for prefill and for both decodes; it records each call's kind."""
    calls: list[str] = []

    def fake(model, ids, decode_tokens, chunk, cache, decode_batch=8, forward=None):
        kind = "hybrid" if isinstance(cache, HybridCache) else "original"
        calls.append(kind)
        seconds = script[kind].pop(0)
        return Measurement(seconds, seconds / 10, seconds / 5, 1000, int(seconds * 100))

    return fake, calls


def test_warm_up_runs_first_and_is_not_counted_and_rows_report_medians(monkeypatch):
    model = random_model("qwen3", num_layers=2)
    # 100 s: the warm-up run of each configuration (cold start), which no row may show.
    fake, calls = _scripted_measure({"original": [100.0, 1.0, 9.0, 2.0], "hybrid": [100.0, 4.0, 3.0, 50.0]})
    monkeypatch.setattr(bench, "measure", fake)
    original, hybrid = run_bench(model, [("r", 0.75)], BenchPlan([64], 2, repeats=3, profile=False))
    assert calls == ["original", "hybrid"] * 4  # one warm-up each, then three interleaved repeats
    # Medians (2 and 4 s), not means (4 and 19 s) and not the warm-up's 100 s.
    assert original.prefill_tokens_per_s == pytest.approx(64 / 2.0) and hybrid.prefill_tokens_per_s == pytest.approx(
        64 / 4.0
    )
    assert original.decode_tokens_per_s == pytest.approx(10 / 2.0) and hybrid.decode_tokens_per_s == pytest.approx(
        10 / 4.0
    )
    assert original.decode_batch_tokens_per_s == pytest.approx(8 * 5 / 2.0)
    assert (original.prefill_peak_bytes, hybrid.prefill_peak_bytes) == (200, 400)
    assert original.attention_share is None and hybrid.decode_peak_bytes is None and hybrid.backend == "blocked"


def test_no_warm_up_when_asked_and_progress_after_each_length(monkeypatch):
    model = random_model("qwen3", num_layers=2)
    fake, calls = _scripted_measure({"original": [1.0, 1.0], "hybrid": [2.0, 2.0]})
    monkeypatch.setattr(bench, "measure", fake)
    seen = []
    run_bench(
        model,
        [("r", 0.5)],
        BenchPlan([32, 64], 1, repeats=1, warmup=0, profile=False),
        progress=lambda rows: seen.append([r.length for r in rows]),
    )
    assert calls == ["original", "hybrid"] * 2 and seen == [[32, 32], [32, 32, 64, 64]]


@pytest.mark.parametrize("hybrid", [False, True], ids=["original", "hybrid"])
def test_measure_decodes_at_batch_1_then_batch_8_on_the_prefilled_cache(monkeypatch, hybrid):
    model = random_model("qwen3", num_layers=2)
    cache = DynamicCache()
    if hybrid:
        hybridize(model, balanced_mask(bench.ModelShape.from_config(model.config), 0.5, 4), window=4)
        cache = HybridCache.for_model(model)
    shapes, timed = [], []
    model.register_forward_pre_hook(
        lambda module, args, kwargs: shapes.append(tuple(kwargs["input_ids"].shape)), with_kwargs=True
    )
    real_stopwatch = bench.stopwatch

    def spy(device):
        timed.append(len(shapes))  # forward calls before this timer started
        return real_stopwatch(device)

    monkeypatch.setattr(bench, "stopwatch", spy)
    ids = torch.randint(0, model.config.vocab_size, (1, 20), generator=torch.Generator().manual_seed(0))
    result = bench.measure(model, ids, decode_tokens=3, chunk=None, cache=cache, decode_batch=8)
    assert shapes == [(1, 20)] + [(1, 1)] * 3 + [(8, 1)] * 3
    assert timed == [0, 1, 4]  # prefill, batch-1 decode and batch-8 decode each timed on their own
    layer = cache.layers[0]  # a hybrid one: groups 0 and 1 of layer 0 are SWA
    assert cache.get_seq_length() == 26 and (layer.ring.keys if hybrid else layer.keys).shape[0] == 8
    assert result.prefill_s > 0 and result.decode_s > 0 and result.decode_batch_s > 0


def test_stopwatch_synchronizes_cuda_around_the_block():
    """The CUDA path on a CPU machine: kernels queued in the block finish inside the timing."""
    events = []

    def synchronize(device=None):
        events.append(("sync", str(device)))
        if len(events) > 1:
            time.sleep(0.05)  # the block's queued kernels finishing

    with mock.patch("torch.cuda.synchronize", side_effect=synchronize):
        with stopwatch(torch.device("cuda")) as elapsed:
            events.append("block")  # launches return at once
        assert events == [("sync", "cuda"), "block", ("sync", "cuda")] and elapsed() >= 0.05
        events.clear()
        with stopwatch(torch.device("cpu")) as elapsed:
            events.append("block")
        assert events == ["block"] and elapsed() >= 0


def test_peak_memory_on_cuda_is_the_allocator_peak_after_a_reset():
    cuda = torch.device("cuda")
    with (
        mock.patch("torch.cuda.synchronize"),
        mock.patch("torch.cuda.reset_peak_memory_stats") as reset,
        mock.patch("torch.cuda.memory_allocated", return_value=1000),
        mock.patch("torch.cuda.max_memory_allocated", return_value=5000),
    ):
        with peak_memory(cuda) as peak:
            reset.assert_called_once_with(cuda)
        assert peak() == 4000  # above what was allocated at the start (the weights)


def test_speedups_are_tokens_per_second_over_the_same_runs_original():
    def row(label, prefill, decode, batch, peak, kv):
        return BenchRow(label, 0.5 if label != "original" else 0.0, 4, 64, prefill, decode, kv, peak, None, decode_batch=8,
                        decode_batch_tokens_per_s=batch, backend=None if label == "original" else "sdpa")  # fmt: skip

    rows = [row("original", 100.0, 10.0, 40.0, 1000, 800), row("h", 150.0, 9.0, 60.0, 900, 200)]
    (ratio,) = speedups(rows)
    assert ratio == {"label": "h", "backend": "sdpa", "length": 64, "swa_ratio": 0.5, "window": 4, "prefill": 1.5,
                     "decode_batch_1": 0.9, "decode_batch_8": 1.5, "prefill_peak": 0.9, "kv_bytes": 0.25,
                     "warmup_s": None, "compiles": 0}  # fmt: skip
    for peak in (0, -100, None):  # never a ratio over a peak that is not positive, or not measured (a CPU's)
        rows[0] = row("original", 100.0, 10.0, 40.0, peak, 800)
        assert speedups(rows)[0]["prefill_peak"] is None
        assert "| 0.2500 | - | - |" in ratio_table(rows).splitlines()[3]  # KV ratio, then both peak ratios
    rows = [row("original", 100.0, 10.0, 40.0, 2**20, 800), row("h", 150.0, 9.0, 60.0, None, 200)]
    assert speedups(rows)[0]["prefill_peak"] is None
    original, hybrid = ratio_table(rows).splitlines()[2:]
    assert "| 800 | 1.0 | - |" in original and "| 200 | - | - |" in hybrid and "| 0.2500 | - | - |" in hybrid


def test_peak_memory_on_a_cpu_is_left_to_the_profiled_run():
    """The resident set cannot show a step's memory (the C allocator reuses what it kept), and the
    profiler would slow the timed block: a CPU's peak is not measured in it."""
    with peak_memory(torch.device("cpu")) as peak:
        buffer = torch.ones(1_000_000)
    assert peak() is None
    del buffer


def test_tensor_memory_peak_sees_memory_the_allocator_reuses():
    """A step that allocates 200 MB (written) and frees it reads 200 MB, also when the C allocator
    serves it from memory it kept resident after an earlier step (where the resident set stays flat)."""
    size, pieces = 200 * 2**20, 50
    for _ in range(2):  # the second pass reuses what the first freed
        with memory.tensor_memory_peak() as peak:
            chunks = [torch.ones(size // pieces // 4) for _ in range(pieces)]
            del chunks
        assert size <= peak() <= size + 2**20
        with memory.tensor_memory_peak() as peak:
            buffer = torch.ones(size // 4)
            del buffer
        assert size <= peak() <= size + 2**20


def test_tensor_memory_peak_counts_live_tensors_only():
    before = torch.ones(4_000_000)  # allocated before the block: not counted
    with memory.tensor_memory_peak() as peak:
        kept = torch.ones(1_000_000)  # 4 MB, still live at the end
        temporary = kept * 2  # +4 MB
        del temporary
        joined = torch.cat([kept, kept])  # +8 MB on top of the 4 kept: the peak
        del joined
    assert 12_000_000 <= peak() <= 12_000_000 + 64  # + the few bytes of a scalar operand
    with memory.tensor_memory_peak() as peak:
        big = torch.ones(2_000_000)  # 8 MB, freed before the label
        del big
        held = torch.ones(1_000_000)
        with torch.profiler.record_function("late"):
            extra = held + 1  # 4 MB on top of the 4 held
        after = torch.ones(4_000_000)  # 16 MB more, after the label's span
    assert 8_000_000 <= peak("late") <= 8_000_000 + 64
    assert 24_000_000 <= peak() <= 24_000_000 + 64  # the whole block
    with pytest.raises(ValueError, match="no record_function 'missing'"):
        peak("missing")
    with memory.tensor_memory_peak() as peak:
        del before  # freed inside the block, allocated before it: never a negative peak
    assert peak() == 0
    del kept, held, extra, after


def test_memory_peaks_hold_the_cache_and_see_quantization_shrink_it():
    from bosch_eval.caches.kv_quant.config import KVQuantConfig

    model = random_model("qwen3", num_layers=4)
    ids = torch.randint(0, model.config.vocab_size, (1, 512), generator=torch.Generator().manual_seed(0))
    with bench.configured(model, None, 16) as cache:
        prefill, original = bench.memory_peaks(model, ids, None, cache)
    with bench.configured(
        model, None, 16, KVQuantConfig("kivi", bits=2, window=16, group_size=model.config.head_dim)
    ) as cache:
        _, quantized = bench.memory_peaks(model, ids, None, cache)
    held = 4 * model.config.num_key_value_heads * 2 * model.config.head_dim * 4  # bytes per token over all layers, fp32
    assert original >= 512 * held  # the cache itself
    assert prefill > 512 * held  # the cache it writes and its activations
    assert quantized < original


def test_compiled_decoding_runs_the_original_on_a_static_cache_and_refuses_kv_quant(monkeypatch):
    """--compile: every configuration decodes through the compiled model (here a stand-in that
    records its calls), the original on transformers' StaticCache, a hybrid on its captured cache
    preallocated for the prefill and both decodes; KV quantization is refused."""
    from transformers import StaticCache

    from bosch_eval.caches.kv_quant.config import KVQuantConfig

    model = random_model("qwen3", num_layers=4)
    calls, caches = [], []
    monkeypatch.setattr(
        torch, "compile", lambda module, **kwargs: lambda **inputs: calls.append(kwargs) or module(**inputs)
    )
    real_measure = bench.measure

    def recording(model, ids, decode_tokens, chunk, cache, decode_batch=8, forward=None):
        caches.append(cache)
        return real_measure(model, ids, decode_tokens, chunk, cache, decode_batch, forward)

    monkeypatch.setattr(bench, "measure", recording)
    rows = run_bench(
        model,
        [("r", 0.75)],
        BenchPlan([32], 2, repeats=1, warmup=0, profile=False, decode_batch=2, compile_decode=True),
    )
    assert [row.compiled_decode for row in rows] == [True, True]
    assert (
        isinstance(caches[0], StaticCache) and isinstance(caches[1], HybridCache) and caches[1].is_compileable
    )  # captured
    assert caches[1].layers[1].full.keys.shape[2] == 32 + 2 * (2 + 1)  # allocated once for the whole run
    # 2 configs × 2 decodes × (2 timed steps + the one that records the cache's graph); CUDA graphs need a GPU.
    assert len(calls) == 2 * 2 * 3 and all(kwargs == {"dynamic": False, "mode": None} for kwargs in calls)
    kv = KVQuantConfig("kivi", bits=2, window=16, group_size=model.config.head_dim)
    with pytest.raises(SettingsError, match="KV quantization is not compiled"):
        run_bench(model, [("q", None, kv)], BenchPlan([32], 1, repeats=1, warmup=0, profile=False, compile_decode=True))
