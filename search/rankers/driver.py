"""``compute_ranking``: run a model over the calibration inputs and rank its KV groups.

The model runs one sequence at a time through :func:`capture_attention`. Methods that
read probabilities do their work inside each layer's forward (no gradient, no logits:
only the decoder runs); Fisher runs the decoder with gradients, takes the mean
next-token cross-entropy through the output embeddings in chunks of rows (no ``T×V``
logit tensor), and does its work in each layer's backward hook. Either way one layer's
``q, k, v`` (``dO``) and one block of query rows are live at a time — see
:mod:`bosch_eval.search.rankers.blocks` for the bound.

A KV group's score is the mean of its query heads' scores (paper B.3).
"""

from __future__ import annotations

import inspect
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from bosch_eval.masks.head_mask import HeadRanking, ModelShape, check_window
from bosch_eval.runtime.checks import is_int
from bosch_eval.runtime.errors import ModelError, SettingsError
from bosch_eval.runtime.versions import versions
from bosch_eval.search.rankers import RANKERS
from bosch_eval.search.rankers.base import Ranker
from bosch_eval.search.rankers.blocks import query_blocks
from bosch_eval.search.rankers.capture import capture_attention
from bosch_eval.search.objective.defaults import PAPER_CALIB_TASK

DEFAULT_BLOCK_SIZE = 64
# Rows of output-embedding logits formed at once by Fisher's loss ([rows, vocab] floats).
LOSS_CHUNK = 512


def make_ranker(method: str, shape: ModelShape, window: int, options: Mapping[str, Any] | None = None) -> Ranker:
    """The ranker of ``method`` for a model of ``shape``; ``options`` are its settings.

    Raises:
        SettingsError: an unknown method or option (the message lists the valid ones).
    """
    cls = RANKERS.lookup(method)
    fixed = ("self", "num_layers", "num_heads", "window")
    valid = [name for name in inspect.signature(cls.__init__).parameters if name not in fixed]
    unknown = sorted(set(options or {}) - set(valid))
    if unknown:
        raise SettingsError(f"{method}: unknown option(s) {unknown}; valid options are {valid or 'none'}")
    return cls(shape.num_layers, shape.num_heads, window, **dict(options or {}))


