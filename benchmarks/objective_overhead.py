"""What one S(z) call costs beyond the forward passes it needs, side by side.

    python benchmarks/objective_overhead.py [--examples 64] [--calib-len 1024] [--batch-size 1] [--repeats 5]

Model: the bundled toy model when its weights are installed, else a random-weight Qwen3
of the toy's shape (4 layers, 8 query heads, 4 KV groups, width 128, vocabulary 4096)
with the toy's own BPE tokenizer (trained here, ~20 s); the first line says which. Data:
``bosch_niah_calib`` at ``--calib-len`` tokens, ``--examples`` documents. One mask with
half of the KV groups SWA (window ``--window``, default the model's) for every path.

Timed per repetition, interleaved so that machine noise hits them alike:

* forward: the bare forward passes the requests need, nothing else: the same token ids,
  the same batches (the adapter's order and padding), ``torch.no_grad``, logits only at
  the scored positions and their log-softmax: the adapter's own compute;
* objective: one :class:`~bosch_eval.search.objective.calibration.CalibrationObjective` call
  (``lm_eval.evaluator.evaluate`` on tasks built once, tokens memoized);
* objective, tokens not memoized: the same call with ``memoize_tokens`` off;
* tokenization alone: HFLM's tokenization of the same requests (what memoizing saves);
* simple_evaluate (search settings): ``lm_eval.simple_evaluate`` of the same loaded
  adapter, task by name from a pre-built TaskManager (no 11 s index),
  ``bootstrap_iters=0``, ``log_samples=False``;
* simple_evaluate (defaults): the same with its Python defaults (``log_samples=True``,
  ``bootstrap_iters=100000``).

Prints, per path, the median over repetitions of its time divided by (and minus) the
forward's time in the same repetition; the objective's target is at most 1.20.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bosch_eval.masks.head_mask import HeadMask
from bosch_eval.models.model_check import model_path
from bosch_eval.models.model_defaults import model_defaults
from bosch_eval.tasks import TASKS_DIR

TOY_SHAPE = dict(num_layers=4, hidden_size=128, intermediate_size=384, num_attention_heads=8, num_key_value_heads=4)


def model_dir(scratch: Path) -> tuple[str, str]:
    """The toy model's directory, or a random one of its shape; and a label for it."""
    try:
        return str(model_path()), "bundled toy model"
    except FileNotFoundError:
        pass
    import torch

    # torch (the modules of ours below load it): not for this script's --help
    from bosch_eval.models.random_model import random_model
    from bosch_eval.toy.train import train_tokenizer

    tokenizer = train_tokenizer(4096, 0)
    shape = dict(TOY_SHAPE)
    model = random_model(
        "qwen3", num_layers=shape.pop("num_layers"), vocab_size=len(tokenizer), head_dim=16,
        max_position_embeddings=4096, tie_word_embeddings=True, **shape,
    )  # fmt: skip
    model.config.eos_token_id = model.config.pad_token_id = tokenizer.eos_token_id
    model.to(torch.float32).save_pretrained(scratch)
    tokenizer.save_pretrained(scratch)
    return str(scratch), "random-weight Qwen3 of the toy's shape with the toy's tokenizer (toy weights not installed)"


def half_swa_mask(shape: Any) -> Any:
    """Every other KV group SWA, alternating by layer: half of them."""
    rows = [[(layer + group) % 2 for group in range(shape.num_kv_heads)] for layer in range(shape.num_layers)]
    return HeadMask.from_rows(rows, shape.num_heads)


def forward_batches(objective: Any) -> list[tuple[Any, Any]]:
    """The adapter's batches of the calibration requests: ``(input_ids, positions)``."""
    import torch
    from lm_eval.models.utils_hf import pad_and_concat

    # torch (the modules of ours below load it): not for this script's --help
    from bosch_eval.model_adapters.continuation_logits import scored_positions

    lm = objective.lm
    requests = []
    for task in objective.task_dict["tasks"].values():
        for instance in task.instances:  # built by the objective call before this one
            context, continuation = instance.args
            requests.append(lm._encode_pair(context, continuation))
    requests.sort(key=lambda pair: -len(pair[0] + pair[1]))  # the adapter's order: longest first
    batches = []
    for start in range(0, len(requests), lm.batch_size):
        chunk = requests[start : start + lm.batch_size]
        inputs = [(context + continuation)[-(lm.max_length + 1) :][:-1] for context, continuation in chunk]
        ids = pad_and_concat(
            max(map(len, inputs)),
            [torch.tensor(row, dtype=torch.long, device=lm.device) for row in inputs],
            padding_side="right",
        )
        positions = scored_positions([len(row) for row in inputs], [len(c) for _, c in chunk], lm.device)
        batches.append((ids, positions))
    return batches


