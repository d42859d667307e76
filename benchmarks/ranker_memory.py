"""Peak memory and wall time of the streaming rankers against the direct NumPy formulas.

    python benchmarks/ranker_memory.py [--length 4096] [--methods dcam apl ...] [--json out.json]

Model: the bundled toy model (4 layers, 8 query heads, 4 KV groups, head_dim 16) when
its weights are installed, else a random-weight Qwen3 of the same shape with a small
byte-level BPE tokenizer. One calibration example of ``--length`` tokens (Razor: a probe
of 4·⌊T/4⌋ tokens), both paths in float64.

* streaming: :func:`bosch_eval.search.rankers.driver.compute_ranking`, query blocks of
  ``--block-size`` rows;
* direct: the same capture, then for each layer the whole ``[H, T, T]`` attention map
  (and ``dL/dP`` for Fisher) in NumPy, fed to :mod:`bosch_eval.search.rankers.reference`.
  One layer's maps are alive at a time, so this is already the kinder direct variant.
* backprop (Fisher only): the model's own forward and backward of the loss, no ranking —
  the part of Fisher's streaming figure that is autograd's saved activations.

Memory measure: each (method, path) runs in a fresh worker process; the number is the
process's peak resident set size (``ru_maxrss``, the kernel's high-water mark) minus
its RSS (psutil) just before the ranking starts, after the model is loaded and the
inputs are built. It counts torch CPU tensors and NumPy arrays alike (tracemalloc would
miss torch's allocations). The direct path's wall time is that of a loop-by-definition
reference, not of a tuned implementation; compare its memory, not its speed.
"""

from __future__ import annotations

import argparse
import json
import platform
import resource
import subprocess
import sys
import time
from typing import Any

from bosch_eval.models.model_check import model_path
from bosch_eval.models.model_defaults import model_defaults

METHODS = ("dcam", "apl", "proxy", "qada", "razor", "fisher")