def group_means(head_scores: torch.Tensor, num_kv_heads: int) -> torch.Tensor:
    """``[L, H]`` per-query-head scores → ``[L, G]`` means over each group's H/G heads."""
    layers, heads = head_scores.shape
    return head_scores.reshape(layers, num_kv_heads, heads // num_kv_heads).mean(-1)


def run_ranker(
    ranker: Ranker,
    model: Any,
    sequences: Sequence[torch.Tensor],
    block_size: int = DEFAULT_BLOCK_SIZE,
    dtype: torch.dtype = torch.float32,
) -> torch.Tensor:
    """Feed every sequence through ``model`` into ``ranker``; return its ``[L, H]`` head scores."""
    device = next(model.parameters()).device

    def consume(
        layer: int, module: Any, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, grad_out: torch.Tensor | None = None
    ) -> None:
        start = ranker.first_row(q.shape[1])
        with torch.no_grad():
            for block in query_blocks(
                q, k, module.scaling, block_size, start=start, value=v, grad_out=grad_out, dtype=dtype
            ):
                ranker.update(layer, block)

    if ranker.needs_grad:
        with capture_attention(model, on_backward=consume):
            for ids in sequences:
                _loss_backward(model, ids.to(device))
    else:
        with capture_attention(model, on_forward=consume), torch.no_grad():
            for ids in sequences:
                model.base_model(input_ids=ids[None].to(device), use_cache=False)
    return ranker.head_scores()


def _loss_backward(model: Any, ids: torch.Tensor) -> None:
    """Backpropagate the mean next-token cross-entropy of ``ids`` to the input embeddings.

    The capture's backward hooks fire on the way; no parameter gradient is formed.
    """
    if getattr(model.config, "final_logit_softcapping", None):
        raise ModelError(
            f"{type(model).__name__}: fisher takes logits = output embeddings(hidden); "
            "softcapped logits are not supported"
        )
    embeds = model.get_input_embeddings()(ids[None]).detach().requires_grad_(True)
    with torch.enable_grad():
        hidden = model.base_model(inputs_embeds=embeds, use_cache=False).last_hidden_state  # [1, T, d]
        head = model.get_output_embeddings()
        predictions = ids.shape[0] - 1
        grad_hidden = torch.zeros_like(hidden)
        for c0 in range(0, predictions, LOSS_CHUNK):
            c1 = min(predictions, c0 + LOSS_CHUNK)
            rows = hidden[0, c0:c1].detach().requires_grad_(True)
            logits = head(rows)
            logits = logits.to(torch.promote_types(logits.dtype, torch.float32))  # half precision → float32
            loss = F.cross_entropy(logits, ids[c0 + 1 : c1 + 1], reduction="sum") / predictions
            (grad_hidden[0, c0:c1],) = torch.autograd.grad(loss, rows)
        torch.autograd.grad(hidden, embeds, grad_outputs=grad_hidden)


@dataclass(frozen=True)
class RankingInputs:
    """What a ranking is measured on: the SWA window its scores refer to and the calibration
    examples it reads (Razor: its probes).

    Attributes:
        window: the SWA window W.
        examples: number of calibration examples (Razor: probes).
        length: tokens per calibration example (Razor: probe length 4·⌊T/4⌋).
        seed: seed of the calibration examples (Razor: of the probes).
        task: the calibration set whose examples the method reads (not Razor).
        include_paths: where else its YAML may be (``tasks/niah/calibration_sets.py``).
    """

    window: int
    examples: int
    length: int
    seed: int = 0
    task: str = PAPER_CALIB_TASK
    include_paths: tuple[
        str, ...
    ] = ()  # folders of task YAMLs beside the bundled ones (a calibration set of one's own)

    def __post_init__(self) -> None:
        object.__setattr__(self, "window", check_window(self.window, "window"))
        for name, value in (("calib_examples", self.examples), ("calib_len", self.length)):
            _check_positive(name, value)


@dataclass(frozen=True)
class RankingCompute:
    """How a ranking is computed; none of it changes the scores beyond rounding.

    Attributes:
        block_size: query rows per streamed block, Bq.
        device: where to run; the model is moved there (default: where it is).
        dtype: precision of the attention blocks (accumulators are float64).
    """

    block_size: int = DEFAULT_BLOCK_SIZE
    device: str | torch.device | None = None
    dtype: torch.dtype = torch.float32

    def __post_init__(self) -> None:
        _check_positive("block_size", self.block_size)


def _check_positive(name: str, value: object) -> None:
    if not is_int(value) or value < 1:
        raise SettingsError(f"{name}: expected a positive integer, got {value!r}")


def compute_ranking(
    method: str,
    model: Any,
    tokenizer: Any,
    inputs: RankingInputs,
    *,
    compute: RankingCompute = RankingCompute(),
    options: Mapping[str, Any] | None = None,
    model_name: str | None = None,
) -> HeadRanking:
    """Rank the KV groups of ``model`` with a training-free method of paper B.3.

    Args:
        method: a ranker's name in :data:`~bosch_eval.search.rankers.RANKERS`.
        model: a transformers causal LM whose attention dispatches through
            ``AttentionInterface``; put in eval mode for the run (its mode is restored).
        tokenizer: the model's tokenizer (sizes the calibration examples).
        inputs: the window and the calibration examples the scores are measured on.
        compute: block size, device and precision of the run.
        options: method settings (proxy: block, gamma, proxy_heads; qada: buffer).
        model_name: recorded in the ranking (default: the config's ``_name_or_path``).

    Raises:
        SettingsError: a bad method, option or size (MaskError: a bad window; ModelError: a model
            the capture cannot run).
    """
    window = inputs.window
    calib_examples, calib_len, calib_seed, calib_task = inputs.examples, inputs.length, inputs.seed, inputs.task
    block_size, device, dtype = compute.block_size, compute.device, compute.dtype
    shape = ModelShape.from_config(model.config)
    ranker = make_ranker(method, shape, window, options)
    if device is not None:
        model.to(device)
    was_training = model.training
    model.eval()
    started = time.perf_counter()
    try:
        vocab_size = model.get_input_embeddings().num_embeddings
        sequences = ranker.sequences(
            tokenizer, vocab_size, calib_examples, calib_len, calib_seed, calib_task, inputs.include_paths
        )
        head_scores = run_ranker(ranker, model, sequences, block_size, dtype)
    finally:
        model.train(was_training)
    wall_time = time.perf_counter() - started
    groups = group_means(head_scores, shape.num_kv_heads)
    provenance = {
        "method": method,
        "window": window,
        "calib_examples": calib_examples,
        "calib_len": calib_len,
        "calib_seed": calib_seed,
        "calib_task": calib_task,
        "inputs": ranker.inputs,
        "sequence_lengths": sorted({int(ids.shape[0]) for ids in sequences}),
        "settings": ranker.settings(),
        "block_size": block_size,
        "dtype": str(dtype).removeprefix("torch."),
        "device": str(next(model.parameters()).device),
        "group_score": "mean over the group's query heads (paper B.3)",
        "head_scores": head_scores.tolist(),
        "wall_time_s": round(wall_time, 3),
        "versions": versions("bosch-eval", "torch", "transformers", "python"),
    }
    return HeadRanking(
        tuple(tuple(row) for row in groups.tolist()),
        ranker.more_local,
        method,
        shape.num_heads,
        window=window,
        model=model_name or getattr(model.config, "_name_or_path", None) or None,
        provenance=provenance,
    )


def load_for_ranking(path: str, dtype: str, device: str | None, model_args: dict[str, Any]) -> tuple[Any, Any]:
    """The model and tokenizer the rankers read: with plain SDPA attention, in ``dtype`` (a name
    of torch's, e.g. float32); loaded as lm-eval loads it when ``model_args`` are given."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if model_args:
        return _load_like_lm_eval(path, dtype, device, model_args)
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=getattr(torch, dtype), attn_implementation="sdpa")
    return model, tokenizer


def _load_like_lm_eval(path: str, dtype: str, device: str | None, model_args: dict[str, Any]) -> tuple[Any, Any]:
    """The model and tokenizer as ``lm_eval --model hf --model_args`` loads them (revision, remote
    code, ``parallelize``, PEFT, quantization), with the plain SDPA attention the rankers read."""
    from lm_eval.models.huggingface import HFLM

    lm = HFLM(pretrained=path, device=device, dtype=dtype, attn_implementation="sdpa", **model_args)
    return lm.model, lm.tokenizer
