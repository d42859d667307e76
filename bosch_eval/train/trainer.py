"""The continual-pretraining loop of a hybrid model (paper B.5), on Accelerate.

Accelerate provides the devices and processes (one CPU, N GPUs under DDP, FSDP from an
``accelerate launch --config_file``), mixed precision, gradient accumulation and the
resumable state (``save_state``/``load_state``: weights, optimizer, schedule, RNGs, plus
the data stream and progress registered with ``register_for_checkpointing``).
transformers gives the schedule (``get_scheduler``); the optimizer is torch's AdamW.

Batching: every optimizer step reads ``batch_size`` packed sequences from the stream,
the same ones in every process; micro-step ``j`` of process ``r`` trains on rows
``(j·N + r)·m … +m``. So one process or N see the same data per step and, up to float
summation order, take the same steps.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import IO, Any

import torch

from bosch_eval.attention.hybrid_attention import HybridAttention, hybridize
from bosch_eval.masks.mask_sources import MaskRequest, resolve_mask
from bosch_eval.models.model_check import resolve_model
from bosch_eval.models.resolved_model import ResolvedModel
from bosch_eval.models.model_defaults import DEFAULTS_FILE
from bosch_eval.models.rope_scaling import scaled_config
from bosch_eval.runtime.errors import MaskError, SettingsError
from bosch_eval.runtime.versions import versions
from bosch_eval.train.data import PackedSequences, open_source

STATE_DIR = "state"  # resumable Accelerate states, state/step-00000010 ...


@dataclass(frozen=True)
class TrainSettings:
    """Everything that defines a run; a ``--resume`` must repeat it exactly."""

    model: str
    mask_source: str | None
    data: str
    steps: int
    seq_len: int
    batch_size: int  # sequences per optimizer step, all processes together
    micro_batch_size: int  # sequences per forward pass per process
    lr: float
    lr_scheduler: str
    warmup_ratio: float
    weight_decay: float
    max_grad_norm: float
    seed: int
    text_field: str = "text"
    data_split: str = "train"
    rope_scaling: str | None = None
    rope_factor: float | None = None
    rope_original_max_positions: int | None = None
    attn_backend: str = "auto"
    mixed_precision: str = "no"

    def __post_init__(self) -> None:
        for name in ("steps", "seq_len", "batch_size", "micro_batch_size"):
            if getattr(self, name) < 1:
                raise SettingsError(
                    f"--{name.replace('_', '-')}: expected a positive integer, got {getattr(self, name)}"
                )
        if not 0.0 <= self.warmup_ratio <= 1.0:
            raise SettingsError(f"--warmup-ratio: expected a value in [0, 1], got {self.warmup_ratio}")
        if self.lr <= 0:
            raise SettingsError(f"--lr: expected a positive learning rate, got {self.lr}")

    def accumulation_steps(self, processes: int) -> int:
        """Micro-steps per optimizer step in each process."""
        per_step = self.micro_batch_size * processes
        if self.batch_size % per_step:
            raise SettingsError(
                f"--batch-size: {self.batch_size} sequences per step is not a multiple of "
                f"--micro-batch-size {self.micro_batch_size} × {processes} processes"
            )
        return self.batch_size // per_step


class Progress:
    """The run's counters and log, saved and restored with the Accelerate state."""

    def __init__(self) -> None:
        self.step, self.tokens, self.elapsed_s = 0, 0, 0.0
        self.history: list[dict[str, Any]] = []

    def state_dict(self) -> dict[str, Any]:
        return {"step": self.step, "tokens": self.tokens, "elapsed_s": self.elapsed_s, "history": list(self.history)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.step, self.tokens, self.elapsed_s = state["step"], state["tokens"], state["elapsed_s"]
        self.history = list(state["history"])


def latest_state(out: Path) -> Path | None:
    """The newest complete state directory under ``out/state`` (an interrupted save is a ``.tmp``)."""
    states = sorted(p for p in (out / STATE_DIR).glob("step-*") if p.is_dir() and not p.name.endswith(".tmp"))
    return states[-1] if states else None


def load_model(settings: TrainSettings, device: torch.device) -> tuple[Any, Any, HybridAttention]:
    """The model (YaRN set on its config if asked) hybridized with its mask, its tokenizer, and
    the hybrid handle: its ``mask``, and, left as a ``with`` block, the model given back as loaded."""
    from lm_eval.utils import simple_parse_args_string
    from transformers import AutoModelForCausalLM, AutoTokenizer

    resolved = ResolvedModel.named(settings.model)
    path, saved = str(resolved.path), resolved.saved_mask
    extra: dict[str, Any] = {}
    if settings.rope_scaling == "yarn":
        extra["config"] = scaled_config(path, settings.rope_factor, settings.rope_original_max_positions)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, **extra)
    tokenizer = AutoTokenizer.from_pretrained(path)
    if settings.mask_source is None:
        if saved is None:
            raise MaskError(
                f"--mask-source: {path} is not a hybrid checkpoint; pass mask=FILE, ranking=FILE,ratio=R or layers=...,ratio=R"
            )
        mask, source = saved, resolved.config_file
    else:
        args = simple_parse_args_string(settings.mask_source)
        unknown = set(args) - {"mask", "ranking", "layers", "ratio", "seed", "window", "sink"}
        if unknown:
            raise MaskError(
                f"--mask-source: unknown keys {sorted(unknown)}; expected mask, ranking, layers, ratio, seed, window, sink"
            )
        sinks = args.pop("sink", None)
        request = MaskRequest(**args, sinks=sinks)
        mask, source = resolve_mask(
            resolved.shape, request, default_window=resolved.defaults.window, model_name=settings.model
        )
        if saved is not None and (saved.bits, saved.window, saved.sinks) != (mask.bits, mask.window, mask.sinks):
            raise MaskError(
                f"--mask-source {settings.mask_source}: differs from the mask saved in {resolved.config_file}; drop it to train with the saved one"
            )
    model.to(device)
    return model, tokenizer, hybridize(model, mask, backend=settings.attn_backend, source=source)


