"""Hybrid attention, core (docs/architecture.md#layers): what a hybrid model runs.

``local_window`` (the window W, the sinks S and the band predicate), ``hybrid_spec`` (the
frozen spec: mask, local window, backend), ``hybrid_attention`` (the ``AttentionInterface``
function and ``hybridize``/``apply_spec``), ``restore_point`` (what applying a spec changed,
to put it back), ``kernels/`` (the attention backends' registry, one module per backend).
"""
