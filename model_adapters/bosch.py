"""The ``bosch`` lm-eval model: any Hugging Face causal LM with a hybrid full/SWA head mask.

    lm_eval --model bosch --model_args pretrained=Qwen/Qwen3-1.7B-Base,mask=mask.json --tasks ...

model_args (besides everything HFLM accepts):

* ``mask=FILE``: a ``bosch-mask/1`` file;
* ``ranking=FILE,ratio=R``: a ``bosch-ranking/1`` file, its ⌈R·L·G⌉ most local groups to SWA;
* ``layers=intr|bme|rand,ratio=R[,seed=S]``: a layer heuristic (``seed`` for ``rand``);
* ``window=W``: overrides the window stored in the mask or ranking;
* ``sink=S``: attention-sink positions every SWA query also sees besides its window
  (overrides the mask's own ``sinks``; default 0, :mod:`bosch_eval.attention.local_window`);
* ``attn_backend=auto|sdpa|blocked|flash_attention_2``;
* ``kv_cache=hybrid|captured|dynamic``: generation keeps only ``W − 1`` positions for SWA groups
  (``hybrid``, default), the same in buffers a CUDA graph can capture (``captured``:
  :mod:`bosch_eval.caches.captured`; on a GPU transformers' ``generate`` then compiles its
  decode step, ``mode="reduce-overhead"``; the same tokens as ``hybrid``), or every position
  (``dynamic``, transformers' default cache);
* ``memoize_tokens=True``: remember every string's token ids (the search scores the same
  requests thousands of times; off by default, since a plain evaluation sees each once).
* ``progress_bars=False``: no per-call request bars (the search turns them off: its own
  bar counts objective calls).
* ``prefix_cache_mb=N``: a prefix-activation cache of at most N MB for the search
  (:mod:`bosch_eval.caches.prefix_cache`; used only once told which layers vary, 0 = none).
* ``rope_scaling=yarn,rope_factor=F[,rope_original_max_positions=N]``: YaRN context
  extension set on the config before the model is built (``bosch_eval.models.rope_scaling``).
* ``mask=full``: no head mask (every group full attention), e.g. for a KV-quantized original;
* ``kv_quant=logquant|kivi|none,kv_bits=2|4,kv_window=W_lq[,kv_group_size=G]``: quantize the
  full-attention groups' KV cache (:mod:`bosch_eval.caches.kv_quant`). Loglikelihood requests are
  then scored as served: prefill(context) at full precision → compress → the continuation
  through the compressed cache (``compressed_scoring``); generation uses the same cache.
  Perplexity (``loglikelihood_rolling``) is refused with ``kv_quant``: each window would be
  scored at full precision, so the number would not measure the quantization.
* ``allow_truncation=True``: score inputs longer than the model's ``max_length`` after
  lm-eval's left truncation. Without it such a request is an error naming the task, the
  length and the limit (a score of truncated input is not the task's score). With it, the
  results' ``config`` carries ``bosch_truncated`` = {task: {"documents": n,
  "longest_input_tokens": t, "max_length": L}} for every task that had truncated documents
  (keyed by the leaf task name; an adapter reused across evaluations, as ``compare`` does,
  reports earlier tasks too, so read your task's key), and ``bosch_allow_truncation``.

``device``: none given (or ``auto``) picks CUDA when torch sees it, else the CPU, and says
which (:func:`bosch_eval.runtime.device.pick_device`); a device that does not exist is an error.

Under ``accelerate launch --num_processes N`` (GPUs or ``--cpu``, one node or many) each
process scores its 1/N of the requests; see :func:`bosch_eval.runtime.launch.shard_over_processes`.

Every other key is refused before anything loads, naming the nearest valid key
(:mod:`bosch_eval.model_adapters.loader_args`); values are converted once into
:class:`~bosch_eval.model_adapters.settings.AdapterSettings`.

Programmatic use (search mode): ``BoschLM(pretrained=<loaded model>, tokenizer=..., mask=...)``
then :meth:`BoschLM.set_mask` to swap masks without reloading.

The adapter holds its collaborators: the scorer (:mod:`.scoring`: logits only at continuation
positions), the truncation policy (:mod:`.truncation`) and, with ``kv_quant``, the compressed
scoring (:mod:`.compressed_scoring`); what it overrides of HFLM is only what routes to them.
"""