def load_model() -> tuple[Any, Any, str, int | None]:
    """The toy model in float64 (or a random one of its shape), its tokenizer, a label and its window."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    # torch (the modules of ours below load it): not for this script's --help
    from bosch_eval.models.random_model import random_model, train_tokenizer

    try:
        path = model_path()
    except FileNotFoundError:
        tokenizer = train_tokenizer()
        model = random_model(
            "qwen3", num_layers=4, vocab_size=len(tokenizer), hidden_size=128, intermediate_size=384,
            max_position_embeddings=8192,
        )  # fmt: skip
        return model.double(), tokenizer, "random Qwen3, toy shape (toy weights not installed)", None
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float64, attn_implementation="sdpa").eval()
    return model, AutoTokenizer.from_pretrained(path), "bundled toy model", model_defaults(path).window


def sequences(method: str, tokenizer: Any, vocab_size: int, length: int) -> list[Any]:
    # torch (the modules of ours below load it): not for this script's --help
    from bosch_eval.search.rankers.base import calibration_ids
    from bosch_eval.search.rankers.razor import repeated_probes

    if method == "razor":
        return repeated_probes(tokenizer, vocab_size, 1, length // 4, 0)
    return calibration_ids(tokenizer, length, 1, 0, "bosch_niah_calib")


def direct_head_scores(method: str, model: Any, inputs: list[Any], window: int) -> Any:
    """``[L, H]`` head scores from whole per-layer attention maps (the reference formulas)."""
    import numpy as np
    import torch
    import torch.nn.functional as F

    # torch (the modules of ours below load it): not for this script's --help
    from bosch_eval.search.rankers import reference as ref
    from bosch_eval.search.rankers.capture import capture_attention

    grads = method == "fisher"
    runs = []
    for ids in inputs:
        store: dict[int, list] = {}

        def forward(layer, module, q, k, v, store=store) -> None:
            store[layer] = [q.numpy().copy(), k.numpy().copy(), v.numpy().copy(), module.scaling]

        def backward(layer, module, q, k, v, do, store=store) -> None:
            store[layer].append(do.numpy().copy())

        with capture_attention(model, on_forward=forward, on_backward=backward if grads else None):
            with torch.set_grad_enabled(grads):
                if grads:
                    embeds = model.get_input_embeddings()(ids[None]).detach().requires_grad_(True)
                    logits = model(inputs_embeds=embeds, use_cache=False).logits[0, :-1]
                    torch.autograd.grad(F.cross_entropy(logits, ids[1:]), embeds)
                else:
                    model.base_model(input_ids=ids[None], use_cache=False)
        runs.append(store)
    rows = []
    for layer in range(len(runs[0])):
        captured = [run[layer] for run in runs]
        maps = [ref.attention_maps(q, k, tau, v, *rest) for q, k, v, tau, *rest in captured]
        probs = [p for p, _ in maps]
        if method == "dcam":
            rows.append(ref.dcam(probs, window))
        elif method == "apl":
            rows.append(ref.apl(probs, window))
        elif method == "proxy":
            rows.append(ref.proxy(probs, 64, 0.9, (0,)))
        elif method == "qada":
            rows.append(ref.qada([c[0] for c in captured], [c[1] for c in captured], captured[0][3], window, 128))
        elif method == "razor":
            rows.append(ref.razor_attention(probs, inputs[0].shape[0] // 4))
        elif method == "fisher":
            rows.append(ref.fisher(probs, [g for _, g in maps], window))
        del maps, probs
    if method == "razor":
        return ref.razor(np.stack([e for e, _ in rows]), np.stack([i for _, i in rows]))
    return np.stack(rows)


def worker(method: str, path: str, length: int, block_size: int) -> dict[str, Any]:
    """One measurement in this (fresh) process."""
    import psutil
    import torch

    # torch (the modules of ours below load it): not for this script's --help
    from bosch_eval.search.rankers.driver import RankingCompute, RankingInputs, _loss_backward, compute_ranking

    torch.manual_seed(0)
    model, tokenizer, label, default_window = load_model()
    window = default_window or length // 32
    inputs = sequences(method, tokenizer, model.get_input_embeddings().num_embeddings, length)
    before = psutil.Process().memory_info().rss
    started = time.perf_counter()
    if path == "backprop":
        _loss_backward(model, inputs[0])
        scores = None
    elif path == "streaming":
        ranking = compute_ranking(
            method,
            model,
            tokenizer,
            RankingInputs(window, 1, length),
            compute=RankingCompute(block_size=block_size, dtype=torch.float64),
        )
        scores = ranking.provenance["head_scores"]
    else:
        scores = direct_head_scores(method, model, inputs, window).tolist()
    wall = time.perf_counter() - started
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: KiB
    return {"method": method, "path": path, "model": label, "tokens": int(inputs[0].shape[0]), "window": window,
            "peak_bytes": max(0, peak - before), "wall_s": wall, "head_scores": scores}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--length", type=int, default=4096, help="calibration length T (tokens)")
    parser.add_argument("--methods", nargs="+", default=list(METHODS), choices=METHODS, help="methods to measure")
    parser.add_argument("--block-size", type=int, default=64, help="streaming query block Bq")
    parser.add_argument("--json", help="also write the results (with command and versions) to this file")
    parser.add_argument("--worker", nargs=2, metavar=("METHOD", "PATH"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(worker(*args.worker, args.length, args.block_size)))
        return

    import numpy as np
    import torch
    import transformers

    results = []
    print(f"$ python benchmarks/ranker_memory.py {' '.join(sys.argv[1:])}")
    print(f"# torch {torch.__version__}, transformers {transformers.__version__}, python {platform.python_version()}, "
          f"{platform.machine()}, threads={torch.get_num_threads()} (workers inherit OMP_NUM_THREADS)")  # fmt: skip
    print(f"{'method':<8} {'streaming MiB':>14} {'direct MiB':>11} {'direct/stream':>14} "
          f"{'stream s':>9} {'direct s':>9} {'max |Δscore|':>13}")  # fmt: skip

    def run(method: str, path: str) -> dict[str, Any]:
        command = [sys.executable, __file__, "--worker", method, path, "--length", str(args.length),
                   "--block-size", str(args.block_size)]  # fmt: skip
        out = subprocess.run(command, capture_output=True, text=True, check=True).stdout
        return json.loads(out.strip().splitlines()[-1])

    for method in args.methods:
        pair = {path: run(method, path) for path in ("streaming", "direct")}
        stream, direct = pair["streaming"], pair["direct"]
        gap = float(np.max(np.abs(np.array(stream["head_scores"]) - np.array(direct["head_scores"]))))
        mib = 2**20
        ratio = direct["peak_bytes"] / max(stream["peak_bytes"], 1)
        print(f"{method:<8} {stream['peak_bytes'] / mib:>14.1f} {direct['peak_bytes'] / mib:>11.1f} {ratio:>13.1f}× "
              f"{stream['wall_s']:>9.2f} {direct['wall_s']:>9.2f} {gap:>13.1e}")  # fmt: skip
        results.append({"method": method, "streaming": stream, "direct": direct, "max_score_gap": gap})
    backprop = run("fisher", "backprop") if "fisher" in args.methods else None
    if backprop:
        print(f"fisher: the model's own forward + backward of the loss, without ranking, peaks at "
              f"{backprop['peak_bytes'] / 2**20:.1f} MiB of that streaming figure")  # fmt: skip
    first = results[0]["streaming"]
    print(f"\nmodel: {first['model']}; T = {first['tokens']} tokens (razor: 4·⌊T/4⌋), W = {first['window']}, "
          f"Bq = {args.block_size}, float64")  # fmt: skip
    print("memory: peak RSS (ru_maxrss) − RSS just before the ranking, a fresh process for each number")
    if args.json:
        report = {"command": " ".join([sys.executable, *sys.argv]), "python": platform.python_version(),
                  "torch": torch.__version__, "transformers": transformers.__version__,
                  "machine": platform.machine(), "threads": torch.get_num_threads(), "results": results,
                  "fisher_backprop_only": backprop}  # fmt: skip
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