def train(settings: TrainSettings, out: Path, *, resume: bool = False, save_every: int = 0, export_every: int = 0,
          keep_states: int = 2, progress_bar: bool = True) -> Path:  # fmt: skip
    """Continually pretrain ``settings.model`` with its head mask fixed; write a hybrid checkpoint to ``out``.

    Args:
        settings: the run (see :class:`TrainSettings`).
        out: output directory: ``config.json`` (with ``bosch_mask``), weights, tokenizer,
            ``training.json``, ``train_log.jsonl``, ``state/`` (resumable) and ``step-N/``
            (exported checkpoints).
        resume: continue from the newest state in ``out/state``; the settings must match.
        save_every: write a resumable state every this many steps (0: never).
        export_every: also write a loadable hybrid checkpoint ``out/step-N`` every this many steps.
        keep_states: how many resumable states to keep.
        progress_bar: show a tqdm bar with loss and tokens/s (main process).

    Returns:
        ``out``, which ``lm_eval --model bosch --model_args pretrained=<out>`` loads with its mask.
    """
    from accelerate import Accelerator
    from accelerate.utils import set_seed

    accelerator = Accelerator(cpu=not torch.cuda.is_available(), mixed_precision=settings.mixed_precision)
    accumulation = settings.accumulation_steps(accelerator.num_processes)
    accelerator.gradient_accumulation_steps = accumulation
    set_seed(settings.seed)
    model, tokenizer, hybrid = load_model(settings, accelerator.device)  # bad mask sources fail before out is touched
    with hybrid:  # the model leaves the run as it came, however the run ends
        _check_run_dir(out, settings, resume, accelerator.is_main_process)
        accelerator.wait_for_everyone()
        run = _prepare(accelerator, model, tokenizer, settings, accumulation)
        if resume and (state := latest_state(out)) is not None:
            accelerator.load_state(str(state))
        _run_steps(run, settings, out, _Saves(save_every, export_every, keep_states), progress_bar)
        _export(accelerator, run.model, tokenizer, out, settings, run.progress)
    accelerator.wait_for_everyone()
    accelerator.end_training()
    return out


@dataclass(frozen=True)
class _Saves:
    """How often a run writes what it has: resumable states and loadable checkpoints (0: never)."""

    state_every: int
    export_every: int
    keep_states: int


