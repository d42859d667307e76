"""Every attention backend against the dense band reference, on any device, in fp32 and bf16.

    python benchmarks/backend_reference.py --device cuda [--families qwen3 gpt2] [--out DIR]

For each registered backend that can run on the device (``bosch_eval.attention.kernels``; what
``auto`` resolves to comes first), each model family of ``bosch_eval.models.random_model``, sinks 0
and 3, fp32 and bf16: the logits of a hybridized random model on a left-padded batch
against the same model under the dense band reference of the tests (``tests/helpers.py``:
an explicit [T, K] band per head, each row's sinks its first real tokens, attention in
float64), over the real (unpadded) positions; and, beside it, batch invariance: each row's
logits in the batch against the row run alone, within the same tolerance. A backend that
refuses a case (flash-attn with sinks on a left-padded batch) is reported as refused, with
its error.

Tolerance: fp32 1e-4. In bf16 both the hybrid and the reference round their activations, each
about as far from the exact result as bf16 brings the unpatched model from its fp32 self
(the ``bf16 floor``: max |logit(bf16) − logit(fp32)|, same weights and inputs); so a bf16
case passes within twice that floor, "equal to bf16 resolution". Each case is appended to ``cases.jsonl`` as it finishes,
so a run cut short keeps what it measured; ``reference.md`` is the table at the end.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # tests/helpers.py holds the reference; run as a script, benchmarks/ is sys.path[0]

from bosch_eval.attention.hybrid_attention import hybridize  # noqa: E402
from bosch_eval.attention.hybrid_spec import resolve_backend  # noqa: E402
from bosch_eval.attention.kernels import BACKENDS, flex  # noqa: E402
from bosch_eval.bench.report import environment  # noqa: E402
from bosch_eval.masks.head_mask import HeadMask, ModelShape  # noqa: E402
from bosch_eval.models.random_model import FAMILIES, random_model  # noqa: E402
from bosch_eval.runtime.device import pick_device  # noqa: E402
from bosch_eval.runtime.errors import SettingsError  # noqa: E402
from tests.helpers import left_padded_batch, reference_logits  # noqa: E402

WINDOW = 5
LENGTHS = [40, 26, 9]  # a left-padded batch: the longest row is 8 windows long
FP32_TOLERANCE = 1e-4
BF16_FLOORS = 2  # bf16 tolerance in bf16 floors: the hybrid's rounding and the reference's
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def runnable_backends(device: torch.device) -> tuple[list[str], dict[str, str]]:
    """Backends that can run on ``device``, ``auto``'s choice first, and why the others cannot."""
    auto = resolve_backend("auto", device).name
    skipped = {
        name: reason for name, backend in BACKENDS.items() if (reason := backend.unavailable(device)) is not None
    }
    return [auto, *(name for name in BACKENDS if name != auto and name not in skipped)], skipped


def mixed_mask(model: Any, sinks: int) -> HeadMask:
    """Every kind of layer: all full, all SWA, and alternating groups (the rest)."""
    shape = ModelShape.from_config(model.config)
    rows = [[(group + layer) % 2 for group in range(shape.num_kv_heads)] for layer in range(shape.num_layers)]
    rows[0], rows[1] = [1] * shape.num_kv_heads, [0] * shape.num_kv_heads
    return HeadMask.from_rows(rows, shape.num_heads, window=WINDOW, sinks=sinks)


def _model(family: str, dtype: torch.dtype, device: torch.device) -> Any:
    return random_model(family, seed=3).to(device, dtype)


def _positions(attention: torch.Tensor) -> torch.Tensor:
    """Each row's own positions, 0 at its first real token (as ``generate`` passes them)."""
    return (attention.cumsum(-1) - 1).clamp(min=0)


@torch.no_grad()
def _logits(model: Any, ids: torch.Tensor, attention: torch.Tensor) -> torch.Tensor:
    return model(input_ids=ids, attention_mask=attention, position_ids=_positions(attention)).logits.float()


def _alone_delta(model: Any, ids: torch.Tensor, attention: torch.Tensor, batched: torch.Tensor) -> float:
    """Max |Δ logit| between each row in the batch and the row run alone."""
    delta = 0.0
    for row in range(ids.shape[0]):
        real = attention[row].bool()
        alone = _logits(model, ids[row : row + 1, real], attention[row : row + 1, real])[0]
        delta = max(delta, (batched[row][real] - alone).abs().max().item())
    return delta


