"""The search's cost model: how many S() calls a run makes, and so how long it takes.

Every sub-problem is an optimizer run with a known worst case (``expected_evaluations``):
exhaustive scores each feasible point once, NOMAD and the (1+1)-EA spend their budget κ·|layers|.
With q(r) = ⌈r·G⌉ SWA groups per layer at ratio r::

    N = 2                                                  (anchors: all full, all SWA)
      + Σ_layers  min(C(G, q(ρ)), κ)                        (Stage 1, one layer each)
      + Σ_chunks  min(Π_{ℓ∈chunk} C(P, q(r_ℓ)), κ·|chunk|)  (Stage 3: layers grouped by their
                                                             Stage-2 ratio r_ℓ, 0 < q(r_ℓ) < P,
                                                             in chunks of ≤ chunk_layers)
    T ≈ N · t_call

where P is the pool of groups a Stage-3 layer chooses among: all G, or the ⌈ρG⌉ Stage 1 made
SWA in it for the ``nested`` variant (``pool``). The ``guarded`` variant adds::

      + |heuristics| + |given masks| + |rankings|          (incumbents: one call per mask, before
                                                             Stage 1; masks several share, once)
      + local_calls                                          (the local search after Stage 3)

and, before the incumbents, computes each ranking not given as a file: one pass of the model
over the calibration set (Fisher's with a backward pass), which is no S() call and is counted
apart (``rankings``), not timed. Its Stage 1 by probes (⌈ρG⌉ = G) costs what Algorithm 1 does
there: one mask per layer.

Before the search, the Stage-2 ratios are unknown: the range runs over every outcome Stage 2
can have (each layer at one of its buckets, ⌈ρ·L·G⌉ SWA groups in all; a small dynamic
program over how many layers land in each bucket, which is all the Stage-3 count depends on).
For the paper's G = 8 at ρ = 0.75 that is 0 (every layer at 0 or 1) to 32·κ (every layer at
0.75); for SmolLM2's G = 3 the buckets are k/3 and no outcome avoids Stage 3 whenever the
target is not a multiple of G. After Stage 2 the count is exact up to masks met twice (scored
once). Racing does not change N, only t_call, and only for the optimizers it applies to:
NOMAD reads exact values, so its calls always forward every example. At ρ = 0 or 1 the
search scores its one mask, the anchors, and nothing else.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from bosch_eval.masks.head_mask import ModelShape, ceil_count
from bosch_eval.masks.layer_heuristics import LAYER_HEURISTICS
from bosch_eval.search.run.pipeline import VARIANTS, SearchSettings
from bosch_eval.search.stages.stage2 import _bucket_counts, default_buckets
from bosch_eval.search.stages.optimizers import OPTIMIZERS
from bosch_eval.search.stages.subproblems import _chunks, expected_evaluations, expected_method, quota_blocks


@dataclass(frozen=True)
class CallEstimate:
    """S() calls a search makes at most: per stage, and in total."""

    anchors: int
    stage1: int
    stage3_low: int
    stage3_high: int
    stage3_exact: int = 0  # of stage3_high, NOMAD's calls: never raced, every example forwarded
    incumbents: int = 0  # the guarded variant: one call per incumbent mask, before Stage 1
    local: int = 0  # the guarded variant's local search after Stage 3 (--local-calls)
    rankings: int = 0  # rankings computed for the incumbents: model passes, not S() calls (not in low/high)

    @property
    def low(self) -> int:
        return self.anchors + self.incumbents + self.stage1 + self.stage3_low + self.local

    @property
    def high(self) -> int:
        return self.anchors + self.incumbents + self.stage1 + self.stage3_high + self.local

    def terms(self, stage1_note: str = "") -> str:
        """The calls as a sum, in the search's order ('2 anchors + 9 incumbents + 30 Stage 1 + ...');
        ``stage1_note`` follows Stage 1's count."""
        guarded = self.incumbents > 0  # a guarded search scores every layer heuristic at least
        incumbents = f" + {self.incumbents} incumbents" if guarded else ""
        local = f" + {self.local} local search" if guarded else ""
        stage3 = f"{self.stage3_low}–{self.stage3_high} Stage 3"
        return f"{self.anchors} anchors{incumbents} + {self.stage1} Stage 1{stage1_note} + {stage3}{local}"

    def rankings_note(self) -> str:
        """What the guarded variant computes besides S() calls ('' when nothing)."""
        if not self.rankings:
            return ""
        return (f"; before the incumbents, {self.rankings} ranking(s) computed on the calibration set (a pass of the model "
                "over it each: no S() call, not in the count nor the time)")  # fmt: skip


