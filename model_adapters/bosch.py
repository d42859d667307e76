"""The ``bosch`` lm-eval model: any Hugging Face causal LM with a hybrid full/SWA head mask.

    lm_eval --model bosch --model_args pretrained=Qwen/Qwen3-1.7B-Base,mask=mask.json --tasks ...

model_args (besides everything HFLM accepts):

* ``mask=FILE``: a ``bosch-mask/1`` file;
* ``ranking=FILE,ratio=R``: a ``bosch-ranking/1`` file, its ⌈R·L·G⌉ most local groups to SWA;
* ``layers=intr|bme|rand,ratio=R[,seed=S]``: a layer heuristic (``seed`` for ``rand``);
* ``window=W``: overrides the window stored in the mask or ranking;
* ``sink=S``: attention-sink positions every SWA query also sees besides its window
  (overrides the mask's own ``sinks``; default 0, :mod:`bosch_eval.local_window`);
* ``attn_backend=auto|sdpa|blocked|flash_attention_2``;
* ``kv_cache=hybrid|dynamic``: generation keeps only ``W − 1`` positions for SWA groups
  (``hybrid``, default) or every position (``dynamic``, transformers' default cache);
* ``memoize_tokens=True``: remember every string's token ids (the search scores the same
  requests thousands of times; off by default, since a plain evaluation sees each once).
* ``progress_bars=False``: no per-call request bars (the search turns them off: its own
  bar counts objective calls).
* ``prefix_cache_mb=N``: a prefix-activation cache of at most N MB for the search
  (:mod:`bosch_eval.prefix_cache`; used only once told which layers vary, 0 = none).
* ``rope_scaling=yarn,rope_factor=F[,rope_original_max_positions=N]``: YaRN context
  extension set on the config before the model is built (``bosch_eval.rope_scaling``).
* ``mask=full``: no head mask (every group full attention), e.g. for a KV-quantized original;
* ``kv_quant=logquant|kivi|none,kv_bits=2|4,kv_window=W_lq[,kv_group_size=G]``: quantize the
  full-attention groups' KV cache (:mod:`bosch_eval.kv_quant`). Loglikelihood requests are
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
which (:func:`bosch_eval.device.pick_device`); a device that does not exist is an error.

Under ``accelerate launch --num_processes N`` (GPUs or ``--cpu``, one node or many) each
process scores its 1/N of the requests; see :func:`bosch_eval.launch.shard_over_processes`.

Programmatic use (search mode): ``BoschLM(pretrained=<loaded model>, tokenizer=..., mask=...)``
then :meth:`BoschLM.set_mask` to swap masks without reloading.
"""

from __future__ import annotations

import logging
from array import array
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from lm_eval.api.instance import Instance
from lm_eval.api.registry import register_model
from lm_eval.models.huggingface import HFLM
from lm_eval.models.utils import Collator, normalize_gen_kwargs
from lm_eval.models.utils_hf import pad_and_concat
from tqdm import tqdm

from bosch_eval.checkpoint import saved_kv_quant, saved_mask, set_saved_kv_quant
from bosch_eval.hybrid_attention import HybridAttention, hybridize
from bosch_eval.hybrid_cache import HybridCache
from bosch_eval.kv_quant.config import KVQuantConfig, parse_kv_quant
from bosch_eval.launch import join_cpu_processes, shard_over_processes
from bosch_eval.lm_eval_logs import quiet_per_length_warnings
from bosch_eval.threads import apply_thread_policy
from bosch_eval.mask_sources import resolve_mask
from bosch_eval.errors import SettingsError
from bosch_eval.masks import HeadMask, HeadRanking, MaskError, ModelShape
from bosch_eval.device import pick_device
from bosch_eval.model_check import ModelError, check_causal_decoder, model_config, resolve_model
from bosch_eval.model_defaults import model_defaults
from bosch_eval.model_adapters.compressed_scoring import continuation_logits_through_cache
from bosch_eval.model_adapters.continuation_logits import logits_at, scored_positions
from bosch_eval.prefix_cache import PrefixActivations
from bosch_eval.transformers_compat import cache_argument


KV_CACHES = ("hybrid", "dynamic")
# What lm-eval 0.4.13's CLI passes when --device is not given (EvaluatorConfig's default);
# HFLM falls back to the CPU for it when no GPU exists, and so do we.
LM_EVAL_CLI_DEFAULT_DEVICE = "cuda:0"