def batch(vocab: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    ids, attention = left_padded_batch(vocab, LENGTHS, seed=4)
    return ids.to(device), attention.to(device)


def bf16_floor(family: str, device: torch.device) -> float:
    """Max |logit| change that bf16 alone makes to the unpatched model (same weights and inputs)."""
    exact = _model(family, torch.float32, device)
    ids, attention = batch(exact.config.vocab_size, device)
    rounded = _logits(_model(family, torch.bfloat16, device), ids, attention)
    real = attention.bool()
    return (rounded - _logits(exact, ids, attention))[real].abs().max().item()


def check_case(backend: str, family: str, sinks: int, dtype: str, device: torch.device) -> dict[str, Any]:
    """Max |Δ logit| of the hybrid against the reference, both in ``dtype`` (one fresh model)."""
    model = _model(family, DTYPES[dtype], device)
    ids, attention = batch(model.config.vocab_size, device)
    mask = mixed_mask(model, sinks)
    expected = reference_logits(model, mask, ids, attention, position_ids=_positions(attention)).float()
    hybridize(model, mask, backend=backend)
    case = {"backend": backend, "family": family, "sinks": sinks, "dtype": dtype}
    started = time.perf_counter()
    try:
        got = _logits(model, ids, attention)
    except SettingsError as err:
        return {**case, "refused": str(err)}
    real = attention.bool()
    return {
        **case, "max_abs_delta_logit": (got - expected)[real].abs().max().item(),
        "max_abs_delta_alone": _alone_delta(model, ids, attention, got),
        "max_abs_logit": expected[real].abs().max().item(), "seconds": time.perf_counter() - started,
    }  # fmt: skip


def verdict(case: dict[str, Any], floors: dict[str, float]) -> tuple[float, bool]:
    """The case's tolerance and whether it is met (a refused case, with its clear error, is)."""
    tolerance = FP32_TOLERANCE if case["dtype"] == "float32" else BF16_FLOORS * floors[case["family"]]
    if "refused" in case:
        return tolerance, True
    return tolerance, max(case["max_abs_delta_logit"], case.get("max_abs_delta_alone", 0.0)) <= tolerance


def table(cases: list[dict[str, Any]], floors: dict[str, float]) -> str:
    lines = [
        "| backend | family | sinks | dtype | max abs Δ logit | max abs Δ row alone | tolerance | within |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for case in cases:
        tolerance, ok = verdict(case, floors)
        if "refused" in case:
            lines.append(
                f"| {case['backend']} | {case['family']} | {case['sinks']} | {case['dtype']} | refused: {case['refused']} | | {tolerance:.3g} | refused |"
            )
            continue
        lines.append(
            f"| {case['backend']} | {case['family']} | {case['sinks']} | {case['dtype']} | {case['max_abs_delta_logit']:.3g} | "
            f"{case['max_abs_delta_alone']:.3g} | {tolerance:.3g} | {'yes' if ok else '**no**'} |"
        )
    return "\n".join(lines)


def summary(cases: list[dict[str, Any]], floors: dict[str, float]) -> str:
    """One line per dtype: cases within tolerance and the largest Δ."""
    parts = []
    for dtype in DTYPES:
        chosen = [c for c in cases if c["dtype"] == dtype and "refused" not in c]
        refused = sum(c["dtype"] == dtype and "refused" in c for c in cases)
        if chosen:
            within = sum(verdict(c, floors)[1] for c in chosen)
            largest = max(max(c["max_abs_delta_logit"], c.get("max_abs_delta_alone", 0.0)) for c in chosen)
            parts.append(
                f"{dtype}: {within} of {len(chosen)} within tolerance, max |Δ logit| {largest:.3g}"
                + (f", {refused} refused" if refused else "")
            )
    return "; ".join(parts)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda", help="cpu, cuda or cuda:N (default cuda)")
    parser.add_argument(
        "--families",
        nargs="+",
        default=sorted(FAMILIES),
        choices=sorted(FAMILIES),
        help="model families (default: all)",
    )
    parser.add_argument(
        "--dtypes", nargs="+", default=list(DTYPES), choices=list(DTYPES), help="dtypes (default: float32 bfloat16)"
    )
    parser.add_argument("--sinks", type=int, nargs="+", default=[0, 3], help="attention sinks S (default: 0 3)")
    parser.add_argument("--out", type=Path, help="directory for cases.jsonl and reference.md (default: print only)")
    args = parser.parse_args(argv)

    device = torch.device(pick_device(args.device, "--device"))
    flex.unfused_policy = "error"  # a case flex ran unfused would not check the kernel that runs
    # Each case is another model (family, dtype, sinks), so another flex graph (one per shape
    # on a CPU); dynamo's default limit of 8 is for one function's recompiles within a model.
    torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 64)
    backends, skipped = runnable_backends(device)
    floors = {family: bf16_floor(family, device) for family in args.families} if "bfloat16" in args.dtypes else {}
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "cases.jsonl").write_text("")
    cases = []
    for backend in backends:  # backend-major: a run cut short has every family of the first backends
        for family in args.families:
            for sinks in args.sinks:
                for dtype in args.dtypes:
                    case = check_case(backend, family, sinks, dtype, device)
                    cases.append(case)
                    print(table([case], floors).splitlines()[-1], flush=True)
                    if args.out:
                        with (args.out / "cases.jsonl").open("a") as file:
                            file.write(json.dumps(case) + "\n")
    report = {
        "command": " ".join(["python", "benchmarks/backend_reference.py", *(sys.argv[1:] if argv is None else argv)]),
        "environment": environment(device), "auto": backends[0], "skipped": skipped, "bf16_floors": floors,
        "summary": summary(cases, floors), "cases": cases,
    }  # fmt: skip
    text = (
        f"$ {report['command']}\n\n{json.dumps(report['environment'])}\n\n`auto` on {device.type}: {backends[0]}; "
        f"not runnable here: {skipped or 'none'}\n\nbf16 floor (unpatched model, bf16 against fp32) per family: "
        f"{ {k: float(f'{v:.3g}') for k, v in floors.items()} }\n\n{table(cases, floors)}\n\n{report['summary']}\n"
    )
    if args.out:
        (args.out / "reference.json").write_text(json.dumps(report, indent=1) + "\n")
        (args.out / "reference.md").write_text(text)
    print(report["summary"])
    return 0 if all(verdict(case, floors)[1] for case in cases) else 1


if __name__ == "__main__":
    sys.exit(main())
