"""The GPU check (benchmarks/gpu_check.py, backend_reference.py) on a CPU: its parts, and the
whole check at --quick sizes (slow)."""

from __future__ import annotations

import json
import subprocess
import sys
import tarfile
import time
import types
from pathlib import Path

import pytest
import torch

from bosch_eval.attention.kernels import BACKENDS, Backend
from bosch_eval.attention.kernels.reference import masked_swa_attention
from bosch_eval.attention.local_window import LocalWindow
from bosch_eval.masks.head_mask import HeadMask
from tests.helpers import dense_band_reference

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"
sys.path.insert(0, str(BENCHMARKS))  # the scripts import each other as run from there

import backend_reference  # noqa: E402
import gpu_check  # noqa: E402


def test_dense_band_reference_runs_on_the_inputs_device():
    """The meta device stands in for CUDA: any tensor the oracle made on the CPU would be refused."""
    module = types.SimpleNamespace(
        reference_mask=HeadMask.from_rows([[0, 1]], 4, window=3, sinks=1), layer_idx=0, num_key_value_groups=2
    )
    query, key = torch.randn(1, 4, 6, 8, device="meta"), torch.randn(1, 2, 6, 8, device="meta")
    out, _ = dense_band_reference(module, query, key, key, torch.ones(1, 1, 6, 6, dtype=torch.bool, device="meta"), 0.3)
    assert out.device.type == "meta" and out.shape == (1, 6, 4, 8)


def test_a_correct_backend_passes_and_a_wrong_window_fails(monkeypatch):
    def one_key_too_many(module, query, key, value, attention_mask, local, **kwargs):
        return masked_swa_attention(
            module, query, key, value, attention_mask, LocalWindow(local.window + 1, local.sinks), **kwargs
        )

    monkeypatch.setitem(BACKENDS.members, "bosch_test_wrong_window", Backend(swa=one_key_too_many))
    floors = {"qwen3": backend_reference.bf16_floor("qwen3", torch.device("cpu"))}
    right = backend_reference.check_case("sdpa", "qwen3", 3, "float32", torch.device("cpu"))
    wrong = backend_reference.check_case("bosch_test_wrong_window", "qwen3", 3, "float32", torch.device("cpu"))
    wrong_bf16 = backend_reference.check_case("bosch_test_wrong_window", "qwen3", 0, "bfloat16", torch.device("cpu"))
    assert backend_reference.verdict(right, floors) == (1e-4, True) and right["max_abs_delta_logit"] < 1e-5
    assert not backend_reference.verdict(wrong, floors)[1] and not backend_reference.verdict(wrong_bf16, floors)[1]
    assert "1 of 2 within tolerance" in backend_reference.summary([right, wrong], floors)


def test_auto_runs_first_and_unavailable_backends_are_named():
    backends, skipped = backend_reference.runnable_backends(torch.device("cpu"))
    assert backends[0] == "blocked" and set(backends) == set(BACKENDS) - {"flash_attention_2"}
    assert "flash-attn" in skipped["flash_attention_2"]


def test_bench_runs_flex_first():
    assert gpu_check.bench_order(["blocked", "sdpa", "flex"]) == ["flex", "blocked", "sdpa"]
    assert gpu_check.bench_order(["flash_attention_2", "sdpa"]) == ["flash_attention_2", "sdpa"]


def test_flex_runs_eagerly_then_with_its_decode_compiled_then_the_others():
    runs = gpu_check.bench_runs(["blocked", "flex", "sdpa"], gpu_check.FULL)
    assert [run[0] for run in runs] == ["flex", "flex --compile", "blocked", "sdpa"]
    assert runs[0][2:] == ((32768, 8192), ("0.75", "0.5"), ())
    assert runs[1][1:] == ("flex", (32768,), ("0.75",), ("--compile",))
    assert [run[0] for run in gpu_check.bench_runs(["flash_attention_2", "sdpa"], gpu_check.FULL)] == [
        "flash_attention_2",
        "sdpa",
    ]


def test_slug_names_a_folder():
    assert (
        gpu_check.slug("NVIDIA H100 80GB HBM3") == "nvidia-h100-80gb-hbm3"
        and gpu_check.slug("cpu (x86_64)") == "cpu-x86-64"
    )


def test_a_stage_past_its_limit_is_killed_with_its_children(tmp_path):
    pid_file = tmp_path / "child.pid"
    script = "import subprocess, sys, time; child = subprocess.Popen(['sleep', '60']); open(sys.argv[1], 'w').write(str(child.pid)); time.sleep(60)"
    started = time.monotonic()
    # 10 s: room for a loaded machine to start Python and the child before the limit.
    result = gpu_check.run_limited([sys.executable, "-c", script, str(pid_file)], 10, tmp_path / "stage.log")
    assert result["status"] == "timed out after 10 s" and time.monotonic() - started < 40
    status = Path(f"/proc/{pid_file.read_text()}/status")

    def child_ended() -> bool:  # gone, or a zombie waiting for init
        try:
            return "State:\tZ" in status.read_text()
        except FileNotFoundError:
            return True

    deadline = time.monotonic() + 10  # SIGKILL is delivered at once, but a busy scheduler may run the exit later
    while not child_ended() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert child_ended()
    assert (
        gpu_check.run_limited([sys.executable, "-c", "import sys; sys.exit(3)"], 30, tmp_path / "x.log")["status"]
        == "failed (exit 3)"
    )


def _speedup(label, length, **ratios):
    return {
        "label": label,
        "length": length,
        "prefill": 1.0,
        "decode_batch_1": 1.0,
        "decode_batch_8": 1.0,
        "prefill_peak": 1.0,
        **ratios,
    }


