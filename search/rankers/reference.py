"""The formulas of paper B.3 computed directly in NumPy: the oracle of the streaming rankers.

Each function takes whole attention maps (``[H, T, T]`` per sequence; only ``j ≤ t``
is read) and follows its equation term by term, with loops where the paper sums — slow
and memory-hungry on purpose. The tests compare :mod:`bosch_eval.search.rankers` with
these; ``benchmarks/ranker_memory.py`` measures what materialising the maps costs.

Index convention: 0-based positions; query ``t`` sees ``t − W < j ≤ t`` (lag < W).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def attention_maps(
    queries: np.ndarray,
    keys: np.ndarray,
    tau: float,
    values: np.ndarray | None = None,
    grad_out: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray | None]:
    """Causal softmax ``P = softmax(τ q·kᵀ)`` ``[H, T, T]`` and, given ``V`` and ``dO``, ``dL/dP = dO·Vᵀ``.

    ``queries`` ``[H, T, D]``; ``keys``/``values`` ``[G, T, D]`` (head h uses group h // (H/G)).
    """
    heads, length, _ = queries.shape
    group = np.arange(heads) // (heads // keys.shape[0])
    logits = tau * np.einsum("htd,hsd->hts", queries, keys[group])
    logits[:, ~np.tri(length, dtype=bool)] = -np.inf
    logits -= logits.max(-1, keepdims=True)
    probs = np.exp(logits)
    probs /= probs.sum(-1, keepdims=True)
    dprobs = None
    if values is not None and grad_out is not None:
        dprobs = np.einsum("htd,hsd->hts", grad_out, values[group]) * np.tri(length)
    return probs, dprobs


def _lag_share(weights: Sequence[np.ndarray], window: int) -> np.ndarray:
    """Σ_{d<W} H(d) / Σ_d H(d) with H(d) = Σ_seq Σ_t w(t, t − d) (Eq. 7–8, 24–25)."""
    heads = weights[0].shape[0]
    longest = max(w.shape[1] for w in weights)
    histogram = np.zeros((heads, longest))
    for w in weights:
        t, j = np.tril_indices(w.shape[1])
        for h in range(heads):
            histogram[h] += np.bincount(t - j, weights=w[h, t, j], minlength=longest)
    total = histogram.sum(1)
    inside = histogram[:, :window].sum(1)
    return np.where(total > 0, inside / np.where(total > 0, total, 1.0), 1.0)


def dcam(probs: Sequence[np.ndarray], window: int) -> np.ndarray:
    """DCAM (Eq. 7–8): per-head attention mass at lags < W, over all rows; ``[H]``."""
    return _lag_share(probs, window)


def fisher(probs: Sequence[np.ndarray], dprobs: Sequence[np.ndarray], window: int) -> np.ndarray:
    """Fisher (Eq. 23–25): the lag histogram of ``(∂L/∂α · α)²``; ``[H]``."""
    return _lag_share([(g * p) ** 2 for p, g in zip(probs, dprobs, strict=True)], window)


def apl(probs: Sequence[np.ndarray], window: int) -> np.ndarray:
    """APL (Eq. 9–10): 1 − min(1, median peak lag of the last row / W); ``[H]``."""
    lags = []
    for p in probs:
        last = p.shape[1] - 1
        lags.append(last - np.argmax(p[:, last, : last + 1], axis=1))
    return 1.0 - np.minimum(1.0, np.median(np.array(lags), axis=0) / window)


def proxy(probs: Sequence[np.ndarray], block: int, gamma: float, proxy_heads: Sequence[int]) -> np.ndarray:
    """Proxy (Eq. 11–14): mean over rows of m_h(t)/n_B; ``[H]``."""
    heads = probs[0].shape[0]
    budget, rows = np.zeros(heads), 0
    for p in probs:
        for t in range(p.shape[1]):
            n_blocks = -(-(t + 1) // block)
            spans = [(b * block, min((b + 1) * block, t + 1)) for b in range(n_blocks)]
            pooled_row = p[list(proxy_heads), t, : t + 1].max(0)  # α̃(t, j), Eq. 11
            pooled = np.array([pooled_row[a:z].sum() for a, z in spans])  # S(b, t), Eq. 12
            order = np.argsort(-pooled, kind="stable")
            for h in range(heads):
                own = np.array([p[h, t, a:z].sum() for a, z in spans])
                reached = np.cumsum(own[order]) >= gamma * own.sum()  # Eq. 13
                budget[h] += (np.argmax(reached) + 1) / n_blocks
            rows += 1
    return budget / rows


def qada(queries: Sequence[np.ndarray], keys: Sequence[np.ndarray], tau: float, window: int, buffer: int) -> np.ndarray:
    """QAdA (Eq. 15–19) with the explicit mean vector and covariance matrix of the buffer keys; ``[H]``."""
    heads = queries[0].shape[0]
    total, rows = np.zeros(heads), 0
    for q_all, k_all in zip(queries, keys, strict=True):
        per_group = heads // k_all.shape[0]
        for t in range(q_all.shape[1]):
            for h in range(heads):
                q, k = q_all[h, t], k_all[h // per_group]
                local = np.exp(tau * k[max(0, t - window + 1) : t + 1] @ q).sum()  # Eq. 16
                far = t - window + 1  # |F_W(t)|
                if far <= 0:
                    total[h] += 1.0
                    continue
                buf = k[max(0, t - window - buffer + 1) : t - window + 1]
                mu = buf.mean(0)
                sigma = (buf - mu).T @ (buf - mu) / len(buf)
                glob = far * np.exp(tau * q @ mu + 0.5 * tau**2 * q @ sigma @ q)  # Eq. 17
                total[h] += local / (local + glob)  # Eq. 18
            rows += 1
    return total / rows


def razor_attention(probs: Sequence[np.ndarray], period: int) -> tuple[np.ndarray, np.ndarray]:
    """Razor's E and I of one layer (Eq. 20–21) on probes of a K-token block repeated 4 times; ``[H]`` each.

    Induction reads j = m − K + 1 (see :mod:`bosch_eval.search.rankers.razor` for why
    not Eq. 20's m − 1 − K).
    """
    echo, induction, count = np.zeros(probs[0].shape[0]), np.zeros(probs[0].shape[0]), 0
    for p in probs:
        for m in range(period, 4 * period):
            echo += p[:, m, m - period]
            induction += p[:, m, m - period + 1]
            count += 1
    return echo / count, induction / count


def razor(echo: np.ndarray, induction: np.ndarray) -> np.ndarray:
    """Razor's score (Eq. 22) from ``[L, H]`` E and I: max of the z-scores across all heads."""

    def z(x: np.ndarray) -> np.ndarray:
        return (x - x.mean()) / x.std() if x.std() > 0 else np.zeros_like(x)

    return np.maximum(z(echo), z(induction))


def group_mean(head_scores: np.ndarray, num_kv_heads: int) -> np.ndarray:
    """``[L, H]`` → ``[L, G]``: each KV group's score is the mean over its query heads."""
    layers, heads = head_scores.shape
    size = heads // num_kv_heads
    return np.array([[head_scores[layer, g * size : (g + 1) * size].mean() for g in range(num_kv_heads)]
                     for layer in range(layers)])  # fmt: skip
