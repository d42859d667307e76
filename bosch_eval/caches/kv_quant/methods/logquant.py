"""``logquant``: LogQuant's log-sparse full-precision set (arXiv 2503.19950, Fig. 6).

Quoted from the seed:

    "LogQuant's KV cache compression workflow. The number of reserved original-precision
    tokens increases from 2W to 3W. We then apply a log-sparse strategy to filter the
    first 2W tokens, quantize half of these tokens, and compress the reserved token
    length back to 2W."

    "Initially, 3W tokens are kept at full precision. A log-sparse filtering strategy is
    then applied to the first 2W tokens, resulting in half of them being quantized."

As implemented: whenever ``|F|`` reaches ``3W``, the first ``2W`` entries of ``F`` are
thinned by 2 (entries 0, 2, 4, … stay at full precision, entries 1, 3, 5, … are released to
the quantized store) and the last ``W`` stay. After the first event ``F`` is a log-sparse part
of ``W`` tokens followed by a recent window of ``W`` to ``2W``; each later event thins the
log-sparse part and the older half of the recent window by 2 each, so the density of kept
tokens halves with every doubling of the distance. The seed does not say which half
survives; keeping the even entries keeps position 0 (the attention sink, which the seed's
Table 1 shows matters) at full precision forever.
"""

from __future__ import annotations

from bosch_eval.caches.kv_quant.methods import KV_QUANT_METHODS, KVQuantMethod


def log_sparse(full_precision: list[int], window: int) -> tuple[list[int], list[int]]:
    """The first ``2W`` entries thinned by 2 (even ones kept), the last ``W`` kept."""
    head, tail = full_precision[: 2 * window], full_precision[2 * window :]
    return head[0::2] + tail, head[1::2]


KV_QUANT_METHODS.register("logquant", KVQuantMethod(log_sparse))
