"""Why bosch_retrieval_calib version 1 scored 0 on SmolLM2, and which mix version 2 uses.

On a development draw of the calibration format (``calib_seed`` 1; the search's own
examples are seed 0, the test set is never read), scores each kind of example with full
attention, as lm-eval's loglikelihood ``acc`` does: an example counts when every answer
token is the greedy prediction after the prompt.

* ``v1``: the same examples cut after "Answer:" (version 1's format; version 1 itself fitted
  a few more haystack tokens into the same length, having no answer words to fit);
* ``v2``: the prompt ends with the answer's first words (version 2's format);
* kinds ``single``, ``multikey`` with 1, 2 or 3 other keys' needles, ``multivalue``.

    python benchmarks/studies/probe_calibration.py --out results/smollm2/calibration_probe.md
"""

from __future__ import annotations

import argparse
import shlex
import sys
import time
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from bosch_eval.models.model_check import resolve_model
from bosch_eval.runtime.versions import versions
from bosch_eval.tasks.niah import retrieval_calib


def greedy_hits(model, tokenizer, docs, answer_lead: bool) -> list[bool]:
    """Per example: is the target the greedy continuation of the prompt?"""
    hits = []
    for doc in docs:
        prompt = doc["input"] if answer_lead else doc["input"][: doc["input"].rindex("Answer:") + len("Answer:")]
        context = tokenizer(prompt).input_ids
        target = tokenizer(" " + doc["target"]).input_ids
        with torch.no_grad():
            logits = model(torch.tensor([context + target[:-1]])).logits[0, len(context) - 1 :]
        hits.append(bool((logits.argmax(-1) == torch.tensor(target)).all()))
    return hits


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="smollm2")
    parser.add_argument("--seq-len", type=int, default=1024)
    parser.add_argument("--examples", type=int, default=24, help="examples per row")
    parser.add_argument("--calib-seed", type=int, default=1, help="a development draw (0 is the search's own)")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    if args.calib_seed == 0:
        sys.exit("--calib-seed 0 draws the search's own calibration examples; use a development seed")
    path = resolve_model(args.model)
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=getattr(torch, args.dtype)).eval()
    rows = [("v1", ("single", "multikey", "multivalue"), 3), ("v2", ("single",), 1)]
    rows += [("v2", ("multikey",), keys) for keys in (1, 2, 3)] + [("v2", ("multivalue",), 1)]
    lines = [
        f"# {args.model} on bosch_retrieval_calib formats, full attention ({args.dtype}, {args.seq_len} tokens, "
        f"calib_seed {args.calib_seed}: a development draw)",
        "",
        f"`{shlex.join(['python', *sys.argv])}`; {', '.join(f'{k} {v}' for k, v in versions('torch', 'transformers').items())}",
        "",
        "| format | kinds | other keys (multikey) | examples | acc |",
        "|---|---|---|---|---|",
    ]
    started = time.perf_counter()
    for fmt, kinds, keys in rows:
        docs = retrieval_calib.examples(tokenizer, args.seq_len, args.examples, args.calib_seed, kinds, keys)
        hits = greedy_hits(model, tokenizer, docs, answer_lead=fmt == "v2")
        by_kind = {kind: [h for h, d in zip(hits, docs) if d["kind"] == kind] for kind in kinds}
        detail = (
            ", ".join(f"{kind} {sum(h) / len(h):.3f}" for kind, h in by_kind.items())
            if len(kinds) > 1
            else f"{sum(hits) / len(hits):.3f}"
        )
        lines.append(
            f"| {fmt} | {', '.join(kinds)} | {keys if 'multikey' in kinds else '–'} | {len(hits)} | {detail} |"
        )
        print(lines[-1], flush=True)
    lines += ["", f"{time.perf_counter() - started:.0f} s"]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