def bare_forward(objective: Any, batches: list[tuple[Any, Any]]) -> Callable[[], None]:
    import torch
    import torch.nn.functional as F

    # torch (the modules of ours below load it): not for this script's --help
    from bosch_eval.model_adapters.continuation_logits import logits_at

    model = objective.lm.model

    def run() -> None:
        with torch.no_grad():
            for ids, positions in batches:
                F.log_softmax(logits_at(model, ids, positions), dim=-1)

    return run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--examples", type=int, default=64, help="bosch_niah_calib documents (default 64, the paper's)")
    parser.add_argument(
        "--calib-len", type=int, default=None, help="tokens per document (default: the model's, else 1024)"
    )
    parser.add_argument("--window", type=int, default=None, help="SWA window (default: the model's, else 128)")
    parser.add_argument("--batch-size", type=int, default=1, help="lm-eval batch size (default 1, the search's)")
    parser.add_argument("--repeats", type=int, default=5, help="repetitions of every timed path (default 5)")
    parser.add_argument(
        "--defaults-repeats", type=int, default=2, help="repetitions of simple_evaluate with its defaults"
    )
    args = parser.parse_args()

    import lm_eval
    import torch
    from lm_eval.tasks import TaskManager

    # torch (the modules of ours below load it): not for this script's --help
    from bosch_eval.search.objective.loading import CalibrationSettings, LoadSettings, build_objective

    with tempfile.TemporaryDirectory() as scratch:
        path, label = model_dir(Path(scratch))
        defaults = model_defaults(path)
        calib_len = args.calib_len or defaults.calib_len or 1024
        window = args.window or defaults.window or 128
        objective = build_objective(
            path,
            CalibrationSettings(examples=args.examples, length=calib_len),
            LoadSettings(window=window, dtype="float32", batch_size=args.batch_size),
        )
        mask = half_swa_mask(objective.shape)
        objective(mask)  # warm-up; builds the requests the forward replays
        forward = bare_forward(objective, forward_batches(objective))
        manager = TaskManager(include_path=str(TASKS_DIR), include_defaults=False, metadata=objective.metadata)

        def unmemoized() -> None:
            objective.lm.memoize_tokens = False
            try:
                objective(mask)
            finally:
                objective.lm.memoize_tokens = True

        def simple(**settings: Any) -> Callable[[], None]:
            def run() -> None:
                objective.lm.set_mask(mask)
                lm_eval.simple_evaluate(
                    model=objective.lm, tasks=list(objective.tasks), task_manager=manager, **settings
                )

            return run

        def tokenize() -> None:
            objective.lm.memoize_tokens = False
            try:
                for task in objective.task_dict["tasks"].values():
                    for instance in task.instances:
                        objective.lm._encode_pair(*instance.args)
            finally:
                objective.lm.memoize_tokens = True

        paths: dict[str, Callable[[], None]] = {
            "forward": forward,
            "objective": lambda: objective(mask),
            "objective, tokens not memoized": unmemoized,
            "tokenization alone": tokenize,
            "simple_evaluate (search settings)": simple(bootstrap_iters=0, log_samples=False),
        }
        times: dict[str, list[float]] = {name: [] for name in paths}
        times["simple_evaluate (defaults)"] = []
        forward()
        for repeat in range(args.repeats):
            for name, run in paths.items():
                times[name].append(_timed(run))
            if repeat < args.defaults_repeats:
                times["simple_evaluate (defaults)"].append(_timed(simple()))

    print(f"model: {label}")
    print(
        f"bosch_niah_calib: {args.examples} documents × {calib_len} tokens, batch size {args.batch_size}, "
        f"half the KV groups SWA (W={window}); torch threads {torch.get_num_threads()}, {platform.processor() or platform.machine()}; "
        f"lm_eval {lm_eval.__version__}, torch {torch.__version__}"
    )
    # Paired per repetition: the paths of one repetition ran back to back, under the same load.
    print(f"{'path':36} {'median s':>9} {'× forward':>10} {'+ s':>8}   all runs (s)")
    for name, runs in times.items():
        pairs = list(zip(runs, times["forward"]))
        ratio = statistics.median(t / f for t, f in pairs)
        extra = statistics.median(t - f for t, f in pairs)
        print(
            f"{name:36} {statistics.median(runs):9.3f} {ratio:10.3f} {extra:+8.3f}   {' '.join(f'{t:.3f}' for t in runs)}"
        )
    ratio = statistics.median(t / f for t, f in zip(times["objective"], times["forward"]))
    print(f"objective overhead: {100 * (ratio - 1):+.1f}% over the bare forward passes (target ≤ +20%)")


def _timed(run: Callable[[], None]) -> float:
    start = time.perf_counter()
    run()
    return time.perf_counter() - start


if __name__ == "__main__":
    main()