def stage1_calls(shape: ModelShape, ratio: float, budget_per_layer: int, optimizer: str = "auto") -> int:
    per_layer = ceil_count(ratio, shape.num_kv_heads)
    one = expected_evaluations(((shape.num_kv_heads, per_layer),), budget_per_layer, optimizer)
    return shape.num_layers * one


def stage3_calls(
    shape: ModelShape,
    layer_ratios: Sequence[float],
    budget_per_layer: int,
    chunk_layers: int,
    optimizer: str = "auto",
    quota: str = "layer",
    pool: int | None = None,
) -> tuple[int, int]:
    """Stage 3's calls for given Stage-2 ratios (its sub-problems as :func:`stages.stage3` forms
    them), and how many of them NOMAD makes (exact, never raced). ``pool``: the groups a layer
    chooses among (None: all G)."""
    pool = shape.num_kv_heads if pool is None else pool
    calls = exact = 0
    for ratio in sorted(set(layer_ratios), reverse=True):
        if not 0 < ceil_count(ratio, shape.num_kv_heads) < pool:  # one mask: nothing to search
            continue
        layers = sum(1 for layer_ratio in layer_ratios if layer_ratio == ratio)
        group_calls, group_exact = _ratio_group_calls(
            shape, ratio, layers, budget_per_layer, chunk_layers, optimizer, quota, pool
        )
        calls, exact = calls + group_calls, exact + group_exact
    return calls, exact


def _ratio_group_calls(
    shape: ModelShape,
    ratio: float,
    layers: int,
    budget_per_layer: int,
    chunk_layers: int,
    optimizer: str,
    quota: str,
    pool: int,
) -> tuple[int, int]:
    """Stage 3's calls (and NOMAD's share) for ``layers`` layers at one ratio, each choosing
    among ``pool`` groups: which layers they are does not matter, only how many (they are
    chunked as :func:`stages.stage3` chunks them)."""
    calls = exact = 0
    for part in _chunks(list(range(layers)), chunk_layers) if layers else []:
        blocks = quota_blocks(pool, ceil_count(ratio, shape.num_kv_heads), len(part), quota)
        part_calls = expected_evaluations(blocks, budget_per_layer * len(part), optimizer)
        calls += part_calls
        raced = OPTIMIZERS[expected_method(blocks, budget_per_layer * len(part), optimizer)].raced
        exact += 0 if raced else part_calls
    return calls, exact


