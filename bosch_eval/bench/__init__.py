"""``bosch-eval bench``, a feature (docs/architecture.md#layers): latency and memory of hybrids
next to the original model.

``runner`` (the measurements, their tables and plots), ``cli`` (the command's flags).
"""