from __future__ import annotations

import logging
from array import array
from typing import Any

import torch
from lm_eval.api.instance import Instance
from lm_eval.api.registry import register_model
from lm_eval.models.huggingface import HFLM

from bosch_eval.attention.hybrid_attention import HybridAttention, hybridize
from bosch_eval.attention.local_window import SINK_RULE
from bosch_eval.caches.captured import bucketed_capacity
from bosch_eval.caches.hybrid_cache import HybridCache, captured_refusal
from bosch_eval.caches.kv_quant.config import KVQuantConfig, kv_quant_setting
from bosch_eval.caches.prefix_cache import PrefixActivations
from bosch_eval.masks.head_mask import HeadMask
from bosch_eval.masks.mask_sources import mask_for_model
from bosch_eval.model_adapters.compressed_scoring import CompressedScoring
from bosch_eval.model_adapters.loader_args import adapter_settings
from bosch_eval.model_adapters.scoring import ContinuationScorer, ForwardLogits, PrefixCachedLogits
from bosch_eval.model_adapters.truncation import TruncationPolicy, over_long_contexts, over_long_requests
from bosch_eval.models.checkpoint import set_saved_kv_quant
from bosch_eval.models.resolved_model import ResolvedModel
from bosch_eval.models.rope_scaling import yarn_loader_config
from bosch_eval.models.transformers_compat import cache_argument
from bosch_eval.runtime.device import pick_device, warn_slow_cpu_bfloat16
from bosch_eval.runtime.errors import ModelError, SettingsError
from bosch_eval.runtime.launch import ProcessShard, join_cpu_processes, shard_over_processes
from bosch_eval.runtime.lm_eval_logs import quiet_per_length_warnings
from bosch_eval.runtime.threads import apply_thread_policy

# What lm-eval 0.4.13's CLI passes when --device is not given (EvaluatorConfig's default);
# HFLM falls back to the CPU for it when no GPU exists, and so do we.
LM_EVAL_CLI_DEFAULT_DEVICE = "cuda:0"

log = logging.getLogger("bosch_eval")


def _load_device(requested: str | None) -> str:
    """The device to load on: :func:`pick_device`, except that lm-eval's CLI default
    (``cuda:0``, passed when ``--device`` is not given) falls back to the CPU where no GPU
    exists, as HFLM does."""
    if requested == LM_EVAL_CLI_DEFAULT_DEVICE and not torch.cuda.is_available():
        return pick_device(None)
    return pick_device(requested)


