"""Greedy answers of a checkpoint (full attention), split by the kind of example (results/toy_l).

    python benchmarks/studies/greedy_by_kind.py calib CHECKPOINT_DIR [--seed 1] [--examples 24]
    python benchmarks/studies/greedy_by_kind.py keyed CHECKPOINT_DIR [--length 1024] [--documents 96]

An example counts when every answer token is the greedy prediction, as lm-eval's ``acc``.

``calib``: ``bosch_retrieval_calib`` examples at 1024 tokens (kinds rotate single / multikey /
multivalue); ``first digit`` counts the answer's first digit alone (where key matching
shows first).
``keyed``: the toy training corpus's held-out ``keyed`` documents, teacher-forced, from a seed
no training stream uses (training draws from TRAIN_SEED_BASE = 10_000_000 upwards). The kind
is read off the document: two answers -> multivalue, several names -> multikey.
"""

from __future__ import annotations

import argparse
import random
import re

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from bosch_eval.tasks.niah import retrieval_calib
from bosch_eval.toy.corpus import DocumentMaker
from bosch_eval.toy.train import encode

NAME = r"[A-Z][a-z]+ [A-Z][a-z]+"
HELD_OUT_SEED = 20_000_000  # above every training stream's seeds


def calib_by_kind(checkpoint: str, seed: int, examples: int, length: int = 1024) -> dict[str, tuple[int, int, int]]:
    """kind -> (examples, all answer tokens right, first digit right)."""
    tokenizer = AutoTokenizer.from_pretrained(checkpoint)
    model = AutoModelForCausalLM.from_pretrained(checkpoint).eval()
    counts: dict[str, list[int]] = {}
    for example in retrieval_calib.examples(tokenizer, length, examples, seed):
        context = tokenizer(example["input"], add_special_tokens=False)["input_ids"]
        target = tokenizer(" " + example["target"], add_special_tokens=False)["input_ids"]  # tokens: " ", digits...
        with torch.no_grad():
            predicted = model(torch.tensor([context + target])).logits[0, len(context) - 1 : -1].argmax(-1).tolist()
        right = [p == t for p, t in zip(predicted, target, strict=True)]
        tally = counts.setdefault(example["kind"], [0, 0, 0])
        tally[0] += 1
        tally[1] += all(right)
        tally[2] += right[1]
    return {kind: (total, whole, first) for kind, (total, whole, first) in counts.items()}


def keyed_kind(question: str, answer: str) -> str:
    """A keyed document's kind: two answers -> multivalue, several names asked about -> multikey."""
    names = {match for match in re.findall(NAME, question) if not match.startswith("The ")}
    return "multivalue" if re.search(r" and |, ", answer) else "multikey" if len(names) > 1 else "single"


def keyed_by_kind(checkpoint: str, length: int, documents: int) -> dict[str, tuple[int, int]]:
    """kind -> (documents, all answer tokens right), teacher-forced."""
    tokenizer = AutoTokenizer.from_pretrained(checkpoint)
    model = AutoModelForCausalLM.from_pretrained(checkpoint).eval()
    maker = DocumentMaker(random.Random(HELD_OUT_SEED + 7 * length))
    counts: dict[str, list[int]] = {}
    for _ in range(documents):
        pieces = maker.keyed(length)
        ids, answer = encode(tokenizer, pieces, length)
        with torch.no_grad():
            predicted = model(torch.tensor([ids])).logits[0, :-1].argmax(-1)
        targets, marked = torch.tensor(ids[1:]), torch.tensor(answer[1:])
        tally = counts.setdefault(keyed_kind(pieces[0][0], pieces[1][0]), [0, 0])
        tally[0] += 1
        tally[1] += bool((predicted[marked] == targets[marked]).all())
    return {kind: (n, right) for kind, (n, right) in sorted(counts.items())}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    calib = commands.add_parser("calib", help="bosch_retrieval_calib examples by kind")
    calib.add_argument("checkpoint")
    calib.add_argument("--seed", type=int, default=1, help="calib_seed (default 1: a development draw)")
    calib.add_argument("--examples", type=int, default=24)
    keyed = commands.add_parser("keyed", help="held-out keyed training documents by kind")
    keyed.add_argument("checkpoint")
    keyed.add_argument("--length", type=int, default=1024)
    keyed.add_argument("--documents", type=int, default=96)
    args = parser.parse_args(argv)
    if args.command == "calib":
        for kind, (total, whole, first_digit) in calib_by_kind(args.checkpoint, args.seed, args.examples).items():
            print(f"{kind}: {whole}/{total} right, first digit {first_digit}/{total}")
    else:
        counts = keyed_by_kind(args.checkpoint, args.length, args.documents)
        print(args.length, {kind: f"{right}/{n} = {right / n:.2f}" for kind, (n, right) in counts.items()})


if __name__ == "__main__":
    main()