def stage3_range(
    shape: ModelShape,
    ratio: float,
    budget_per_layer: int,
    chunk_layers: int,
    optimizer: str = "auto",
    quota: str = "layer",
    buckets: Sequence[float] | None = None,
    pool: int | None = None,
) -> tuple[int, int, int]:
    """Stage 3's fewest and most calls over every outcome of Stage 2, and NOMAD's share of the most.

    An outcome puts each layer at one bucket with ⌈ρ·L·G⌉ SWA groups in all (when no outcome
    meets it exactly, as Stage 2 then stops short, every total is allowed). Dynamic program
    over the buckets with state (layers placed, groups placed); the most is maximized as
    (calls, NOMAD calls) in that order.
    """
    groups, num_layers = shape.num_kv_heads, shape.num_layers
    pool = groups if pool is None else pool
    buckets = tuple(buckets) if buckets is not None else default_buckets(groups)
    total = num_layers * groups
    scale = num_layers * budget_per_layer + 1  # > any call count: key = calls * scale + NOMAD calls
    unreached, far = -1, np.iinfo(np.int64).max
    most = np.full((num_layers + 1, total + 1), unreached, dtype=np.int64)
    fewest = np.full((num_layers + 1, total + 1), far, dtype=np.int64)
    most[0, 0] = fewest[0, 0] = 0
    for bucket, count in zip(buckets, _bucket_counts(buckets, groups), strict=True):
        next_most, next_fewest = np.full_like(most, unreached), np.full_like(fewest, far)
        for layers in range(num_layers + 1):  # how many layers land in this bucket
            searched = (
                0 < count < pool
            )  # a layer that keeps every group full, or converts its whole pool: no sub-problem
            calls, exact = (
                _ratio_group_calls(shape, bucket, layers, budget_per_layer, chunk_layers, optimizer, quota, pool)
                if searched
                else (0, 0)
            )
            came_from = _shifted(most, layers, layers * count, unreached)
            np.maximum(
                next_most, np.where(came_from > unreached, came_from + calls * scale + exact, unreached), out=next_most
            )
            came_from = _shifted(fewest, layers, layers * count, far)
            np.minimum(next_fewest, np.where(came_from < far, came_from + calls, far), out=next_fewest)
        most, fewest = next_most, next_fewest
    target = ceil_count(ratio, total)
    if most[num_layers, target] > unreached:
        high, low = int(most[num_layers, target]), int(fewest[num_layers, target])
    else:
        high, low = int(most[num_layers].max()), int(fewest[num_layers].min())
    return low, high // scale, high % scale


def _shifted(table: np.ndarray, layers: int, groups: int, fill: int) -> np.ndarray:
    """``table`` moved by (layers, groups): entry [l, g] of the result is ``table[l - layers, g - groups]``."""
    out = np.full_like(table, fill)
    if layers < table.shape[0] and groups < table.shape[1]:
        out[layers:, groups:] = table[: table.shape[0] - layers, : table.shape[1] - groups]
    return out


def estimate_calls(
    shape: ModelShape,
    settings: SearchSettings,
    layer_ratios: Sequence[float] | None = None,
    *,
    rankings: int = 0,
    ranking_files: int = 0,
) -> CallEstimate:
    """BOSCH's S() calls under ``settings``: a range before Stage 2 (over its buckets,
    :meth:`SearchSettings.buckets_for`), exact (up to repeats) once its ratios are known.
    Stage 3's layers choose among :meth:`SearchSettings.stage3_pool` groups each.

    The guarded variant's incumbents are ``settings.incumbents`` (the rankings' masks once the
    search has them), the layer heuristics, and ``rankings`` still to compute and
    ``ranking_files`` still to read (before the search: ``incumbent_rankings.ranking_sources``)."""
    ratio, budget, optimizer, quota = settings.ratio, settings.budget_per_layer, settings.optimizer, settings.quota
    if ratio in (0.0, 1.0):  # the search scores the anchors, one of which is its mask
        return CallEstimate(2, 0, 0, 0)
    chunk, pool = settings.chunk_layers_for(shape), settings.stage3_pool(shape)
    stage1 = stage1_calls(shape, ratio, budget, optimizer)
    guarded = guarded_calls(settings, rankings, ranking_files)
    if layer_ratios is not None:
        calls, exact = stage3_calls(shape, layer_ratios, budget, chunk, optimizer, quota, pool)
        return CallEstimate(2, stage1, calls, calls, exact, *guarded)
    low, high, exact = stage3_range(shape, ratio, budget, chunk, optimizer, quota, settings.buckets_for(shape), pool)
    return CallEstimate(2, stage1, low, high, exact, *guarded)


def guarded_calls(settings: SearchSettings, rankings: int, ranking_files: int) -> tuple[int, int, int]:
    """(incumbent calls, local-search calls, rankings computed) of a guarded search; zeros for another variant."""
    if not VARIANTS[settings.variant].incumbents:
        return 0, 0, 0
    incumbents = len(LAYER_HEURISTICS.names()) + len(settings.incumbents) + rankings + ranking_files
    return incumbents, settings.local_calls, rankings


