"""KV caches, core (docs/architecture.md#layers): what a hybrid model keeps between steps.

``hybrid_cache`` (deploy mode: SWA groups keep only their window), ``prefix_cache`` (the
search's activations of a shared prefix), ``kv_quant/`` (LogQuant and KiVi quantization of
the full groups' cache).
"""
