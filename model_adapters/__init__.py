"""lm-eval model adapters (installed as ``bosch_eval.model_adapters``)."""
