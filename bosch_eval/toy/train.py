"""Train the bundled toy model: a small Qwen3 that must retrieve needles from far back.

    python -m bosch_eval.toy.train --out bosch_eval/toy/model

Runs on CPU or CUDA (``--device``), fixed seed. Writes the checkpoint (weights, config,
tokenizer) and ``training.json`` (arguments, wall time, per-step log, final metrics) to
``--out``; ``--log`` gets one JSON line per logged step while it runs. Every
``--eval-every`` steps the whole training state (weights, optimizer, schedule, random
streams, log so far) goes to ``<out>/train_state.pt``; ``--resume`` continues from it and
ends with the same weights as an uninterrupted run.

Recipe (why): retrieval heads form fastest on dense multi-query associative recall with
short keys and values, so training starts there alone and then shifts to RULER-format
documents; document lengths follow a curriculum from short to the full context; the loss weighs answer tokens fully and the
rest of the text (haystack, templates) at ``--context-weight``, because the random values
in needles are unpredictable at first sight and would otherwise dominate the gradient.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from transformers import AutoTokenizer, PreTrainedTokenizerFast, Qwen3Config, Qwen3ForCausalLM

from bosch_eval.toy.corpus import DOCUMENT_KINDS, TRAIN_SEED_BASE, DocumentMaker, Piece

EVAL_SEED = 20_000_000  # held-out documents for the training log; never used for training
EVAL_KINDS = ("niah_single_1", "ruler", "calib", "keyed")
STATE_FILE = "train_state.pt"  # what --resume continues from, under --out


def train_tokenizer(vocab_size: int, seed: int) -> PreTrainedTokenizerFast:
    """Byte-level BPE (any text encodes) with single-digit tokens, trained on the corpus."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    # Single digits keep numbers copyable digit by digit, as in Qwen's own tokenizer.
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False)]
    )
    tokenizer.decoder = decoders.ByteLevel()
    maker = DocumentMaker(random.Random(TRAIN_SEED_BASE - 1 - seed))
    mix = {"prose": 1.0, "recall": 1.0, "short_recall": 1.0, "ruler": 2.0, "calib": 1.0}
    texts = ["".join(text for text, _ in maker.document(400, mix)) for _ in range(3000)]
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=["<|endoftext|>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tokenizer.train_from_iterator(texts, trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tokenizer, eos_token="<|endoftext|>", pad_token="<|endoftext|>")


def encode(tokenizer: PreTrainedTokenizerFast, pieces: list[Piece], max_tokens: int) -> tuple[list[int], list[bool]]:
    """Token ids of a document and, per token, whether it belongs to an answer piece."""
    text = "".join(piece for piece, _ in pieces)
    spans, start = [], 0
    for piece, is_answer in pieces:
        if is_answer:
            spans.append((start, start + len(piece)))
        start += len(piece)
    encoded = tokenizer(text, return_offsets_mapping=True, add_special_tokens=False)
    answer = [any(a <= lo < b for a, b in spans) for lo, _ in encoded["offset_mapping"]]
    ids = encoded["input_ids"]
    # Keep the end (question and answer); documents are drawn near max_tokens anyway.
    return ids[-max_tokens:], answer[-max_tokens:]


def make_batch(
    tokenizer: PreTrainedTokenizerFast,
    maker: DocumentMaker,
    lengths: list[int],
    mix: dict[str, float],
    context_weight: float,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Right-padded ids ``[B, T]``, loss weights ``[B, T]`` (for predicting token t+1) and answer flags."""
    rows = [encode(tokenizer, maker.document(n, mix), n) for n in lengths]
    width = max(len(ids) for ids, _ in rows)
    ids = torch.full((len(rows), width), tokenizer.pad_token_id)
    answers = torch.zeros(len(rows), width, dtype=torch.bool)
    weights = torch.zeros(len(rows), width)
    for row, (tokens, answer) in enumerate(rows):
        ids[row, : len(tokens)] = torch.tensor(tokens)
        answers[row, : len(tokens)] = torch.tensor(answer)
        weights[row, : len(tokens)] = context_weight
    weights[answers] = 1.0
    return ids, weights, answers


def loss_and_accuracy(
    model: Qwen3ForCausalLM, ids: torch.Tensor, weights: torch.Tensor, answers: torch.Tensor
) -> tuple[torch.Tensor, float]:
    """Weighted next-token loss, and the share of rows whose every answer token is greedy."""
    logits = model(ids).logits[:, :-1].float()
    targets, weights, answers = ids[:, 1:], weights[:, 1:], answers[:, 1:]
    losses = F.cross_entropy(logits.transpose(1, 2), targets, reduction="none")
    loss = (losses * weights).sum() / weights.sum()
    correct = (logits.argmax(-1) == targets) | ~answers
    has_answer = answers.any(1)
    accuracy = correct.all(1)[has_answer].float().mean().item() if has_answer.any() else float("nan")
    return loss, accuracy


def curriculum(step: int, args: argparse.Namespace) -> tuple[int, dict[str, float]]:
    """Longest document length and document mix at ``step``.

    Phase 1 (first third of ``--curriculum-steps``): short documents of short-key recall
    only, until retrieval works at all (it emerged at steps 400–600 of the default run; a
    run whose phase 1 ended at step 450 never learned to retrieve by step 1200); phase 2 adds long-form recall and RULER documents;
    lengths then grow linearly to ``--max-len`` by the end of the curriculum. ``--mix``
    replaces phase 2's mix with fixed weights.
    """
    phase_one = args.curriculum_steps // 3
    if step < phase_one:
        return args.start_len, {"short_recall": 1.0}
    progress = min(1.0, (step - phase_one) / max(1, args.curriculum_steps - phase_one))
    max_len = int(args.start_len + progress * (args.max_len - args.start_len))
    if args.mix is not None:
        return max_len, args.mix
    return max_len, {"short_recall": 0.15, "recall": 0.2, "niah_single_1": 0.15, "ruler": 0.2 + 0.2 * progress,
                     "calib": 0.25, "prose": 0.05}  # fmt: skip


@torch.no_grad()
def evaluate(
    model: Qwen3ForCausalLM, tokenizer: PreTrainedTokenizerFast, device: torch.device, lengths: list[int], n: int
) -> dict[str, float]:
    """Teacher-forced answer accuracy on held-out documents of each of ``EVAL_KINDS`` per length."""
    model.eval()
    scores = {}
    for kind in EVAL_KINDS:
        for length in lengths:
            maker = DocumentMaker(random.Random(EVAL_SEED + length))
            correct = []
            for start in range(0, n, 8):
                ids, weights, answers = make_batch(tokenizer, maker, [length] * min(8, n - start), {kind: 1.0}, 0.0)
                _, accuracy = loss_and_accuracy(model, ids.to(device), weights.to(device), answers.to(device))
                correct.append(accuracy)
            scores[f"{kind}_acc@{length}"] = sum(correct) / len(correct)
    model.train()
    return scores


def build_model(args: argparse.Namespace, vocab_size: int, eos: int) -> Qwen3ForCausalLM:
    config = Qwen3Config(
        vocab_size=vocab_size,
        hidden_size=args.hidden,
        intermediate_size=args.hidden * 3,
        num_hidden_layers=args.layers,
        num_attention_heads=args.heads,
        num_key_value_heads=args.kv_heads,
        head_dim=args.head_dim or args.hidden // args.heads,
        max_position_embeddings=args.max_positions,
        tie_word_embeddings=True,
        bos_token_id=eos,
        eos_token_id=eos,
        pad_token_id=eos,
    )
    return Qwen3ForCausalLM(config)


def load_weights(
    model: Qwen3ForCausalLM, tokenizer: PreTrainedTokenizerFast, checkpoint: Path, parser: argparse.ArgumentParser
) -> None:
    """Copy ``checkpoint``'s weights into ``model``; a checkpoint of another shape or
    tokenizer is an error naming ``--init-from``, never a partial load."""
    if AutoTokenizer.from_pretrained(checkpoint).get_vocab() != tokenizer.get_vocab():
        parser.error(f"--init-from {checkpoint}: its tokenizer differs from this run's (--vocab/--seed)")
    try:
        model.load_state_dict(Qwen3ForCausalLM.from_pretrained(checkpoint).state_dict())
    except RuntimeError as err:
        parser.error(f"--init-from {checkpoint}: its weights do not fit the model these arguments build: {err}")


def save_state(path: Path, model: Qwen3ForCausalLM, optimizer: torch.optim.Optimizer, scheduler: Any,
               maker: DocumentMaker, next_step: int, elapsed_s: float, history: list[dict[str, Any]]) -> None:  # fmt: skip
    """Everything ``--resume`` needs, written to a temporary file first so a kill never leaves half a state."""
    state = {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict(),
             "documents_rng": maker.rng.getstate(), "torch_rng": torch.get_rng_state(), "next_step": next_step,
             "elapsed_s": elapsed_s, "history": history}  # fmt: skip
    partial = path.with_suffix(".tmp")
    torch.save(state, partial)
    partial.replace(path)


@dataclass(frozen=True)
class Run:
    """What every step of one training run works on, built once before the first."""

    model: Qwen3ForCausalLM
    tokenizer: PreTrainedTokenizerFast
    optimizer: torch.optim.Optimizer
    scheduler: Any
    maker: DocumentMaker
    device: torch.device


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True, help="checkpoint directory to write")
    parser.add_argument("--log", type=Path, help="JSON-lines progress log (default: <out>/train_log.jsonl)")
    parser.add_argument("--seed", type=int, default=0, help="seed of weights and training documents")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", help="cpu or cuda")
    parser.add_argument("--steps", type=int, default=3000, help="optimizer steps (the length of the lr schedule)")
    parser.add_argument(
        "--stop-after",
        type=int,
        help="end after this many steps with the schedule of --steps (a run cut short on "
        "purpose: toy-l's weights are its state at step 2500 of 6000)",
    )
    parser.add_argument("--batch-tokens", type=int, default=8192, help="tokens per batch (rows = budget // length)")
    parser.add_argument("--start-len", type=int, default=96, help="longest document at step 0, tokens")
    parser.add_argument("--max-len", type=int, default=1152, help="longest document after the curriculum, tokens")
    parser.add_argument("--curriculum-steps", type=int, default=1500, help="steps over which lengths and mix ramp up")
    parser.add_argument(
        "--mix",
        type=json.loads,
        help='document kinds and weights after phase 1, as JSON (e.g. \'{"keyed": 0.5, '
        "\"recall\": 0.5}'; kinds: corpus.DOCUMENT_KINDS); default: the curriculum's mix, which ramps RULER up",
    )
    parser.add_argument("--lr", type=float, default=3e-3, help="peak learning rate (AdamW, cosine decay)")
    parser.add_argument("--warmup", type=int, default=100, help="linear warm-up steps")
    parser.add_argument("--context-weight", type=float, default=0.1, help="loss weight of non-answer tokens")
    parser.add_argument("--vocab", type=int, default=4096, help="BPE vocabulary size")
    parser.add_argument("--hidden", type=int, default=128, help="model width")
    parser.add_argument("--layers", type=int, default=4, help="decoder layers")
    parser.add_argument("--heads", type=int, default=8, help="query heads")
    parser.add_argument("--kv-heads", type=int, default=4, help="KV groups")
    parser.add_argument(
        "--head-dim",
        type=int,
        help="dimensions per attention head (default hidden // heads); keeps heads wide "
        "when there are many (16 heads of 16 dimensions on a 128-wide model)",
    )
    parser.add_argument("--max-positions", type=int, default=2048, help="max_position_embeddings")
    parser.add_argument(
        "--eval-every", type=int, default=100, help="steps between held-out evaluations and checkpoints"
    )
    parser.add_argument("--resume", action="store_true", help="continue from <out>/train_state.pt")
    parser.add_argument(
        "--init-from",
        type=Path,
        help="a second training stage: start from this checkpoint's weights (same shape and "
        "tokenizer) with a fresh optimizer, schedule and curriculum",
    )
    return parser


def check_args(args: argparse.Namespace, parser: argparse.ArgumentParser) -> int:
    """Reject what argparse cannot see (``--stop-after`` beyond ``--steps``, a bad ``--mix``);
    return the step the run ends before."""
    if args.stop_after is not None and not 0 < args.stop_after <= args.steps:
        parser.error(f"--stop-after {args.stop_after}: expected a step count in [1, --steps = {args.steps}]")
    if args.mix is not None:
        if not isinstance(args.mix, dict):
            parser.error(f"--mix {json.dumps(args.mix)}: expected a JSON object of document kinds and weights")
        unknown = [kind for kind in args.mix if kind not in DOCUMENT_KINDS]
        if (
            unknown
            or not all(isinstance(w, (int, float)) and w >= 0 for w in args.mix.values())
            or not any(args.mix.values())
        ):
            parser.error(f"--mix {json.dumps(args.mix)}: expected non-negative weights, not all zero, of document kinds "
                         f"{DOCUMENT_KINDS}; unknown: {unknown}")  # fmt: skip
    return args.steps if args.stop_after is None else args.stop_after


def start_run(args: argparse.Namespace, parser: argparse.ArgumentParser) -> Run:
    """The tokenizer, model, optimizer, schedule and document stream, in the order that draws
    the seeded random streams the same way on every run."""
    device = torch.device(args.device)
    tokenizer = train_tokenizer(args.vocab, args.seed)
    model = build_model(args, len(tokenizer), tokenizer.eos_token_id)
    if args.init_from is not None and not args.resume:
        load_weights(model, tokenizer, args.init_from, parser)
    model = model.to(device).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.01, betas=(0.9, 0.95))

    def schedule(step: int) -> float:
        return min(1.0, (step + 1) / args.warmup) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * step / args.steps)))

    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, schedule)
    maker = DocumentMaker(random.Random(TRAIN_SEED_BASE + args.seed))
    return Run(model, tokenizer, optimizer, scheduler, maker, device)


def restore_state(run: Run, path: Path) -> tuple[int, float, list[dict[str, Any]]]:
    """Load what :func:`save_state` wrote into ``run``; return the next step, the time spent and the log so far."""
    state = torch.load(path, weights_only=False)
    run.model.load_state_dict(state["model"])
    run.optimizer.load_state_dict(state["optimizer"])
    run.scheduler.load_state_dict(state["scheduler"])
    run.maker.rng.setstate(state["documents_rng"])
    torch.set_rng_state(state["torch_rng"])
    return state["next_step"], state["elapsed_s"], state["history"]


def train_step(run: Run, step: int, args: argparse.Namespace) -> tuple[torch.Tensor, float, int]:
    """One optimizer step on a fresh batch of the curriculum; its loss, accuracy and longest document."""
    max_len, mix = curriculum(step, args)
    lengths = [
        run.maker.rng.randint(max(32, max_len // 4), max_len) for _ in range(max(1, args.batch_tokens // max_len))
    ]
    ids, weights, answers = make_batch(run.tokenizer, run.maker, lengths, mix, args.context_weight)
    loss, accuracy = loss_and_accuracy(run.model, ids.to(run.device), weights.to(run.device), answers.to(run.device))
    run.optimizer.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(run.model.parameters(), 1.0)
    run.optimizer.step()
    run.scheduler.step()
    return loss, accuracy, max_len


def run_steps(
    run: Run, args: argparse.Namespace, steps: range, history: list[dict[str, Any]], started: float, log: Any
) -> None:
    """Train ``steps``, logging every tenth (held-out evaluation every ``--eval-every``) to
    ``history`` and ``log``, and saving the state every ``--eval-every`` steps."""
    last = steps.stop - 1
    for step in steps:
        loss, accuracy, max_len = train_step(run, step, args)
        if step % 10 == 0 or step == last:  # the loss is read (a device sync) only on logged steps
            record = {"step": step, "loss": round(loss.item(), 4), "train_acc": accuracy, "max_len": max_len,
                      "lr": run.scheduler.get_last_lr()[0], "elapsed_s": round(time.time() - started, 1)}  # fmt: skip
            if step % args.eval_every == 0 or step == last:
                record.update(evaluate(run.model, run.tokenizer, run.device, [512, 1024], 32))
            history.append(record)
            log.write(json.dumps(record) + "\n")
            log.flush()
        if (step + 1) % args.eval_every == 0:
            save_state(
                args.out / STATE_FILE,
                run.model,
                run.optimizer,
                run.scheduler,
                run.maker,
                step + 1,
                time.time() - started,
                history,
            )


def write_result(run: Run, args: argparse.Namespace, history: list[dict[str, Any]], started: float) -> None:
    """The checkpoint, tokenizer and ``training.json`` with the final held-out evaluation."""
    run.model.eval().save_pretrained(args.out)
    run.tokenizer.save_pretrained(args.out)
    final = evaluate(run.model, run.tokenizer, run.device, [512, 1024], 64)
    summary = {"args": {k: str(v) for k, v in vars(args).items()}, "wall_time_s": round(time.time() - started, 1),
               "final": final, "num_parameters": run.model.num_parameters(), "history": history}  # fmt: skip
    (args.out / "training.json").write_text(json.dumps(summary, indent=1) + "\n")
    print(json.dumps({"wall_time_s": summary["wall_time_s"], **final}))


def main(argv: list[str] | None = None) -> None:
    parser = build_parser()
    args = parser.parse_args(argv)
    last_step = check_args(args, parser)
    torch.manual_seed(args.seed)
    run = start_run(args, parser)
    args.out.mkdir(parents=True, exist_ok=True)
    history: list[dict[str, Any]] = []
    first_step, spent_s = 0, 0.0
    if args.resume:
        first_step, spent_s, history = restore_state(run, args.out / STATE_FILE)
    started = time.time() - spent_s
    with (args.log or args.out / "train_log.jsonl").open("a" if args.resume else "w") as log:
        run_steps(run, args, range(first_step, last_step), history, started, log)
    write_result(run, args, history, started)


if __name__ == "__main__":
    main()