@dataclass(frozen=True)
class _Run:
    """What every optimizer step works on, prepared once before the first."""

    accelerator: Any
    model: Any
    tokenizer: Any
    optimizer: torch.optim.Optimizer
    scheduler: Any
    stream: Any  # PackedSequences
    progress: Progress
    accumulation: int  # micro-steps per optimizer step in each process


def _prepare(accelerator: Any, model: Any, tokenizer: Any, settings: TrainSettings, accumulation: int) -> _Run:
    """Optimizer, schedule and data stream, with what a resume restores registered for checkpointing."""
    from transformers import get_scheduler

    model.train()
    optimizer = torch.optim.AdamW(
        model.parameters(), lr=settings.lr, weight_decay=settings.weight_decay, betas=(0.9, 0.95)
    )
    scheduler = get_scheduler(
        settings.lr_scheduler, optimizer,
        num_warmup_steps=round(settings.warmup_ratio * settings.steps), num_training_steps=settings.steps,
    )  # fmt: skip
    # One scheduler step per optimizer step: Accelerate must not step it once per process.
    model, optimizer = accelerator.prepare(model, optimizer)
    stream = PackedSequences(open_source(settings.data, settings.seq_len, settings.seed, settings.text_field, settings.data_split),
                             tokenizer, settings.seq_len)  # fmt: skip
    progress = Progress()
    accelerator.register_for_checkpointing(scheduler, stream, progress)
    return _Run(accelerator, model, tokenizer, optimizer, scheduler, stream, progress, accumulation)


def _run_steps(run: _Run, settings: TrainSettings, out: Path, saves: _Saves, progress_bar: bool) -> None:
    """Train from ``run.progress.step`` to ``settings.steps``: a log line per step, states and
    checkpoints as ``saves`` asks (the final checkpoint is the caller's)."""
    from tqdm import tqdm

    accelerator, progress = run.accelerator, run.progress
    bar = tqdm(
        total=settings.steps,
        initial=progress.step,
        desc="train",
        disable=not (progress_bar and accelerator.is_main_process),
    )
    started = time.perf_counter() - progress.elapsed_s
    with _open_log(out, progress, accelerator.is_main_process) as log:
        while progress.step < settings.steps:
            step_started = time.perf_counter()
            step_loss = _optimizer_step(run, settings)
            progress.step += 1
            progress.tokens += settings.batch_size * settings.seq_len
            progress.elapsed_s = time.perf_counter() - started
            tokens_per_s = settings.batch_size * settings.seq_len / (time.perf_counter() - step_started)
            record = {"step": progress.step, "loss": round(step_loss, 5), "lr": run.scheduler.get_last_lr()[0], "tokens": progress.tokens,
                      "tokens_per_s": round(tokens_per_s, 1), "elapsed_s": round(progress.elapsed_s, 2)}  # fmt: skip
            progress.history.append(record)
            if log is not None:
                log.write(json.dumps(record) + "\n")
                log.flush()
            bar.set_postfix(loss=f"{step_loss:.4f}", tok_s=f"{tokens_per_s:.0f}")
            bar.update(1)
            _save_on_schedule(run, settings, out, saves)
    bar.close()


def _open_log(out: Path, progress: Progress, main: bool) -> IO[str] | contextlib.nullcontext[None]:
    """``train_log.jsonl`` rewritten from the restored history (a kill after the last state
    left later steps in the file), open for the steps to come; nothing in the other processes."""
    if not main:
        return contextlib.nullcontext()
    log = (out / "train_log.jsonl").open("w")
    log.writelines(json.dumps(record) + "\n" for record in progress.history)
    log.flush()
    return log


