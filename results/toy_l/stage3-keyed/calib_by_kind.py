"""Greedy answers of a checkpoint (full attention) on ``bosch_retrieval_calib`` examples, by kind.

    python results/toy_l/stage3-keyed/calib_by_kind.py CHECKPOINT_DIR [CALIB_SEED] [N]

A set of N (24) examples at 1024 tokens (kinds rotate single / multikey / multivalue);
an example counts when every target token is the greedy prediction, as lm-eval's ``acc``;
``first digit`` counts the answer's first digit alone (where key matching shows first).
"""

from __future__ import annotations

import sys

import torch
from transformers import AutoTokenizer, Qwen3ForCausalLM

from bosch_eval.tasks.niah import retrieval_calib


def main() -> None:
    checkpoint = sys.argv[1]
    seed, n = (int(sys.argv[2]) if len(sys.argv) > 2 else 1), (int(sys.argv[3]) if len(sys.argv) > 3 else 24)
    tokenizer = AutoTokenizer.from_pretrained(checkpoint)
    model = Qwen3ForCausalLM.from_pretrained(checkpoint).eval()
    counts: dict[str, list[int]] = {}
    for example in retrieval_calib.examples(tokenizer, 1024, n, seed):
        context = tokenizer(example["input"], add_special_tokens=False)["input_ids"]
        target = tokenizer(" " + example["target"], add_special_tokens=False)["input_ids"]  # tokens: " ", digits...
        with torch.no_grad():
            predicted = model(torch.tensor([context + target])).logits[0, len(context) - 1 : -1].argmax(-1).tolist()
        right = [p == t for p, t in zip(predicted, target, strict=True)]
        tally = counts.setdefault(example["kind"], [0, 0, 0])
        tally[0] += 1
        tally[1] += all(right)
        tally[2] += right[1]
    for kind, (total, whole, first_digit) in counts.items():
        print(f"{kind}: {whole}/{total} right, first digit {first_digit}/{total}")


if __name__ == "__main__":
    main()