def render_cost(
    costs: Mapping[str, Mapping[str, float]], estimate_before: CallEstimate, estimate_after: CallEstimate | None
) -> list[str]:
    """Markdown lines: measured calls and seconds per stage, and the model's predictions.

    The prediction after Stage 2 (:func:`_prediction_after_stage2`) is set beside the
    measured total.
    """
    lines = [
        "## Cost",
        "",
        "| stage | S() calls | of them stopped early (racing) | seconds | seconds per call |",
        "|---|---|---|---|---|",
    ]
    total_calls = sum(int(row["calls"]) for row in costs.values())
    total_seconds = sum(row["seconds"] for row in costs.values())
    for stage, row in costs.items():
        per_call = row["seconds"] / row["calls"] if row["calls"] else 0.0
        lines.append(
            f"| {stage} | {int(row['calls'])} | {int(row['pruned'])} | {row['seconds']:.1f} | {per_call:.3f} |"
        )
    lines.append(f"| all | {total_calls} | {sum(int(r['pruned']) for r in costs.values())} | {total_seconds:.1f} | "
                 f"{total_seconds / max(total_calls, 1):.3f} |")  # fmt: skip
    lines += [
        "",
        f"Cost model (`bosch_eval.search.run.cost`): before the search, N = {estimate_before.low} to {estimate_before.high} "
        f"S() calls ({estimate_before.terms()}, depending on Stage 2's ratios); time ≈ N × seconds per call.",
    ]
    if estimate_after is not None:
        lines.append(_prediction_after_stage2(costs, estimate_after, total_seconds))
    return lines + [""]


def _prediction_after_stage2(
    costs: Mapping[str, Mapping[str, float]], estimate: CallEstimate, total_seconds: float
) -> str:
    """Stage 3 (and the guarded variant's local search after it) timed at the seconds per call
    measured until then (what a user watching the run knows; the guarded variant's incumbents
    are among those calls); NOMAD's calls, never raced, at the seconds of an unraced call (an
    anchor's) when this run timed one, since raced Stage-1 calls can be many times cheaper."""
    if not total_seconds:
        return ""
    early = [row for stage, row in costs.items() if stage in ("anchor", "incumbent", "stage1")]
    early_calls = sum(int(row["calls"]) for row in early)
    if not early_calls:
        return ("After Stage 2: no prediction, since this run timed no call before Stage 3 (a resume whose "
                "Stages 1–2 came from the journal).")  # fmt: skip
    early_seconds = sum(row["seconds"] for row in early)
    per_call = early_seconds / early_calls
    anchor = costs.get("anchor")
    per_exact_call = anchor["seconds"] / anchor["calls"] if anchor and anchor["calls"] else None
    later = estimate.stage3_high + estimate.local  # the local search is raced, as Stage 3's (1+1)-EA
    raced_calls, exact_calls = later - estimate.stage3_exact, estimate.stage3_exact
    if exact_calls and per_exact_call is not None:
        predicted = early_seconds + raced_calls * per_call + exact_calls * per_exact_call
        terms = (f"{raced_calls} calls × {per_call:.3f} s (the seconds per call until then) + {exact_calls} NOMAD calls × "
                 f"{per_exact_call:.3f} s (an anchor's: NOMAD is never raced)")  # fmt: skip
    else:
        predicted = early_seconds + later * per_call
        terms = f"{later} calls × {per_call:.3f} s (the seconds per call until then"
        terms += "; no unraced call timed in this run, so NOMAD's calls at that rate too)" if exact_calls else ")"
    what = "Stage 3 and the local search" if estimate.local else "Stage 3"
    return (f"After Stage 2: {what} predicted at ≤ {terms} → total {predicted:.1f} s predicted, {total_seconds:.1f} s "
            f"measured ({predicted / total_seconds - 1:+.0%}).")  # fmt: skip
