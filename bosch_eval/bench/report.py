"""The benchmark's outputs: each hybrid's ratios to the original measured in the same run,
the Markdown table, the JSON rows, the figure, and the environment recorded beside them."""

from __future__ import annotations

import platform
from dataclasses import asdict
from typing import Any

import torch

from bosch_eval.bench.memory import CPU_PEAK_METHOD
from bosch_eval.bench.runner import BenchRow


def max_batch(budget_bytes: int, weight_bytes: int, kv_bytes_per_sequence: int) -> int:
    """Largest batch whose KV cache (closed form, per sequence) fits next to the weights."""
    return max(0, (budget_bytes - weight_bytes) // max(1, kv_bytes_per_sequence))


def speedups(rows: list[BenchRow]) -> list[dict[str, Any]]:
    """Each hybrid row against the original at the same length, measured in the same run:
    tokens/s ratios (above 1: faster than the original) and memory ratios (below 1: less)."""
    original = {row.length: row for row in rows if row.label == "original"}
    return [
        {
            "label": row.label, "backend": row.backend, "length": row.length, "swa_ratio": row.swa_ratio, "window": row.window,
            "prefill": row.prefill_tokens_per_s / original[row.length].prefill_tokens_per_s,
            "decode_batch_1": row.decode_tokens_per_s / original[row.length].decode_tokens_per_s,
            f"decode_batch_{row.decode_batch}": row.decode_batch_tokens_per_s / original[row.length].decode_batch_tokens_per_s,
            # None where either peak is not measured (a CPU's with --no-profile) or the original's is not positive.
            "prefill_peak": _quotient(row.prefill_peak_bytes, original[row.length].prefill_peak_bytes),
            "kv_bytes": row.kv_cache_bytes / original[row.length].kv_cache_bytes,
            # Apart from the steady state above: the first, untimed run and the flex graphs compiled.
            "warmup_s": row.warmup_s, "compiles": row.compiles,
        }
        for row in rows
        if row.label != "original"
    ]  # fmt: skip


def ratio_table(rows: list[BenchRow], budget_bytes: int | None = None, weight_bytes: int = 0) -> str:
    """Markdown table with each hybrid's ratios to the original at the same length (time and
    memory ratios: below 1 is faster or smaller); with a memory budget, KV columns (formula,
    quantization) and the largest batch that fits."""
    original = {row.length: row for row in rows if row.label == "original"}
    kv_columns = budget_bytes is not None
    batch = rows[0].decode_batch if rows else 1
    lines = [
        f"| config | ρ | W | T | prefill tok/s | decode tok/s | decode tok/s ×{batch} | KV bytes | prefill peak MB | decode peak MB | "
        f"attention share | prefill time ratio | decode time ratio | decode ×{batch} time ratio | KV ratio | prefill peak ratio | "
        "decode peak ratio | backend | warm-up s (flex compiles) |"
        + (" kv_quant | KV bytes (formula) | max batch |" if kv_columns else ""),
        "|---" * 19 + "|" + ("---|---|---|" if kv_columns else ""),
    ]
    for row in rows:
        base = original[row.length]
        lines.append(
            f"| {row.label} | {row.swa_ratio:.3g} | {row.window or '-'} | {row.length} | {row.prefill_tokens_per_s:.1f} | "
            f"{row.decode_tokens_per_s:.2f} | {row.decode_batch_tokens_per_s:.2f} | {row.kv_cache_bytes} | "
            f"{_megabytes(row.prefill_peak_bytes)} | {_megabytes(row.decode_peak_bytes)} | "
            f"{'-' if row.attention_share is None else f'{row.attention_share:.2f}'} | "
            f"{base.prefill_tokens_per_s / row.prefill_tokens_per_s:.3f} | {base.decode_tokens_per_s / row.decode_tokens_per_s:.3f} | "
            f"{base.decode_batch_tokens_per_s / row.decode_batch_tokens_per_s:.3f} | {row.kv_cache_bytes / base.kv_cache_bytes:.4f} | "
            f"{_ratio(row.prefill_peak_bytes, base.prefill_peak_bytes)} | {_ratio(row.decode_peak_bytes, base.decode_peak_bytes)} | "
            f"{row.backend or 'sdpa (unpatched)'} | {_warmup(row)} |"
            + (
                f" {row.kv_quant or '-'} | {row.kv_bytes_formula} | {max_batch(budget_bytes, weight_bytes, row.kv_bytes_formula)} |"
                if kv_columns
                else ""
            )
        )
    return "\n".join(lines)


def _warmup(row: BenchRow) -> str:
    return "-" if row.warmup_s is None else f"{row.warmup_s:.2f} ({row.compiles})"


def _megabytes(size: int | None) -> str:
    return "-" if size is None else f"{size / 2**20:.1f}"


def _quotient(value: int | None, base: int | None) -> float | None:
    """``value / base``; None where either is not measured or ``base`` is not positive."""
    return None if value is None or base is None or base <= 0 else value / base


def _ratio(value: int | None, base: int | None) -> str:
    quotient = _quotient(value, base)
    return "-" if quotient is None else f"{quotient:.3f}"


def peak_note(device: torch.device, profiled: bool) -> str:
    """How the table's peak-memory columns were measured on ``device``: the line printed under it."""
    if device.type == "cuda":
        return (
            "Peaks: the CUDA allocator's (torch.cuda.max_memory_allocated) above what was allocated before the "
            "prefill; prefill peak: median of the timed runs."
        )
    if profiled:
        return f"{CPU_PEAK_METHOD}."
    return f"Peaks: - (not measured: --no-profile skips the profiled run they come from). {CPU_PEAK_METHOD}."


def environment(device: torch.device) -> dict[str, str]:
    """The device the benchmark ran on and versions, recorded beside every benchmark result."""
    import transformers

    # The device used, not the best one present: a CPU run on a GPU machine says cpu.
    name = (
        torch.cuda.get_device_name(device)
        if device.type == "cuda"
        else f"{device.type} ({platform.processor() or platform.machine()})"
    )
    return {"device": name, "threads": str(torch.get_num_threads()), "torch": torch.__version__,
            "transformers": transformers.__version__, "python": platform.python_version()}  # fmt: skip


def plot(rows: list[BenchRow], path: str, x: str = "length") -> None:
    """Prefill and decode throughput and KV bytes per configuration against ``x`` (Fig. 5/6 style)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    def series(row: BenchRow) -> str:  # one line per configuration; in a window sweep, per ratio
        return row.label if x == "length" or row.window is None else f"ρ={row.swa_ratio:g}"

    metrics = [
        ("prefill_tokens_per_s", "prefill tokens/s"),
        ("decode_tokens_per_s", "decode tokens/s"),
        ("kv_cache_bytes", "KV-cache bytes"),
    ]
    figure, axes = plt.subplots(1, 3, figsize=(13, 3.6))
    for axis, (field, title) in zip(axes, metrics, strict=True):
        for label in dict.fromkeys(map(series, rows)):
            points = [(getattr(r, x), getattr(r, field)) for r in rows if series(r) == label]
            if points[0][0] is None:  # the original has no window: a reference line in the sweep
                axis.axhline(points[0][1], color="black", linestyle="--", label=label)
            else:
                axis.plot(*zip(*points, strict=True), marker="o", label=label)
        axis.set_xscale("log", base=2)
        axis.set_xlabel("sequence length T" if x == "length" else "window W")
        axis.set_title(title)
    axes[0].legend()
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    plt.close(figure)


def rows_as_json(rows: list[BenchRow]) -> list[dict[str, Any]]:
    return [asdict(row) for row in rows]
