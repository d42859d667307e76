"""Teacher-forced accuracy of a checkpoint on held-out ``keyed`` documents, split by kind.

    python results/toy_l/stage3-keyed/keyed_by_kind.py CHECKPOINT_DIR [LENGTH]

96 documents from a seed no training stream uses (training draws from TRAIN_SEED_BASE =
10_000_000 upwards); a document counts when every answer token is the greedy prediction.
The kind is read off the document: two answers -> multivalue, several names -> multikey.
"""

from __future__ import annotations

import random
import re
import sys

import torch
from transformers import AutoTokenizer, Qwen3ForCausalLM

from bosch_eval.toy.corpus import DocumentMaker
from bosch_eval.toy.train import encode

NAME = r"[A-Z][a-z]+ [A-Z][a-z]+"


def main() -> None:
    checkpoint, length = sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 1024
    tokenizer = AutoTokenizer.from_pretrained(checkpoint)
    model = Qwen3ForCausalLM.from_pretrained(checkpoint).eval()
    maker = DocumentMaker(random.Random(20_000_000 + 7 * length))
    counts: dict[str, list[int]] = {}
    for _ in range(96):
        pieces = maker.keyed(length)
        names = {match for match in re.findall(NAME, pieces[0][0]) if not match.startswith("The ")}
        kind = "multivalue" if re.search(r" and |, ", pieces[1][0]) else "multikey" if len(names) > 1 else "single"
        ids, answer = encode(tokenizer, pieces, length)
        with torch.no_grad():
            predicted = model(torch.tensor([ids])).logits[0, :-1].argmax(-1)
        targets, marked = torch.tensor(ids[1:]), torch.tensor(answer[1:])
        tally = counts.setdefault(kind, [0, 0])
        tally[0] += 1
        tally[1] += bool((predicted[marked] == targets[marked]).all())
    print(length, {kind: f"{right}/{n} = {right / n:.2f}" for kind, (n, right) in sorted(counts.items())})


if __name__ == "__main__":
    main()