log = logging.getLogger("bosch_eval")


def _head_mask(config: Any, model_name: str | None, *, window: int | None, sink: int | None = None, **sources: Any) -> tuple[HeadMask, str]:
    """The mask asked for, checked against ``config`` (a hybrid checkpoint restores its own)."""
    if isinstance(sources["mask"], str) and sources["mask"] == "full":  # no head mask: the original attention everywhere
        sources["mask"] = HeadMask.uniform(ModelShape.from_config(config), full=True, window=window or 1, method="full")
    checkpoint_mask = saved_mask(config, f"{model_name}/config.json")
    if checkpoint_mask is not None and (sources["mask"], sources["ranking"], sources["layers"]) == (None, None, None):
        sources["mask"] = checkpoint_mask
    head_mask, source = resolve_mask(
        ModelShape.from_config(config),
        window=window,
        sinks=sink,
        default_window=model_defaults(model_name).window if model_name else None,
        model_name=model_name,
        **sources,
    )
    if checkpoint_mask is not None and (head_mask.bits, head_mask.window) != (checkpoint_mask.bits, checkpoint_mask.window):
        raise MaskError(
            f"{source}: differs from the mask saved in {model_name}/config.json "
            f"(SWA ratio {head_mask.swa_ratio:.4g}, window {head_mask.window} vs saved "
            f"{checkpoint_mask.swa_ratio:.4g}, window {checkpoint_mask.window}); drop the explicit mask to use the saved one"
        )
    return head_mask, source


def _kv_quant_settings(
    config: Any, model_name: str | None, kv_cache: str, *, kv_quant: Any, kv_bits: Any, kv_window: Any, kv_group_size: Any
) -> KVQuantConfig | None:
    """The KV quantization asked for, checked against ``config``; a hybrid checkpoint's saved
    settings when none is given."""
    if kv_quant is None and (kv_bits, kv_window, kv_group_size) == (None, None, None):
        settings = saved_kv_quant(config, f"{model_name}/config.json")
    else:
        settings = parse_kv_quant(kv_quant, kv_bits, kv_window, kv_group_size, head_dim=ModelShape.head_dim_of(config))
    if settings is not None and kv_cache != "hybrid":
        raise SettingsError(f"kv_cache: kv_quant={settings.method} stores its KV in the hybrid cache; got kv_cache={kv_cache!r}")
    return settings


