"""Masks that keep full attention in the layers the calibration check's one-layer probes found
the task in, for a look at ρ = 0.75 and 0.875 on the development split, where every ranking,
layer heuristic and random mask of the check's panel falls to the all-SWA floor.

A layer's drop is S(full) − S(that layer's three groups SWA) on the calibration set
(check/check.json, calibration split); the layers are kept full in order of their drop
(ties: the lower layer first), and the last layer kept is kept in part (its groups in index
order) so that exactly ⌈ρ·90⌉ groups are SWA. Run from the repo root:

    python benchmarks/studies/probe_guided.py results/smollm2/check    # -> CHECK/probe_guided/mask-r{0.75,0.875}.json

then, for each ratio R, on the calibration set (in-sample: the probes chose the layers) and
the development split as the check scores them (the output files are gzipped and moved up
out of lm-eval's per-model folder):

    lm_eval --model bosch --model_args pretrained=smollm2,mask=results/smollm2/check/probe_guided/mask-rR.json,dtype=bfloat16 \
      --device cpu --batch_size 8 --tasks bosch_retrieval_calib,bosch_niah_dev \
      --metadata '{"seq_len": 1024, "num_examples": 64, "dev_lengths": [1024], "dev_samples": 8}' \
      --log_samples --output_path results/smollm2/check/probe_guided/rR
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from bosch_eval.masks.head_mask import HeadMask, ModelShape, ceil_count

SHAPE = ModelShape(num_layers=30, num_heads=9, num_kv_heads=3)  # SmolLM2-135M
WINDOW = 128  # the model's default (results/smollm2/defaults.md)


def probe_guided(drops: dict[int, float], ratio: float) -> HeadMask:
    cells = [
        (layer, group)
        for layer in sorted(drops, key=lambda layer: (-drops[layer], layer))
        for group in range(SHAPE.num_kv_heads)
    ]
    total = SHAPE.num_layers * SHAPE.num_kv_heads
    full = set(cells[: total - ceil_count(ratio, total)])
    swa = {(layer, group) for layer in range(SHAPE.num_layers) for group in range(SHAPE.num_kv_heads)} - full
    return HeadMask.from_swa_groups(SHAPE, swa, window=WINDOW, model="smollm2", method=f"probe-guided-{ratio:g}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("check", type=Path, help="a calib-check's folder with its one-layer probes (check.json)")
    check_dir = parser.parse_args(argv).check
    check = json.loads((check_dir / "check.json").read_text())
    drops = {int(layer): drop for layer, drop in check["layer_drops"]["calib"].items()}
    out = check_dir / "probe_guided"
    out.mkdir(exist_ok=True)
    for ratio in (0.75, 0.875):
        mask = probe_guided(drops, ratio)
        mask.save(out / f"mask-r{ratio}.json")
        kept = sorted({layer for layer, row in enumerate(mask.bits) if any(row)})
        print(f"rho {ratio}: {mask.num_swa_groups} SWA groups ({mask.swa_ratio:.3f}); full groups in layers {kept}")


if __name__ == "__main__":
    main()