def test_targets_are_read_at_32k_only():
    lines = gpu_check.targets(
        [
            _speedup("ρ=0.75", 32768, prefill=1.3, decode_batch_8=1.2, prefill_peak=None),
            _speedup("ρ=0.75", 8192, prefill=9.0),
        ]
    )
    assert lines == [
        "ρ=0.75 prefill 1.30× (target >= 1.25): met",
        "ρ=0.75 decode_batch_1 1.00× (target >= 1.0): met",
        "ρ=0.75 decode_batch_8 1.20× (target >= 1.3): NOT met",
        "ρ=0.75 prefill_peak: not measured",
    ]
    assert gpu_check.targets([_speedup("ρ=0.5", 8192)]) == []


def test_summary_shows_every_stage_and_a_failed_backend(tmp_path):
    results = {
        "correctness": {"status": "ok", "seconds": 20, "limit_s": 60, "auto": "sdpa", "skipped": {}, "summary": "float32: 2 of 2 within tolerance"},
        "bench": {"status": "partial", "seconds": 100, "limit_s": 200, "auto": "sdpa", "skipped": {}, "backends": {
            "sdpa": {"status": "ok", "speedups": [_speedup("ρ=0.75", 32768, prefill=0.4, kv_bytes=0.27)]},
            "flex": {"status": "failed (exit 1)", "speedups": [], "error": "Traceback\ntorch.OutOfMemoryError: CUDA out of memory"},
        }},
        "lm_eval": {"status": "ok", "seconds": 50, "limit_s": 60, "equal": True, "max_abs_difference": 0.0, "exactly_equal": 1,
                    "scores": {"device": {"t/acc": 0.5}, "captured": {"t/acc": 0.5}, "cpu": {"t/acc": 0.5}}},
        "objective": {"status": "ok", "seconds": 40, "limit_s": 50, "rows": [
            {"config": "dtype=bfloat16,mask=full", "median_s": 2.0, "vs_first": 1.0},
            {"config": "dtype=bfloat16,layers=bme,ratio=0.75", "median_s": 1.5, "vs_first": 0.75}]},
        "search": {"status": "timed out after 80 s", "seconds": 80, "limit_s": 80, "command": "bosch-eval search", "scored_masks": 12},
    }  # fmt: skip
    text = gpu_check.summary({"device": "NVIDIA H100", "command": "python benchmarks/gpu_check.py"}, results)
    assert "| sdpa (= auto) | 32768 | ρ=0.75 | 0.40 | 1.00 | 1.00 | 1.00 | 0.270 | ok |" in text
    assert "| flex | - | - | - | - | - | - | - | failed (exit 1): torch.OutOfMemoryError: CUDA out of memory |" in text
    assert (
        "ρ=0.75 prefill 0.40× (target >= 1.25): NOT met" in text
        and "Targets at T = 32768, flex: T = 32768 not measured" in text
    )
    assert "on the device against the CPU: equal" in text and "| t/acc | 0.5 | 0.5 | 0.5 |" in text
    assert "timed out after 80 s; 12 masks scored in the journal before it stopped" in text
    assert "| `dtype=bfloat16,layers=bme,ratio=0.75` | 1.50 | 0.75 |" in text


@pytest.mark.slow
def test_quick_check_on_cpu_runs_every_stage_and_packs_them(tmp_path):
    """The whole check at --quick sizes, as a device machine would run it (minutes on 2 busy cores).
    The budget is a ceiling, not a target: stages end when done. With a cold compile cache the
    correctness stage's flex cases compile for minutes: under 1200 s split by the GPU's shares
    (133 s for it) it timed out on CI's 2 cores; the CPU plan gives it half the budget."""
    result = subprocess.run(
        [sys.executable, str(BENCHMARKS / "gpu_check.py"), "--device", "cpu", "--quick", "--budget", "1200",
         "--out", str(tmp_path / "out"), "--pack", str(tmp_path / "pack")],
        capture_output=True, text=True, timeout=1500, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    (folder,) = (tmp_path / "out").iterdir()
    stages = json.loads((folder / "stages.json").read_text())
    assert {name: stage["status"] for name, stage in stages.items()} == dict.fromkeys(gpu_check.STAGES, "ok")
    assert stages["correctness"]["summary"].startswith("float32: 12 of 12 within tolerance")
    bench = stages["bench"]["backends"]
    assert (
        list(bench)[:2] == ["flex", "flex --compile"] and len(bench["flex --compile"]["speedups"]) == 1
    )  # ρ = 0.75 at the longest length
    assert all(
        len(run["speedups"]) == 4 for name, run in bench.items() if name != "flex --compile"
    )  # 2 ratios × 2 lengths
    assert stages["lm_eval"]["equal"] and stages["search"]["evaluations"] > 0
    assert [row["config"] for row in stages["objective"]["rows"]] == [
        "dtype=bfloat16,mask=full",
        "dtype=bfloat16,layers=bme,ratio=0.75",
        "dtype=bfloat16,layers=bme,ratio=0.5",
    ]
    environment = json.loads((folder / "environment.json").read_text())
    assert environment["device"].startswith("cpu") and environment["torch"] and "--quick" in environment["command"]
    assert (tmp_path / "pack" / "summary.md").read_text() == (folder / "summary.md").read_text()
    with tarfile.open(tmp_path / "pack" / "gpu_check.tar.gz") as archive:
        assert (
            f"{folder.name}/bench/flex/bench.json" in archive.getnames()
            and f"{folder.name}/bench/flex--compile/bench.json" in archive.getnames()
        )
    again = subprocess.run([sys.executable, str(BENCHMARKS / "gpu_check.py"), "--device", "cpu", "--out", str(tmp_path / "out")],
                           capture_output=True, text=True, timeout=300, check=False)  # fmt: skip
    assert again.returncode == 2 and "already holds a check" in again.stderr