@register_model("bosch")
class BoschLM(HFLM):
    """HFLM with a BOSCH head mask applied through the hybrid attention implementation."""

    def __init__(self, pretrained: str | ResolvedModel | torch.nn.Module, **model_args: Any) -> None:
        # Every key known and every value converted before anything is read from disk.
        settings, loader_args = adapter_settings(model_args)
        self.settings = settings
        quiet_per_length_warnings()  # RULER-style tasks' per-length metrics, expected (see the module)
        apply_thread_policy()  # lm_eval --model bosch: torch is loaded, its thread count set here (bosch_eval.runtime.threads)
        if isinstance(pretrained, (str, ResolvedModel)):  # a name, or one the caller resolved already
            trust = loader_args.get("trust_remote_code") is True
            # "toy": the bundled model; a missing model fails here
            self.resolved = (
                pretrained
                if isinstance(pretrained, ResolvedModel)
                else ResolvedModel.named(pretrained, trust_remote_code=trust)
            )
            pretrained = self.resolved.path
            loader_args["device"] = _load_device(loader_args.get("device"))
        else:  # a preloaded model: its own config
            self.resolved = ResolvedModel.loaded(pretrained)
        # Mask, ranking, window and kv_quant errors from the config alone, before minutes of weight loading.
        model = self.resolved
        head_mask, source = mask_for_model(
            model.shape, settings.mask_request(), model.defaults.window, model.saved_mask, model.path
        )  # a hybrid checkpoint restores its own
        self.kv_quant: KVQuantConfig | None = kv_quant_setting(
            (settings.kv_quant, settings.kv_bits, settings.kv_window, settings.kv_group_size),
            model.saved_kv_quant, model.head_dim, settings.kv_cache,
        )  # fmt: skip
        if settings.rope_scaling is not None:
            loader_args["config"] = yarn_loader_config(
                pretrained, settings.rope_factor, settings.rope_original_max_positions, loader_args
            )
        join_cpu_processes(str(loader_args.get("device", "")))  # before HFLM's Accelerator()
        super().__init__(pretrained=pretrained, **loader_args)
        # Read by lm-eval through rank and world_size (below): HFLM's share, or accelerate's processes.
        self.shard = shard_over_processes(self, ProcessShard(self._rank, self._world_size))
        warn_slow_cpu_bfloat16(self.model.dtype, str(self.device))
        if self.backend != "causal":
            raise ModelError(
                f"bosch: hybrid attention needs a decoder-only (causal) model, got backend={self.backend!r}"
            )
        self.hybrid: HybridAttention = hybridize(self.model, head_mask, backend=settings.attn_backend, source=source)
        if settings.kv_cache == "captured" and (why := captured_refusal(self.model, self.kv_quant)) is not None:
            raise SettingsError(f"kv_cache=captured: {why}; use kv_cache=hybrid")
        set_saved_kv_quant(self.model.config, self.kv_quant)  # save_pretrained keeps the settings
        # Switches the search flips on a loaded adapter (tokens remembered, its own progress bar).
        self.memoize_tokens = settings.memoize_tokens
        self.progress_bars = settings.progress_bars
        self._token_memo: dict[tuple[str, bool | None, int | None], array] = {}
        self.truncation_policy = TruncationPolicy(
            settings.allow_truncation, self.model.name_or_path, self._max_length is not None
        )
        self.compressed = CompressedScoring(self.model, self.kv_quant) if self.kv_quant is not None else None
        self.prefix_cache = (
            PrefixActivations(self.model, settings.prefix_cache_mb << 20) if settings.prefix_cache_mb else None
        )
        if self.compressed is not None:
            self.scorer = ContinuationScorer(self.compressed)
        elif self.prefix_cache is not None:
            self.scorer = ContinuationScorer(
                PrefixCachedLogits(self.model, self.prefix_cache, lambda: self.hybrid.spec)
            )
        else:
            self.scorer = ContinuationScorer(ForwardLogits(self.model))

    @property
    def rank(self) -> int:
        return self.shard.rank

    @property
    def world_size(self) -> int:
        return self.shard.world_size

    @property
    def kv_cache(self) -> str:
        return self.settings.kv_cache

    @property
    def head_mask(self) -> HeadMask:
        return self.hybrid.mask

    def set_mask(self, mask: HeadMask) -> None:
        """Swap the head mask in place (no reload, no weight copy). A ``window=`` or
        ``sink=`` given at construction still overrides the mask's own."""
        window = self.settings.window if self.settings.window is not None else mask.window
        sinks = self.settings.sink if self.settings.sink is not None else mask.sinks
        self.hybrid.set_mask(mask, window, sinks)

    def vary_layers_from(self, layer: int | None) -> None:
        """Let the prefix cache (if any) run the masks scored next from ``layer`` (None: every
        layer), reusing the hidden states entering it wherever the rows below are the same."""
        if self.prefix_cache is not None:
            self.prefix_cache.vary_from(layer)

    def clear_token_memo(self) -> None:
        """Forget the remembered token ids (e.g. before scoring another task set)."""
        self._token_memo.clear()

    # -- HFLM overrides: each routes one thing to the settings or a collaborator ---------------

    # memoize_tokens: HFLM tokenizes every request on every call; the search repeats them per mask.
    def tok_encode(
        self, string: str, add_special_tokens: bool | None = None, left_truncate_len: int | None = None, **kwargs: Any
    ) -> list[int]:
        """HFLM's tokenization, remembered per string when ``memoize_tokens`` is on (ids kept as
        a compact ``array``: 4–8 bytes a token, not a Python int object each)."""
        if not self.memoize_tokens or kwargs:
            return super().tok_encode(string, add_special_tokens, left_truncate_len, **kwargs)
        key = (string, add_special_tokens, left_truncate_len)
        ids = self._token_memo.get(key)
        if ids is None:
            ids = self._token_memo[key] = array("q", super().tok_encode(string, add_special_tokens, left_truncate_len))
        return ids.tolist()

    # progress_bars, and inputs HFLM would cut from the left go through the truncation policy
    # here, where the requests still name their tasks.
    def loglikelihood(self, requests: list[Instance], disable_tqdm: bool = False) -> list[tuple[float, bool]]:
        self.truncation_policy.check(over_long_requests(self, requests), "context + continuation", self.max_length)
        return super().loglikelihood(requests, disable_tqdm=disable_tqdm or not self.progress_bars)

    # progress_bars, and perplexity refused under kv_quant (it would not measure the quantization).
    def loglikelihood_rolling(self, requests: list[Instance], disable_tqdm: bool = False) -> list[float]:
        if self.compressed is not None:
            self.compressed.refuse_rolling(requests)
        return super().loglikelihood_rolling(requests, disable_tqdm=disable_tqdm or not self.progress_bars)

    # progress_bars, and contexts HFLM would cut from the left go through the truncation policy.
    def generate_until(self, requests: list[Instance], disable_tqdm: bool = False) -> list[str]:
        self.truncation_policy.check(over_long_contexts(self, requests), "context", self.max_length)
        return super().generate_until(requests, disable_tqdm=disable_tqdm or not self.progress_bars)

    # kv_cache=hybrid: generation on the deploy-mode cache (SWA groups keep only their window).
    def _model_generate(
        self, context: torch.Tensor, max_length: int, stop: list[str], **generation_kwargs: Any
    ) -> torch.Tensor:
        if self.kv_cache == "captured":
            # Recaptured per call (each call's cache has its own buffers), bucketed capacity: a
            # compiled graph per bucket and batch size, so the recompile limit is raised to hold them.
            cache = HybridCache.for_model(self.model, None, max_cache_len=bucketed_capacity(max_length), captured=True)
            generation_kwargs.setdefault(cache_argument(self.model), cache)
            with torch._dynamo.config.patch(recompile_limit=64):
                return super()._model_generate(context, max_length, stop, **generation_kwargs)
        if self.kv_cache == "hybrid":
            cache = self.compressed.cache() if self.compressed is not None else HybridCache.for_model(self.model, None)
            generation_kwargs.setdefault(cache_argument(self.model), cache)
        return super()._model_generate(context, max_length, stop, **generation_kwargs)

    # The hybrid model's settings in the results' config, beside HFLM's.
    def get_model_info(self) -> dict[str, Any]:
        info = super().get_model_info()
        mask = self.hybrid.mask
        info.update(
            bosch_swa_ratio=mask.swa_ratio,
            bosch_window=self.hybrid.window,
            bosch_sinks=self.hybrid.sinks,
            bosch_sink_rule=SINK_RULE,
            bosch_method=mask.method,
            bosch_attn_backend=self.hybrid.backend,
            bosch_attn_backend_reason=self.hybrid.spec.backend_reason,  # why auto chose it, or "asked for"
            bosch_kv_cache=self.kv_cache,
            bosch_kv_quant=self.kv_quant.to_json() if self.kv_quant is not None else None,
            bosch_mask=[list(row) for row in mask.bits],
            bosch_allow_truncation=self.truncation_policy.allow,
            bosch_truncated=self.truncation_policy.report(self.max_length),
        )
        return info

    # Logits only at continuation positions: HFLM's loop builds [B, T, V] (scoring.py says why).
    def _loglikelihood_tokens(
        self,
        requests: list[tuple[tuple[str, str], list[int], list[int]]],
        disable_tqdm: bool = False,
        override_bs: int | None = None,
    ) -> list[tuple[float, bool]]:
        return self.scorer.loglikelihood_tokens(self, requests, disable_tqdm, override_bs)