def _optimizer_step(run: _Run, settings: TrainSettings) -> float:
    """One optimizer step over ``batch_size`` sequences; the mean loss over every process.

    Micro-step ``j`` of process ``r`` trains on rows ``(j·N + r)·m … +m`` of the batch, which
    is the same in every process (module docstring)."""
    accelerator, model, rows = run.accelerator, run.model, settings.micro_batch_size
    batch = run.stream.next_batch(settings.batch_size)  # [batch_size, seq_len], identical in every process
    loss_sum = torch.zeros((), device=accelerator.device)
    for micro in range(run.accumulation):
        first = (micro * accelerator.num_processes + accelerator.process_index) * rows
        ids = batch[first : first + rows].to(accelerator.device)
        with accelerator.accumulate(model):
            loss = model(input_ids=ids, labels=ids).loss  # mean next-token loss; packed rows have no padding
            accelerator.backward(loss)
            if accelerator.sync_gradients and settings.max_grad_norm > 0:
                accelerator.clip_grad_norm_(model.parameters(), settings.max_grad_norm)
            run.optimizer.step()
            run.optimizer.zero_grad(set_to_none=True)
        loss_sum += loss.detach()
    run.scheduler.step()
    return accelerator.reduce(loss_sum / run.accumulation, reduction="mean").item()


def _save_on_schedule(run: _Run, settings: TrainSettings, out: Path, saves: _Saves) -> None:
    """The checkpoint and state ``saves`` asks for after this step; none after the last (the caller exports it)."""
    step = run.progress.step
    if saves.export_every and step % saves.export_every == 0 and step < settings.steps:
        _export(run.accelerator, run.model, run.tokenizer, out / f"step-{step:08d}", settings, run.progress)
    if saves.state_every and step % saves.state_every == 0 and step < settings.steps:
        _save_state(run.accelerator, out, step, saves.keep_states)


def _check_run_dir(out: Path, settings: TrainSettings, resume: bool, main: bool) -> None:
    """A fresh run needs an empty ``out``; a resume needs the same settings as the run it continues."""
    record = out / "train_settings.json"
    if resume:
        if not record.is_file():
            raise SettingsError(f"--resume: {record} is missing; nothing to resume in {out}")
        before = json.loads(record.read_text())
        changed = {key: (before.get(key), value) for key, value in asdict(settings).items() if before.get(key) != value}
        if changed:
            field, (was, now) = next(iter(changed.items()))
            raise SettingsError(
                f"--resume: {record} field {field!r} was {was!r}, this run has {now!r}; resume with the same settings"
            )
        return
    if main:  # only the main process checks and writes, or the others would find its file
        if out.exists() and any(out.iterdir()):
            raise SettingsError(
                f"--out {out}: not empty; pass --resume to continue the run there, or another directory"
            )
        out.mkdir(parents=True, exist_ok=True)
        record.write_text(json.dumps(asdict(settings), indent=1) + "\n")


def _save_state(accelerator: Any, out: Path, step: int, keep: int) -> None:
    """Write the resumable state to a temporary directory, then rename it: a kill mid-save
    leaves the previous state intact."""
    final = out / STATE_DIR / f"step-{step:08d}"
    partial = final.with_name(final.name + ".tmp")
    accelerator.save_state(str(partial))
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        partial.rename(final)
        for old in sorted(p for p in (out / STATE_DIR).glob("step-*") if not p.name.endswith(".tmp"))[:-keep]:
            shutil.rmtree(old)
    accelerator.wait_for_everyone()


def _export(
    accelerator: Any, model: Any, tokenizer: Any, path: Path, settings: TrainSettings, progress: Progress
) -> None:
    """A hybrid checkpoint (mask in ``config.json``), tokenizer, model defaults and ``training.json``."""
    state_dict = accelerator.get_state_dict(model)  # gathers FSDP shards; every process must call it
    if accelerator.is_main_process:
        unwrapped = accelerator.unwrap_model(model)
        unwrapped.save_pretrained(path, state_dict=state_dict, save_function=accelerator.save)
        tokenizer.save_pretrained(path)
        defaults = Path(resolve_model(settings.model)) / DEFAULTS_FILE
        if defaults.is_file():  # the source model's recommended window and calibration length still hold
            shutil.copyfile(defaults, path / DEFAULTS_FILE)
        summary = {"settings": asdict(settings), "processes": accelerator.num_processes, "step": progress.step,
                   "tokens": progress.tokens, "wall_time_s": round(progress.elapsed_s, 2), "versions": versions("torch", "transformers", "accelerate", "bosch-eval"),
                   "history": progress.history}  # fmt: skip
        (path / "training.json").write_text(json.dumps(summary, indent=1) + "\n")
    accelerator.wait_for_everyone()
