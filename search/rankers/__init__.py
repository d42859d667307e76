"""Training-free head rankers of the BOSCH paper's baselines (Appendix B.3, Eq. 7–25).

One module per job: :mod:`.capture` (post-RoPE q/k/v and dL/dO through
``AttentionInterface``), :mod:`.blocks` (causal attention streamed in query blocks),
one module per mechanism (:mod:`.mass`: DCAM and Fisher; :mod:`.apl`; :mod:`.proxy`;
:mod:`.qada`; :mod:`.razor`), :mod:`.driver` (``compute_ranking``, the registry) and
:mod:`.reference` (the direct NumPy formulas the tests and the memory benchmark use).

Importing this package is cheap (no torch); the command line lists methods from here.
"""

# The registry in .driver maps these names to their classes (a test keeps both in step).
METHOD_NAMES = ("dcam", "apl", "proxy", "qada", "razor", "fisher")