@register_model("bosch")
class BoschLM(HFLM):
    """HFLM with a BOSCH head mask applied through the hybrid attention implementation."""

    def __init__(
        self,
        pretrained: str | torch.nn.Module,
        mask: str | Path | HeadMask | None = None,
        ranking: str | Path | HeadRanking | None = None,
        layers: str | None = None,
        ratio: float | None = None,
        seed: int | None = None,
        window: int | None = None,
        sink: int | None = None,
        attn_backend: str = "auto",
        kv_cache: str = "hybrid",
        memoize_tokens: bool = False,
        progress_bars: bool = True,
        rope_scaling: str | None = None,
        rope_factor: float | None = None,
        rope_original_max_positions: int | None = None,
        kv_quant: str | None = None,
        kv_bits: int | None = None,
        kv_window: int | None = None,
        kv_group_size: int | None = None,
        prefix_cache_mb: int = 0,
        allow_truncation: bool = False,
        **kwargs: Any,
    ) -> None:
        if kv_cache not in KV_CACHES:
            raise SettingsError(f"kv_cache: expected one of {list(KV_CACHES)}, got {kv_cache!r}")
        quiet_per_length_warnings()  # RULER-style tasks' per-length metrics, expected (see the module)
        apply_thread_policy()  # lm_eval --model bosch: torch is loaded, its thread count set here (bosch_eval.threads)
        if kwargs.get("tp_plan") is not None:
            # Under tensor parallelism each rank's attention holds a shard of the heads, but the
            # hybrid attention picks KV groups by their global index: slices past the shard would
            # be silently empty. Refused rather than run wrong.
            raise SettingsError(
                f"tp_plan={kwargs['tp_plan']!r}: tensor parallelism is not supported by --model bosch (the hybrid "
                "attention selects KV groups by global index; a tensor-parallel rank holds only its shard of the "
                "heads); use parallelize=True to spread the layers over GPUs, or several processes for data parallelism"
            )
        for name, flag in (("memoize_tokens", memoize_tokens), ("progress_bars", progress_bars), ("allow_truncation", allow_truncation)):
            if not isinstance(flag, bool):
                raise SettingsError(f"{name}: expected True or False, got {flag!r}")
        if isinstance(prefix_cache_mb, bool) or not isinstance(prefix_cache_mb, int) or prefix_cache_mb < 0:
            raise SettingsError(f"prefix_cache_mb: expected a whole number of megabytes >= 0 (0 = no cache), got {prefix_cache_mb!r}")
        if prefix_cache_mb and kv_quant not in (None, "none"):
            raise SettingsError("prefix_cache_mb: not with kv_quant (compressed scoring runs its own prefill per request)")
        self.kv_cache = kv_cache
        self.memoize_tokens = memoize_tokens
        self.progress_bars = progress_bars
        self.allow_truncation = allow_truncation
        # task -> (doc ids scored after left truncation, longest input in tokens); see get_model_info.
        self.truncated: dict[str, tuple[set[int], int]] = {}
        self._token_memo: dict[tuple[str, bool | None, int | None], array] = {}
        sources = dict(mask=mask, ranking=ranking, layers=layers, ratio=ratio, seed=seed, window=window, sink=sink)
        quant_args = dict(kv_quant=kv_quant, kv_bits=kv_bits, kv_window=kv_window, kv_group_size=kv_group_size)
        if isinstance(pretrained, str):
            pretrained = resolve_model(pretrained)  # "toy": the bundled model; a missing model fails here
            # Mask, ranking, window and kv_quant errors from the config alone, before minutes of weight loading.
            config = model_config(pretrained, trust_remote_code=kwargs.get("trust_remote_code") is True)
            check_causal_decoder(config, pretrained)
            kwargs["device"] = self._pick_device(kwargs.get("device"))
            head_mask, source = _head_mask(config, pretrained, **sources)
            self.kv_quant: KVQuantConfig | None = _kv_quant_settings(config, pretrained, kv_cache, **quant_args)
        self._apply_rope_scaling(pretrained, rope_scaling, rope_factor, rope_original_max_positions, kwargs)
        join_cpu_processes(str(kwargs.get("device", "")))  # before HFLM's Accelerator()
        super().__init__(pretrained=pretrained, **kwargs)
        shard_over_processes(self)
        if self.backend != "causal":
            raise ModelError(f"bosch: hybrid attention needs a decoder-only (causal) model, got backend={self.backend!r}")
        self._window_override = window
        self._sink_override = sink
        if not isinstance(pretrained, str):  # a preloaded model: its own config
            config, name = self.model.config, getattr(self.model.config, "_name_or_path", None)
            head_mask, source = _head_mask(config, name, **sources)
            self.kv_quant = _kv_quant_settings(config, name, kv_cache, **quant_args)
        self.hybrid: HybridAttention = hybridize(self.model, head_mask, backend=attn_backend, source=source)
        set_saved_kv_quant(self.model.config, self.kv_quant)  # save_pretrained keeps the settings
        self.prefix_cache = PrefixActivations(self.model, prefix_cache_mb << 20) if prefix_cache_mb else None

    @staticmethod
    def _pick_device(requested: str | None) -> str:
        """The device to load on: :func:`pick_device`, except that lm-eval's CLI default
        (``cuda:0``, passed when ``--device`` is not given) falls back to the CPU where no GPU
        exists, as HFLM does."""
        if requested == LM_EVAL_CLI_DEFAULT_DEVICE and not torch.cuda.is_available():
            return pick_device(None)
        return pick_device(requested)

    @staticmethod
    def _apply_rope_scaling(
        pretrained: str | torch.nn.Module, scaling: str | None, factor: Any, original: Any, kwargs: dict[str, Any]
    ) -> None:
        """Put a YaRN-scaled config into HFLM's ``from_pretrained`` kwargs: the rotary
        embedding is built from the config when the model is constructed."""
        from bosch_eval.rope_scaling import check_rope_args, scaled_config

        names = ("rope_scaling", "rope_factor", "rope_original_max_positions")
        scaling, factor, original = check_rope_args(scaling, factor, original, names)
        if scaling is None:
            return
        if not isinstance(pretrained, str):
            raise SettingsError("rope_scaling: needs pretrained= as a name or path (a loaded model's rotary embedding is already built)")
        if "config" in kwargs:
            raise SettingsError("rope_scaling: cannot be combined with an explicit config=")
        kwargs["config"] = scaled_config(
            pretrained, factor, original, revision=kwargs.get("revision", "main"), trust_remote_code=bool(kwargs.get("trust_remote_code", False))
        )

    def tok_encode(
        self, string: str, add_special_tokens: bool | None = None, left_truncate_len: int | None = None, **kwargs: Any
    ) -> list[int]:
        """HFLM's tokenization, remembered per string when ``memoize_tokens`` is on.

        HFLM tokenizes every request on every ``loglikelihood`` call; the search sends the
        same calibration requests for each of its thousands of masks. Ids are kept as a
        compact ``array`` (4–8 bytes a token, not a Python int object each).
        """
        if not self.memoize_tokens or kwargs:
            return super().tok_encode(string, add_special_tokens, left_truncate_len, **kwargs)
        key = (string, add_special_tokens, left_truncate_len)
        ids = self._token_memo.get(key)
        if ids is None:
            ids = self._token_memo[key] = array("q", super().tok_encode(string, add_special_tokens, left_truncate_len))
        return ids.tolist()

    def clear_token_memo(self) -> None:
        """Forget the remembered token ids (e.g. before scoring another task set)."""
        self._token_memo.clear()

    @property
    def head_mask(self) -> HeadMask:
        return self.hybrid.mask

    def vary_layers_from(self, layer: int | None) -> None:
        """The masks scored next differ only in layers >= ``layer`` (None: no promise), so
        the prefix cache (if any) may reuse the hidden states entering that layer."""
        if self.prefix_cache is not None:
            self.prefix_cache.vary_from(layer)

    def set_mask(self, mask: HeadMask) -> None:
        """Swap the head mask in place (no reload, no weight copy). A ``window=`` or
        ``sink=`` given at construction still overrides the mask's own."""
        window = self._window_override if self._window_override is not None else mask.window
        sinks = self._sink_override if self._sink_override is not None else mask.sinks
        self.hybrid.set_mask(mask, window, sinks)

    # lm-eval's request types, with the progress bars off when ``progress_bars`` is, and no
    # input silently cut to fit (see _check_fits).
    def loglikelihood(self, requests: list[Instance], disable_tqdm: bool = False) -> list[tuple[float, bool]]:
        # _loglikelihood_tokens sees token ids and the (context, continuation) strings only.
        self._requests_by_args: dict[tuple[str, str], list[Instance]] = {}
        for request in requests:
            self._requests_by_args.setdefault(request.args, []).append(request)
        try:
            return super().loglikelihood(requests, disable_tqdm=disable_tqdm or not self.progress_bars)
        finally:
            del self._requests_by_args

    def loglikelihood_rolling(self, requests: list[Instance], disable_tqdm: bool = False) -> list[float]:
        if self.kv_quant is not None and requests:
            tasks = sorted({str(r.task_name) for r in requests})
            raise ModelError(
                f"task {tasks[0]!r}{f' (and {len(tasks) - 1} more)' if len(tasks) > 1 else ''}: perplexity "
                f"(loglikelihood_rolling) with kv_quant={self.kv_quant.method} would not measure the quantization "
                "(each window is scored as one continuation after a one-token context, so its tokens see each other "
                "at full precision); run this task without kv_quant"
            )
        return super().loglikelihood_rolling(requests, disable_tqdm=disable_tqdm or not self.progress_bars)

    def generate_until(self, requests: list[Instance], disable_tqdm: bool = False) -> list[str]:
        # HFLM left-truncates each context to max_length - max_gen_toks (one log line per batch).
        too_long = []
        for request in requests:
            context, gen_kwargs = request.args
            room = self.max_length - normalize_gen_kwargs(dict(gen_kwargs), self.max_gen_toks)["max_gen_toks"]
            length = len(self.tok_encode(context))
            if length > room:
                too_long.append((request, length, room))
        self._check_fits(too_long, "context")
        return super().generate_until(requests, disable_tqdm=disable_tqdm or not self.progress_bars)

    def _check_fits(self, too_long: list[tuple[Instance | None, int, int]], what: str) -> None:
        """Refuse requests whose input exceeds the model's limit, or record them (``allow_truncation``).

        Args:
            too_long: (request, input tokens, tokens the model can take) of each request that
                lm-eval would left-truncate; the request is None where the task is unknown.
            what: what was measured (``context``, ``context + continuation``), for the message.

        Raises:
            ModelError: naming the task, the longest input and the limit, unless
                ``allow_truncation`` is on.
        """
        if not too_long:
            return
        by_task: dict[str, list[tuple[int | None, int, int]]] = {}
        for request, length, room in too_long:
            task = str(request.task_name) if request is not None else "(unknown task)"
            by_task.setdefault(task, []).append((request.doc_id if request is not None else None, length, room))
        if not self.allow_truncation:
            task, rows = sorted(by_task.items())[0]
            _, length, room = max(rows, key=lambda row: row[1])
            others = f"; {len(by_task) - 1} more task(s) too" if len(by_task) > 1 else ""
            source = "max_length= given" if self._max_length else "the model's max_position_embeddings"
            raise ModelError(
                f"task {task!r}: {len(rows)} request(s) longer than model {self.model.name_or_path!r} can take, the longest "
                f"{what} {length} tokens > {room} (max_length {self.max_length}, from {source}"
                f"{'; less the tokens to generate' if room < self.max_length else ''}){others}. lm-eval would cut "
                "them from the left and score what is left. Use shorter inputs (e.g. smaller max_seq_lengths), "
                "pass max_length=N if the model holds more than its config says (rope scaling), or "
                "allow_truncation=true to score them anyway (the results then carry bosch_truncated)"
            )
        for task, rows in by_task.items():
            docs, longest = self.truncated.get(task, (set(), 0))
            if task not in self.truncated:
                log.warning(
                    "bosch: task %r: inputs longer than max_length %d are scored after left truncation "
                    "(allow_truncation=true); its results carry bosch_truncated", task, self.max_length
                )
            docs.update(doc for doc, _, _ in rows if doc is not None)
            self.truncated[task] = (docs, max(longest, *(length for _, length, _ in rows)))

    def _model_generate(self, context: torch.Tensor, max_length: int, stop: list[str], **generation_kwargs: Any) -> torch.Tensor:
        """HFLM's generation, on a deploy-mode cache unless ``kv_cache=dynamic``."""
        if self.kv_cache == "hybrid":
            generation_kwargs.setdefault(cache_argument(self.model), HybridCache.for_model(self.model, self.kv_quant))
        return super()._model_generate(context, max_length, stop, **generation_kwargs)

    def get_model_info(self) -> dict[str, Any]:
        info = super().get_model_info()
        mask = self.hybrid.mask
        info.update(
            bosch_swa_ratio=mask.swa_ratio,
            bosch_window=self.hybrid.window,
            bosch_sinks=self.hybrid.sinks,
            bosch_method=mask.method,
            bosch_attn_backend=self.hybrid.backend,
            bosch_kv_cache=self.kv_cache,
            bosch_kv_quant=self.kv_quant.to_json() if self.kv_quant is not None else None,
            bosch_mask=[list(row) for row in mask.bits],
            bosch_allow_truncation=self.allow_truncation,
            bosch_truncated={
                task: {"documents": len(docs), "longest_input_tokens": longest, "max_length": self.max_length}
                for task, (docs, longest) in sorted(self.truncated.items())
            },
        )
        return info

    # Why HFLM's whole loop is copied rather than one hook overridden: HFLM log-softmaxes all of
    # `_model_call`'s [B, T, V] output before `_select_cont_toks` slices the continuation out, and
    # `_model_call` gets only the padded ids, not where each continuation lies. At a 150k vocabulary
    # and 32k tokens that is ~19 GB a row in fp32 for the few positions scored. lm-eval 0.4.13 and
    # 0.5.0.dev1 share that loop; what of it is used here is pinned by tests/test_hflm_privates.py,
    # the scores by test_all_full_mask_scores_like_hflm. Only _continuation_log_probs differs.
    def _loglikelihood_tokens(
        self,
        requests: list[tuple[tuple[str, str], list[int], list[int]]],
        disable_tqdm: bool = False,
        override_bs: int | None = None,
    ) -> list[tuple[float, bool]]:
        """HFLM's scoring loop (same ordering, batching, truncation and caching), but logits
        are computed only at the positions that predict continuation tokens."""
        collator = Collator(
            requests,
            sort_fn=lambda req: (-len(req[1] + req[2]), tuple(req[1] + req[2])),
            group_by="contexts" if self.logits_cache else None,
            group_fn=lambda req: req[-2] + req[-1][:-1],  # same context + continuation[:-1]: one forward pass
        )
        if self.batch_size == "auto" and not override_bs:
            self.batch_sizes = {}  # detect again for these requests, as HFLM does
            batches = collator.get_batched(n=0, batch_fn=self._batch_scheduler if len(collator) else None)
        else:
            batches = collator.get_batched(n=override_bs if self.batch_size == "auto" else self.batch_size)
        requests_by_args = getattr(self, "_requests_by_args", {})
        # The model sees (context + continuation)[:-1]: more than max_length tokens are cut.
        self._check_fits(
            [
                (instance, len(context) + len(continuation) - 1, self.max_length)
                for args, context, continuation in requests
                if len(context) + len(continuation) - 1 > self.max_length
                for instance in requests_by_args.get(args, [None])
            ],
            "context + continuation",
        )
        results: list[tuple[float, bool]] = []
        progress = tqdm(total=len(requests), disable=disable_tqdm or self.rank != 0, desc="Running loglikelihood requests")
        for batch in batches:
            log_probs = self._continuation_log_probs([context + continuation for _, context, continuation in batch], [c for *_, c in batch])
            for (request, context, continuation), row in zip(batch, log_probs, strict=True):
                row = row[: len(continuation)].unsqueeze(0)  # [1, k, V]
                greedy = row.argmax(dim=-1)
                for request, cont_tokens, cached in collator.get_cache(req_str=request, cxt_toks=context, cont_toks=continuation, logits=row):
                    target = torch.tensor(cont_tokens, dtype=torch.long, device=self.device)[None]  # [1, k']
                    k = target.shape[1]  # same-context requests may score a shorter suffix of the continuation
                    answer = (float(cached[:, -k:].gather(2, target[..., None]).sum()), bool((greedy[:, -k:] == target).all()))
                    results.append(answer)
                    if request is not None:
                        self.cache_hook.add_partial("loglikelihood", request, answer)
                    progress.update(1)
        progress.close()
        return collator.get_original(results)

    def _continuation_log_probs(self, sequences: list[list[int]], continuations: list[list[int]]) -> torch.Tensor:
        """``[B, k_max, V]`` log-probabilities at the positions that predict each row's
        continuation (``sequences``: context + continuation; rows past their ``k`` are padding)."""
        inputs = [row[-(self.max_length + 1) :][:-1] for row in sequences]  # HFLM's causal input: left-truncated, last dropped
        input_ids = pad_and_concat(
            max(map(len, inputs)), [torch.tensor(row, dtype=torch.long, device=self.device) for row in inputs], padding_side="right"
        )  # [B, T]
        positions = scored_positions([len(row) for row in inputs], [len(c) for c in continuations], self.device)
        with (
            torch.no_grad(),
            torch.autocast(device_type=self.device.type, dtype=self.mixed_precision_dtype, enabled=self.mixed_precision_dtype is not None),
        ):
            if self.prefix_cache is not None:
                logits = self.prefix_cache.run(lambda ids: logits_at(self.model, ids, positions), input_ids, self.hybrid.mask, self.hybrid.local)
            elif self.kv_quant is None:
                logits = logits_at(self.model, input_ids, positions)
            else:
                logits = self._logits_through_compressed_cache(inputs, continuations)
            return F.log_softmax(logits, dim=-1, dtype=self.softmax_dtype)

    def _logits_through_compressed_cache(self, inputs: list[list[int]], continuations: list[list[int]]) -> torch.Tensor:
        """``[B, k_max, V]`` logits, each row prefilled, compressed, then its continuation
        forwarded through its own quantized cache (rows with shorter continuations are
        padded with zeros, dropped by the caller)."""
        rows = [
            continuation_logits_through_cache(
                self.model, lambda: HybridCache.for_model(self.model, self.kv_quant), row, len(continuation), self.device
            )
            for row, continuation in zip(inputs, continuations, strict=True)
        ]
        out = rows[0].new_zeros(len(rows), max(r.shape[0] for r in rows), rows[0].shape[-1])
        for i, row in enumerate(rows):
            out[i, : row.shape[0]] = row
        return out
