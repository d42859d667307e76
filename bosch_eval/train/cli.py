"""``bosch-eval train``: its flags and the call into :func:`bosch_eval.train.trainer.train`."""

from __future__ import annotations

import argparse
from pathlib import Path

from bosch_eval.masks.layer_heuristics import LAYER_HEURISTICS
from bosch_eval.models.rope_scaling import ROPE_SCALINGS, check_rope_args


def add_train_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags of ``bosch-eval train`` (and of ``python -m bosch_eval.train`` for ``accelerate launch -m``)."""
    parser.add_argument(
        "--model",
        required=True,
        help="HF id or path of the model to train, or 'toy' / 'toy-l' / 'smollm2' (a bundled or packaged model)",
    )
    parser.add_argument("--mask-source", help="the head mask, as --model bosch model_args: mask=FILE | ranking=FILE,ratio=R | "
                        f"layers={'|'.join(LAYER_HEURISTICS.names())},ratio=R[,seed=S]; plus window=W (default: the mask's, else the model's) and sink=S (attention sinks, default: the mask's, else 0). "
                        "Omit it for a hybrid checkpoint (its saved mask); layers=intr,ratio=0 trains the full model")  # fmt: skip
    parser.add_argument("--data", required=True, help="'toy' (toy corpus generator), a .txt/.jsonl file or directory, "
                        "a datasets save_to_disk directory, or hf:NAME[:CONFIG]")  # fmt: skip
    parser.add_argument("--text-field", default="text", help="field holding the document in JSONL/dataset records")
    parser.add_argument("--data-split", default="train", help="split of an hf: dataset")
    parser.add_argument("--steps", type=int, required=True, help="optimizer steps")
    parser.add_argument("--out", type=Path, required=True, help="directory for the hybrid checkpoint, logs and states")
    parser.add_argument("--resume", action="store_true", help="continue the run in --out from its newest state")
    parser.add_argument("--seq-len", type=int, default=1024, help="tokens per packed sequence")
    parser.add_argument(
        "--batch-size", type=int, default=8, help="sequences per optimizer step, all processes together"
    )
    parser.add_argument("--micro-batch-size", type=int, default=1,
                        help="sequences per forward pass per process (gradient accumulation makes up the rest)")  # fmt: skip
    parser.add_argument("--lr", type=float, default=1e-5, help="peak learning rate (paper B.5: 1e-5)")
    parser.add_argument(
        "--lr-scheduler",
        default="cosine",
        help="a transformers get_scheduler name (cosine, linear, constant_with_warmup, ...)",
    )
    parser.add_argument(
        "--warmup-ratio", type=float, default=0.1, help="share of the steps spent in linear warm-up (paper: 0.1)"
    )
    parser.add_argument("--weight-decay", type=float, default=0.0, help="AdamW weight decay")
    parser.add_argument("--max-grad-norm", type=float, default=1.0, help="gradient clipping (0: off)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the toy corpus and of torch")
    parser.add_argument("--save-every", type=int, default=0, help="write a resumable state every K steps (0: never)")
    parser.add_argument("--keep-states", type=int, default=2, help="resumable states kept")
    parser.add_argument(
        "--export-every", type=int, default=0, help="also write a loadable hybrid checkpoint out/step-N every K steps"
    )
    parser.add_argument(
        "--rope-scaling", choices=ROPE_SCALINGS, help="extend the context: set this RoPE scaling on the config"
    )
    parser.add_argument("--rope-factor", type=float, help="YaRN factor F: the context grows F times")
    parser.add_argument("--rope-original-max-positions", type=int,
                        help="context the model was trained for (default: the config's max_position_embeddings)")  # fmt: skip
    parser.add_argument(
        "--attn-backend",
        default="auto",
        help="auto or a backend registered in bosch_eval.attention.kernels (a wrong name lists them)",
    )
    parser.add_argument("--mixed-precision", default="auto", choices=["auto", "no", "bf16", "fp16"],
                        help="auto: bf16 on a CUDA device that supports it, else no")  # fmt: skip
    parser.add_argument("--no-progress-bar", action="store_true", help="no tqdm bar (the log still gets every step)")


def run_from_args(args: argparse.Namespace) -> None:
    import torch

    from bosch_eval.train.trainer import TrainSettings, train  # torch, transformers, accelerate: not for --help

    names = ("--rope-scaling", "--rope-factor", "--rope-original-max-positions")
    scaling, factor, original = check_rope_args(
        args.rope_scaling, args.rope_factor, args.rope_original_max_positions, names
    )
    precision = args.mixed_precision
    if precision == "auto":
        precision = "bf16" if torch.cuda.is_available() and torch.cuda.is_bf16_supported() else "no"
    settings = TrainSettings(
        model=args.model, mask_source=args.mask_source, data=args.data, steps=args.steps, seq_len=args.seq_len,
        batch_size=args.batch_size, micro_batch_size=args.micro_batch_size, lr=args.lr, lr_scheduler=args.lr_scheduler,
        warmup_ratio=args.warmup_ratio, weight_decay=args.weight_decay, max_grad_norm=args.max_grad_norm, seed=args.seed,
        text_field=args.text_field, data_split=args.data_split, rope_scaling=scaling, rope_factor=factor,
        rope_original_max_positions=original, attn_backend=args.attn_backend, mixed_precision=precision,
    )  # fmt: skip
    out = train(settings, args.out, resume=args.resume, save_every=args.save_every, export_every=args.export_every,
                keep_states=args.keep_states, progress_bar=not args.no_progress_bar)  # fmt: skip
    print(f"{out}: hybrid checkpoint; lm_eval --model bosch --model_args pretrained={out}")


def add_train_parser(commands: argparse._SubParsersAction) -> None:
    """Register ``bosch-eval train``."""
    parser = commands.add_parser("train", help="continual pretraining of a hybrid model with its mask fixed")
    add_train_arguments(parser)
    parser.set_defaults(run=run_from_args)
