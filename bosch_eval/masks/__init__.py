"""Head masks, core (docs/architecture.md#layers): the one data type and where a mask comes from.

``head_mask`` (``HeadMask``, ``HeadRanking``, ``ModelShape`` and their versioned JSON),
``window`` (the window and sinks rules: their checks, ``LocalWindow`` and its band predicate,
the one window resolver),
``mask_sources`` (``mask=`` / ``ranking=`` / ``layers=`` resolved into one mask for a model),
``layer_heuristics`` (whole layers chosen by a rule: the ``LAYER_HEURISTICS`` registry).
"""
