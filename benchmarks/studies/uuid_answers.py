"""What a model generates on ``bosch_niah_dev``'s UUID format, against what its prefill score expects.

    python benchmarks/studies/uuid_answers.py 3 > results/smollm2/uuid_answers.md   # [--model smollm2]

``bosch_niah_dev`` scores one forward pass: ``acc`` is 1 when the value's tokens are the
greedy continuation of the prompt; greedy generation on the first documents shows what the
model answers instead (results/smollm2/README.md). Development documents only (``dev_seed`` 1).
"""

from __future__ import annotations

import argparse

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from bosch_eval.models.model_check import resolve_model
from bosch_eval.tasks.niah import dev_split


def answers_table(model_name: str, documents: int) -> str:
    """One row per development document: the prompt's end, the scored tokens, the greedy ones."""
    path = resolve_model(model_name)
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16).eval()
    docs = dev_split.dataset(tokenizer=path, dev_lengths=[1024], dev_samples=documents, dev_variants=["single_3"])[
        "test"
    ]
    lines = [
        "| document | prompt ends | scored continuation (tokens) | greedy generation (tokens) |",
        "|---|---|---|---|",
    ]
    for index, doc in enumerate(docs):
        context = tokenizer(doc["input"], return_tensors="pt").input_ids
        target = tokenizer(doc["input"] + " " + doc["target"]).input_ids[context.shape[1] :]
        with torch.no_grad():
            output = model.generate(context, max_new_tokens=len(target) + 2, do_sample=False)
        generated = output[0, context.shape[1] :].tolist()
        lines.append(
            f"| {index} | …{doc['input'][-40:]!r} | {tokens(tokenizer, target[:4])} … | {tokens(tokenizer, generated[:5])} … |"
        )
    return "\n".join(lines)


def tokens(tokenizer: AutoTokenizer, ids: list[int]) -> str:
    """Each token of ``ids`` as its quoted text."""
    return " ".join(repr(tokenizer.decode([i])) for i in ids)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("documents", type=int, nargs="?", default=3, help="how many development documents (default 3)")
    parser.add_argument("--model", default="smollm2", help="a model name or path (default smollm2)")
    args = parser.parse_args(argv)
    print(answers_table(args.model, args.documents))


if __name__ == "__main__":
    main()
