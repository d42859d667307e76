"""What SmolLM2 generates on ``bosch_niah_dev``'s UUID format, against what its prefill score expects.

    python results/smollm2/uuid_answers.py 3 > results/smollm2/uuid_answers.md

``bosch_niah_dev`` scores one forward pass: ``acc`` is 1 when the value's tokens are the
greedy continuation of the prompt. Full attention scored 0 on 96 documents of the UUID
format (``single_3``), where the held-out generation task scores 0.81; greedy generation on
the first documents shows why. Development documents only (``dev_seed`` 1).
"""

from __future__ import annotations

import sys

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from bosch_eval.models.model_check import resolve_model
from bosch_eval.tasks.niah import dev_split


def main(documents: int) -> None:
    path = resolve_model("smollm2")
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.bfloat16).eval()
    docs = dev_split.dataset(tokenizer=path, dev_lengths=[1024], dev_samples=documents, dev_variants=["single_3"])["test"]
    print("| document | prompt ends | scored continuation (tokens) | greedy generation (tokens) |\n|---|---|---|---|")
    for index, doc in enumerate(docs):
        context = tokenizer(doc["input"], return_tensors="pt").input_ids
        target = tokenizer(doc["input"] + " " + doc["target"]).input_ids[context.shape[1] :]
        with torch.no_grad():
            output = model.generate(context, max_new_tokens=len(target) + 2, do_sample=False)
        generated = output[0, context.shape[1] :].tolist()
        print(f"| {index} | …{doc['input'][-40:]!r} | {tokens(tokenizer, target[:4])} … | {tokens(tokenizer, generated[:5])} … |")


def tokens(tokenizer: AutoTokenizer, ids: list[int]) -> str:
    """Each token of ``ids`` as its quoted text."""
    return " ".join(repr(tokenizer.decode([i])) for i in ids)


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 3)
