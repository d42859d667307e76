"""KV-cache quantization for full-attention KV groups: LogQuant (arXiv 2503.19950) and KiVi.

``config`` (settings and validation), ``methods/`` (each method's release rule, one module
each, in the ``KV_QUANT_METHODS`` registry), ``selection`` (which positions stay at full
precision, as tokens arrive), ``packing`` (2/4-bit quantization), ``store`` (append-only
storage of one layer's groups), ``fused`` (a decode step's rebuild compiled into one pass),
``layer`` (a transformers cache layer), ``formula`` (closed-form bytes).
"""
