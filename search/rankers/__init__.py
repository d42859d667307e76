"""Training-free head rankers of the BOSCH paper's baselines (Appendix B.3, Eq. 7–25).

One module per job: :mod:`.capture` (post-RoPE q/k/v and dL/dO through
``AttentionInterface``), :mod:`.blocks` (causal attention streamed in query blocks),
one module per mechanism (:mod:`.mass`: DCAM and Fisher; :mod:`.apl`; :mod:`.proxy`;
:mod:`.qada`; :mod:`.razor`), :mod:`.driver` (``compute_ranking``) and
:mod:`.reference` (the direct NumPy formulas the tests and the memory benchmark use).

Importing this package is cheap (no torch). Each ranker registers itself in :data:`RANKERS`
under its command-line name and declares its own ``bosch-eval rank`` flags (``Ranker.flags``);
a new ranker is one new module here (docs/rankings.md#add-a-ranker), found when a name is looked up.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from bosch_eval.runtime.registry import Registry

if TYPE_CHECKING:
    from bosch_eval.search.rankers.base import Ranker

RANKERS: Registry[type[Ranker]] = Registry("ranker", package=__name__, field="method")
